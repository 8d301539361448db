"""``/ws/balancer/``: a snapshot on connect and every second, and every balancer event in between.

Messages to the client (JSON):
- ``{"type": "snapshot", "state": {...}}`` — the ``/api/state`` snapshot; on connect, then every ~1 s.
- ``{"type": "history", "events": [...]}`` — once, after the first snapshot: recent events already
  reflected in it (for the feed only).
- ``{"type": "events", "events": [...]}`` — new events, each exactly once, in id order.
- ``{"type": "error", "error": "..."}`` — the store could not be read; the socket stays open.

Every event sent comes from the EventLog table, not from the channel-layer message: the message
only wakes the consumer. That is what makes delivery whole when workers run in other processes
without Redis (the in-memory layer does not cross processes, and drops messages to a full
channel), and it keeps one order for both paths. A row whose insert commits after a row with a
higher id (possible on PostgreSQL, whose ids are handed out before commit) is still found: each
poll also rereads ids above where ``last_sent`` stood ``SETTLE`` seconds ago, skipping ids sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.db.models import Q

from balancer.errors import StoreError
from balancer.model import HubRef

from .broadcast import GROUP
from .models import EventLog
from .state import Snapshot, parse_ref, shared_snapshot

log = logging.getLogger(__name__)

POLL_EVERY = 0.5
SNAPSHOT_EVERY = 1.0
SETTLE = 3.0  # seconds a late-committing EventLog row may trail a higher id and still be delivered
HISTORY = 50
BATCH = 500


def _history(ref: HubRef, upto: int, limit: int) -> list[dict[str, Any]]:
    rows = EventLog.objects.filter(**EventLog.scope(ref), id__lte=upto).order_by("-id")[:limit]
    return [row.as_json() for row in reversed(list(rows))]


def _unsent(ref: HubRef, floor: int, last_sent: int, sent: frozenset[int], limit: int) -> list[dict[str, Any]]:
    """Rows above ``last_sent``, and rows between ``floor`` and it that were not sent, in id order."""
    rows = EventLog.objects.filter(**EventLog.scope(ref))
    late: list[int] = []
    if floor < last_sent:
        late = [i for i in rows.filter(id__gt=floor, id__lt=last_sent).values_list("id", flat=True) if i not in sent]
    chosen = rows.filter(Q(id__gt=last_sent) | Q(id__in=late)).order_by("id")[:limit]
    return [row.as_json() for row in chosen]


class BalancerConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    """Streams one hub and consumer group (``?hub=&consumer_group=``, default: the configured ones)."""

    async def connect(self) -> None:
        self.pump: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()
        self.last_sent: int | None = None  # None until the first snapshot went out
        self.sent: set[int] = set()  # ids above the floor already sent
        self.marks: deque[tuple[float, int]] = deque()  # (monotonic time, last_sent then)
        query = parse_qs(self.scope.get("query_string", b"").decode("latin1"))
        await self.accept()
        try:
            self.ref = parse_ref(query.get("hub", [""])[0], query.get("consumer_group", [""])[0])
        except ValueError as exc:
            await self.send_json({"type": "error", "error": str(exc)})
            await self.close(code=4400)
            return
        if self.channel_layer is not None:
            await self.channel_layer.group_add(GROUP, self.channel_name)
        self.pump = asyncio.create_task(self._run())

    async def disconnect(self, code: int) -> None:
        if self.channel_layer is not None:
            await self.channel_layer.group_discard(GROUP, self.channel_name)
        if self.pump is not None:
            self.pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.pump

    async def balancer_event(self, message: dict[str, Any]) -> None:
        """A worker published an event: read the log now rather than at the next poll."""
        event = message.get("event") or {}
        if (event.get("namespace"), event.get("hub"), event.get("consumer_group")) == (
            self.ref.namespace,
            self.ref.hub,
            self.ref.consumer_group,
        ):
            self.wake.set()

    # the pump: the only coroutine that sends after connect --------------------------------

    async def _run(self) -> None:
        next_snapshot = 0.0
        while True:
            try:
                if time.monotonic() >= next_snapshot:
                    next_snapshot = time.monotonic() + SNAPSHOT_EVERY
                    await self._send_snapshot()
                elif await self._flush() >= BATCH:
                    continue  # a burst: keep reading before waiting
            except StoreError as exc:
                await self.send_json({"type": "error", "error": f"store unavailable: {exc}"})
            except Exception:  # a database hiccup must not end the stream; the next round retries
                log.exception("balancer websocket round failed")
            with contextlib.suppress(TimeoutError):
                timeout = max(0.0, min(POLL_EVERY, next_snapshot - time.monotonic()))
                await asyncio.wait_for(self.wake.wait(), timeout)
            self.wake.clear()

    async def _send_snapshot(self) -> None:
        state: Snapshot = await shared_snapshot(self.ref)
        watermark = int(state["last_event_id"])
        if self.last_sent is None:
            await self.send_json({"type": "snapshot", "state": state})
            history: list[dict[str, Any]] = await database_sync_to_async(_history)(self.ref, watermark, HISTORY)
            await self.send_json({"type": "history", "events": history})
            self.last_sent = watermark
            self.marks.append((time.monotonic(), watermark))
            return
        # Everything committed up to now goes out first; the client replays the events above the
        # snapshot's watermark on top of it, so none is lost whichever side of the read it fell on.
        while await self._flush() >= BATCH:
            pass
        await self.send_json({"type": "snapshot", "state": state})

    async def _flush(self) -> int:
        """Send unsent events; return how many were read (BATCH means there may be more)."""
        if self.last_sent is None:
            return 0
        floor = self._floor()
        rows: list[dict[str, Any]] = await database_sync_to_async(_unsent)(
            self.ref, floor, self.last_sent, frozenset(self.sent), BATCH
        )
        fresh = [row for row in rows if row["id"] not in self.sent]
        if fresh:
            await self.send_json({"type": "events", "events": fresh})
            for row in fresh:
                self.sent.add(row["id"])
            self.last_sent = max(self.last_sent, max(row["id"] for row in fresh))
        self.marks.append((time.monotonic(), self.last_sent))
        return len(rows)

    def _floor(self) -> int:
        """``last_sent`` as it stood SETTLE seconds ago; forget sent ids at or below it."""
        assert self.last_sent is not None
        horizon = time.monotonic() - SETTLE
        while len(self.marks) > 1 and self.marks[1][0] <= horizon:
            self.marks.popleft()
        floor = self.marks[0][1] if self.marks else self.last_sent
        self.sent = {i for i in self.sent if i > floor}
        return floor
