"""The two entry points of every admin action, shared by the page's buttons and the management commands.

``preview(ref, request)`` reads the store and the source, checks the request's arguments against
the fleet (an unknown worker or partition is refused as bad input), refuses what cannot be done
(``Refused`` with a code and a sentence) and returns the dry run: for the actions that move
partitions, planned with the strategy the fleet runs (``fleet.Fleet.strategy``, ``forecast.py``),
named on the preview.

``apply(ref, request, user)`` checks again on a fresh read (the fleet may have moved since the
preview), writes (a control record, a checkpoint), wakes the workers, publishes the action to the
feed and records an ``AuditEntry`` (who, when, what, why, outcome) whatever happens: applied,
refused or failed.

What each action checks, plans and writes is its declaration in ``registry.py``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from balancer.model import HubRef
from balancer.notices import OPERATOR, Released, release_channel
from workers.runtime.runner import WAKE_GROUP
from workers.wiring import Stores

from ..live.broadcast import apublish
from ..live.state import configured_stores
from ..models import AuditEntry
from .action import Context
from .audit import recent_audit, record
from .fleet import read_fleet
from .registry import NAMES, get, parse
from .request import Move, Preview, Refused, Request

__all__ = [
    "NAMES",
    "WAKE_GROUP",
    "Move",
    "Preview",
    "Refused",
    "Request",
    "apply",
    "parse",
    "preview",
    "recent_audit",
    "tell_workers",
    "wake_workers",
]

log = logging.getLogger(__name__)

NOTICE_TIMEOUT = 2.0  # seconds: a notice later than this is no better than the workers' next read


async def _context(ref: HubRef, request: Request, stores: Stores | None, expiry: float | None) -> Context:
    stores = stores or configured_stores()
    action = get(request.action)
    fleet = await read_fleet(ref, stores, expiry if expiry is not None else settings.LEASEBOARD_EXPIRY)
    checked = action.check(fleet, request)
    strategy = fleet.strategy(settings.LEASEBOARD_STRATEGY or None)
    return Context(fleet, checked, stores, strategy, settings.LEASEBOARD_INTERVAL)


async def preview(ref: HubRef, request: Request, stores: Stores | None = None, expiry: float | None = None) -> Preview:
    """The dry run of ``request``; raises Refused (nothing is recorded: nothing was done)."""
    ctx = await _context(ref, request, stores, expiry)
    return await get(ctx.request.action).preview(ctx)


async def apply(
    ref: HubRef, request: Request, user: str, stores: Stores | None = None, expiry: float | None = None
) -> dict[str, Any]:
    """Do ``request`` and return its audit entry (JSON). Raises Refused, after recording the refusal."""
    detail: dict[str, Any] = {}
    try:
        if not request.reason:
            raise Refused("bad_request", "give a reason: it is kept in the audit log")
        ctx = await _context(ref, request, stores, expiry)
        ctx.user = user
        action = get(request.action)
        shown = await action.preview(ctx)
        detail = shown.as_json()
        done = await action.write(ctx, shown)
        if done.wake:
            await wake_workers(request.action, done.token)
            await tell_workers(ref, ctx.stores)
        if done.event is not None:
            await apublish(done.event)
        message = f"{done.message}. {shown.summary}"
    except Refused as refusal:
        await record(ref, request, user, AuditEntry.REFUSED, refusal.message, detail)
        raise
    except Exception as exc:
        await record(ref, request, user, AuditEntry.FAILED, f"{type(exc).__name__}: {exc}", detail)
        raise
    return await record(ref, request, user, AuditEntry.APPLIED, message, detail)


async def wake_workers(reason: str, token: str = "") -> bool:
    """Ask every worker to run a cycle now; False if the channel layer could not carry it (they
    still see the control record at their next cycle)."""
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        await layer.group_send(WAKE_GROUP, {"type": "worker.wake", "reason": reason, "token": token})
    except Exception:  # Redis down: the control record is written; workers read it at their next cycle
        log.warning("could not wake the workers over the channel layer", exc_info=True)
        return False
    return True


async def tell_workers(ref: HubRef, stores: Stores) -> bool:
    """Tell the workers of ``ref`` on the store's own channel (Redis pub/sub, PostgreSQL ``NOTIFY``)
    that a control changed: a notice naming no partition, from ``OPERATOR``, which wakes every worker
    at once (``balancer.notices.wakes``). The channel-layer wake-up may not cross processes
    (no Redis there); this one does wherever the workers listen for releases. False where the store has
    no channel or the notice could not be sent: the workers read the control within their quiet wait."""
    channel = release_channel(stores.ownership, ref)
    if channel is None:
        return False
    try:
        await asyncio.wait_for(channel.publish(Released(ref, (), OPERATOR)), NOTICE_TIMEOUT)
    except Exception as exc:  # the store is down: the control is written; workers read it soon anyway
        log.warning("could not tell the workers on the store's channel: %s: %s", type(exc).__name__, exc)
        return False
    finally:
        await channel.aclose()
    return True
