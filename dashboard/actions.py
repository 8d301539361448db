"""Operator actions, shared by the page's buttons and the management commands (which stay thin).

drain / undrain a worker, pin / unpin a partition, rebalance now, reset a partition's checkpoint,
purge a dead worker. Each goes through the same two steps:

``preview(ref, request)`` reads the store and the source, refuses what cannot be done (raises
``Refused`` with a code and a sentence), and returns the dry run: which partitions move, from whom
to whom, computed with the real planning code (``balancer.strategies.cooperative.assign`` over the
current view, once as it is and once with the action applied; only the difference is the action's).

``apply(ref, request, user)`` checks again on a fresh read (the fleet may have moved since the
preview), writes the control record (or the checkpoint), wakes the workers, and records an
``AuditEntry`` (who, when, what, why, outcome) whatever happens: applied, refused or failed.

Checkpoint resets are ``resets.py``; the request, the fleet and the dry run types ``fleet.py``.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from balancer.model import BalancerEvent, Control, ControlKind, EventKind, HubRef
from balancer.strategies.cooperative import assign, members
from workers.wiring import Stores

from . import metrics
from .broadcast import apublish
from .fleet import ACTIONS, Fleet, Move, Preview, Refused, Request, check_partition, pid_key, read_fleet
from .models import AuditEntry
from .resets import ADMIN_OWNER, reset_preview, write_reset
from .state import configured_stores

__all__ = [
    "ACTIONS", "ADMIN_OWNER", "WAKE_GROUP", "Fleet", "Move", "Preview", "Refused", "Request", "apply", "plan",
    "preview", "read_fleet", "recent_audit", "wake_workers",
]  # fmt: skip

log = logging.getLogger(__name__)

WAKE_GROUP = "leaseboard.workers"  # channel-layer group the workers listen on for "run a cycle now"


# --- checks and dry runs ---------------------------------------------------------------------


def _worker(fleet: Fleet, worker: str) -> str:
    if not worker:
        raise Refused("bad_request", "name the worker")
    if worker not in fleet.known_workers():
        known = ", ".join(sorted(fleet.known_workers())) or "none"
        raise Refused("unknown_worker", f"unknown worker {worker!r}; known workers: {known}")
    return worker


def _ago(fleet: Fleet, worker: str) -> str:
    member = fleet.members.get(worker)
    if member is None:
        return "it has never sent a heartbeat"
    return f"its last heartbeat was {fleet.now - member.last_seen:.0f}s ago"


def dry_run(fleet: Fleet, drained: frozenset[str], pins: Mapping[str, str], all_caused: bool = False) -> list[Move]:
    """The moves from today's owners to the assignment with ``drained`` and ``pins`` in force."""
    active = fleet.active
    base_view = fleet.view(fleet.drained, fleet.pins)
    view = fleet.view(drained, pins)
    base = assign(base_view, base_view.active()) if base_view is not None else {}
    after = assign(view, view.active()) if view is not None else {}
    moves = []
    for pid in fleet.partition_ids:
        now = active[pid].owner_id if pid in active else None
        then = after.get(pid)
        if now != then:
            moves.append(Move(pid, now, then, all_caused or base.get(pid) != then))
    return sorted(moves, key=lambda m: (not m.caused, pid_key(m.partition_id)))


def _summary(verb: str, moves: list[Move]) -> str:
    caused = [m for m in moves if m.caused]
    if not caused:
        return f"{verb}: no partition moves"
    pairs = Counter((m.before or "nobody", m.after or "nobody") for m in caused)
    detail = ", ".join(f"{a} → {b}: {n}" for (a, b), n in sorted(pairs.items()))
    return f"{verb}: {len(caused)} partition{'s' if len(caused) != 1 else ''} move ({detail})"


