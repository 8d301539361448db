"""Hands balancer events to the dashboard: one EventLog row each, then a channel-layer message.

The row is the record; the channel-layer message only makes it arrive sooner. The in-memory layer
does not cross processes and drops messages to a full channel, so dashboard consumers also poll
the EventLog (see ``web/consumers.py``) and nobody relies on the message arriving.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from balancer.model import BalancerEvent

from ..dbthread import DatabaseThread
from ..models import EventLog

GROUP = "balancer"
MESSAGE_TYPE = "balancer.event"

log = logging.getLogger(__name__)

# Every save runs on one thread of its own, with a kept connection (see ``dbthread``); that also
# serves ``publish`` called on an event loop's thread, where the ORM refuses to run.
_saver = DatabaseThread("leaseboard-publish")
_sending: set[asyncio.Task[None]] = set()


def _save(event: BalancerEvent) -> dict[str, Any]:
    row = EventLog.from_domain(event)
    row.save()
    return row.as_json()


def _message(payload: dict[str, Any]) -> dict[str, Any]:
    return {"type": MESSAGE_TYPE, "event": payload}


async def _send(payload: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(GROUP, _message(payload))
    except Exception as exc:  # any layer failure (Redis down, full channel): the row is saved, pollers find it
        _layer.failures += 1
        # One line, no traceback, once an outage (every event fails while Redis is down; after a
        # restart every pooled connection fails once): the rest at DEBUG, counted.
        level = logging.WARNING if _layer.failures == 1 else logging.DEBUG
        log.log(
            level,
            "balancer event %s saved but not sent to the channel layer (%d since it last worked): %s: %s",
            payload["id"],
            _layer.failures,
            type(exc).__name__,
            exc,
        )
        return
    if _layer.failures:
        log.warning(
            "balancer events reach the channel layer again (%d were not sent; saved all the same)", _layer.failures
        )
        _layer.failures = 0


class _LayerState:
    failures = 0  # events in a row the channel layer refused (0: it works)


_layer = _LayerState()


def publish(event: BalancerEvent) -> dict[str, Any]:
    """Record ``event`` and broadcast it; return its JSON (with the EventLog ``id``).

    Safe from any thread. On a thread running an event loop (a coordinator's ``on_event`` is called
    inside ``cycle()``) the insert runs on a helper thread while this call blocks that loop for it,
    and the send is scheduled on that loop; async code should ``await apublish(event)`` instead.
    Raises the database's error when the row cannot be saved; a channel-layer failure is only logged.
    """
    payload = _saver.call(_save, event)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        async_to_sync(_send)(payload)
        return payload
    task = loop.create_task(_send(payload))
    _sending.add(task)  # the loop keeps only a weak reference to a task
    task.add_done_callback(_sending.discard)
    return payload


async def apublish(event: BalancerEvent) -> dict[str, Any]:
    """``publish`` for async callers: the insert runs on a thread, the send on the caller's loop."""
    payload = await _saver.acall(_save, event)
    await _send(payload)
    return payload