def plan(fleet: Fleet, request: Request) -> Preview:
    """The dry run of ``request`` on ``fleet``; Refused when it cannot be done (not for resets: see
    ``preview``, which also reads the source)."""
    action, target, value = request.action, request.target, request.value
    if action == "drain":
        worker = _worker(fleet, target)
        if worker in fleet.drained:
            raise Refused("no_change", f"{worker} is already draining")
        drained = fleet.drained | {worker}
        moves = dry_run(fleet, drained, fleet.pins)
        preview = Preview(request, _summary(f"drain {worker}", moves), moves)
        base_view = fleet.view(fleet.drained, fleet.pins)
        eligible = members(base_view, base_view.active()) if base_view is not None else []
        if worker in eligible and len(eligible) == 1:
            preview.needs_confirmation = True
            preview.notes.append(
                f"{worker} is the last live worker: draining it stops all processing until a worker joins or it "
                "is undrained"
            )
        if worker not in fleet.alive:
            preview.notes.append(f"{worker} is not alive ({_ago(fleet, worker)})")
        pinned = sorted((p for p, w in fleet.pins.items() if w == worker), key=pid_key)
        if pinned:
            preview.notes.append(f"partitions pinned to {worker} ({', '.join(pinned)}) go to others while it drains")
        return preview
    if action == "undrain":
        worker = _worker(fleet, target)
        if worker not in fleet.drained:
            raise Refused("no_change", f"{worker} is not draining")
        moves = dry_run(fleet, fleet.drained - {worker}, fleet.pins)
        return Preview(request, _summary(f"undrain {worker}", moves), moves)
    if action == "pin":
        pid = check_partition(fleet, target)
        worker = _worker(fleet, value)
        if worker in fleet.drained:
            raise Refused("drained_worker", f"cannot pin partition {pid} to {worker}: it is draining; undrain it first")
        if worker not in fleet.alive:
            why = f"cannot pin partition {pid} to {worker}: it is not alive ({_ago(fleet, worker)})"
            raise Refused("dead_worker", why)
        if fleet.pins.get(pid) == worker:
            raise Refused("no_change", f"partition {pid} is already pinned to {worker}")
        moves = dry_run(fleet, fleet.drained, {**fleet.pins, pid: worker})
        preview = Preview(request, _summary(f"pin partition {pid} to {worker}", moves), moves)
        if pid in fleet.pins:
            preview.notes.append(f"replaces its pin to {fleet.pins[pid]}")
        return preview
    if action == "unpin":
        pid = check_partition(fleet, target)
        if pid not in fleet.pins:
            raise Refused("no_change", f"partition {pid} is not pinned")
        pins = {p: w for p, w in fleet.pins.items() if p != pid}
        moves = dry_run(fleet, fleet.drained, pins)
        return Preview(request, _summary(f"unpin partition {pid} (pinned to {fleet.pins[pid]})", moves), moves)
    if action == "rebalance":
        moves = dry_run(fleet, fleet.drained, fleet.pins, all_caused=True)
        preview = Preview(request, _summary("rebalance now", moves), moves)
        if not moves:
            preview.notes.append("the fleet is balanced: every worker runs a cycle now, nothing moves")
        return preview
    if action == "purge":
        worker = _worker(fleet, target)
        if worker in fleet.alive:
            raise Refused("alive_worker", f"{worker} is alive: drain it and stop it before purging it")
        held = sorted((p for p, r in fleet.active.items() if r.owner_id == worker), key=pid_key)
        if held:
            raise Refused("owned", f"{worker} still holds unexpired leases on partitions {', '.join(held)}")
        preview = Preview(request, f"purge {worker}: forget its heartbeat; no partition moves")
        if worker in fleet.drained:
            preview.notes.append("its drain record is removed too")
        return preview
    if action == "resetcheckpoint":
        raise Refused("bad_request", "resetcheckpoint needs the event source: use preview()")
    raise Refused("bad_request", f"unknown action {action!r}")


# --- the two entry points --------------------------------------------------------------------


async def preview(ref: HubRef, request: Request, stores: Stores | None = None, expiry: float | None = None) -> Preview:
    """The dry run of ``request``; raises Refused (nothing is recorded: nothing was done)."""
    from django.conf import settings

    stores = stores or configured_stores()
    fleet = await read_fleet(ref, stores, expiry if expiry is not None else settings.LEASEBOARD_EXPIRY)
    if request.action == "resetcheckpoint":
        return (await reset_preview(fleet, request, stores))[0]
    return plan(fleet, request)


async def apply(
    ref: HubRef, request: Request, user: str, stores: Stores | None = None, expiry: float | None = None
) -> dict[str, Any]:
    """Do ``request`` and return its audit entry (JSON). Raises Refused, after recording the refusal."""
    from django.conf import settings

    stores = stores or configured_stores()
    detail: dict[str, Any] = {}
    try:
        if not request.reason:
            raise Refused("bad_request", "give a reason: it is kept in the audit log")
        fleet = await read_fleet(ref, stores, expiry if expiry is not None else settings.LEASEBOARD_EXPIRY)
        if request.action == "resetcheckpoint":
            shown, target = await reset_preview(fleet, request, stores)
            detail = shown.as_json()
            message = await write_reset(fleet, request.target, target, stores)
        else:
            shown = plan(fleet, request)
            detail = shown.as_json()
            if shown.needs_confirmation and not request.confirm_last:
                raise Refused("last_worker", f"{shown.notes[0]}; confirm explicitly to drain it")
            message = await _execute(ref, request, user, stores)
        message = f"{message}. {shown.summary}"
    except Refused as refusal:
        await _audit(ref, request, user, AuditEntry.REFUSED, refusal.message, detail)
        raise
    except Exception as exc:
        await _audit(ref, request, user, AuditEntry.FAILED, f"{type(exc).__name__}: {exc}", detail)
        raise
    return await _audit(ref, request, user, AuditEntry.APPLIED, message, detail)


async def _execute(ref: HubRef, request: Request, user: str, stores: Stores) -> str:
    """Write what ``request`` asks for; return what was done (one sentence)."""
    controls = stores.controls
    target, value, action = request.target, request.value, request.action
    reporter = f"dashboard:{user}"
    event: BalancerEvent | None = None
    now = time.time()

    def note(kind: EventKind, pid: str, after: str | None, before: str | None, why: str) -> BalancerEvent:
        return BalancerEvent(kind, ref, pid, after, before, reporter, f"{why}: {request.reason}", now)

    if action == "drain":
        await controls.put_control(Control(ref, ControlKind.DRAIN, target, user))
        event = note(EventKind.DRAIN, "*", None, target, f"drain {target}")
        done = f"{target} is draining"
    elif action == "undrain":
        await controls.delete_control(ref, ControlKind.DRAIN.value, target)
        event = note(EventKind.DRAIN, "*", target, None, f"undrain {target}")
        done = f"{target} is no longer draining"
    elif action == "pin":
        await controls.put_control(Control(ref, ControlKind.PIN, target, value))
        event = note(EventKind.PIN, target, value, None, f"pin to {value}")
        done = f"partition {target} is pinned to {value}"
    elif action == "unpin":
        await controls.delete_control(ref, ControlKind.PIN.value, target)
        event = note(EventKind.PIN, target, None, None, "unpin")
        done = f"partition {target} is no longer pinned"
    elif action == "rebalance":
        token = secrets.token_hex(8)
        await controls.put_control(Control(ref, ControlKind.REBALANCE, "*", token))
        await wake_workers("rebalance", token)
        return f"every worker was asked to run a cycle now (token {token})"
    elif action == "purge":
        await controls.remove_member(ref, target)
        await controls.delete_control(ref, ControlKind.DRAIN.value, target)
        done = f"{target} was forgotten"
    else:
        raise Refused("bad_request", f"unknown action {action!r}")
    if action != "purge":
        await wake_workers(action)
    if event is not None:
        await apublish(event)
    return done


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


async def _audit(
    ref: HubRef, request: Request, user: str, outcome: str, message: str, detail: dict[str, Any]
) -> dict[str, Any]:
    metrics.ADMIN_ACTIONS.labels(request.action, outcome).inc()
    log.info("audit: %s %s (%s): %s — %s", user, request.describe(), outcome, request.reason, message)

    def save() -> dict[str, Any]:
        entry = AuditEntry.objects.create(
            **AuditEntry.scope(ref), at=time.time(), user=user[:255], action=request.action,
            target=request.target[:255], value=request.value[:255], reason=request.reason,
            outcome=outcome, message=message, detail=detail,
        )  # fmt: skip
        return entry.as_json()

    saved: dict[str, Any] = await database_sync_to_async(save)()
    return saved


def recent_audit(ref: HubRef, limit: int = 50, target: str | None = None, after: int = 0) -> list[dict[str, Any]]:
    """Audit entries of ``ref``, newest first (sync ORM); ``target`` keeps one worker's or partition's."""
    rows = AuditEntry.objects.filter(**AuditEntry.scope(ref), id__gt=after)
    if target is not None:
        rows = rows.filter(target=target)
    return [row.as_json() for row in rows.order_by("-id")[:limit]]
