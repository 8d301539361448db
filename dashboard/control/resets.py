"""The ``resetcheckpoint`` action: where earliest, latest, a sequence number or a time puts a partition's
checkpoint, and writing it through the lease.

The dashboard claims the partition as ``ADMIN_OWNER`` with the ETag it read (so no worker is
between two checkpoints of it), writes the checkpoint fenced by that ownership, and releases it;
the next owner starts from there. With ``force`` it takes an owned partition from its worker, whose
next renewal fails and whose pump stops at its next checkpoint (refused: the store is fenced), so
at most the events it was handling then are handled again. "earliest" when the first retained event
is 0 removes the checkpoint (no sequence number says "before 0"): the SQL store's row is deleted
under the same fence; a store with ``delete_checkpoint(ref, partition, owner)`` is asked to.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from balancer.model import RESET_OWNER, Checkpoint, HubRef, OwnershipRecord
from workers.sources.base import EventSource, Position
from workers.wiring import Stores

from ..dbthread import DatabaseThread
from ..live.enqueued import EnqueuedTimes
from ..live.state import with_source
from ..models import CheckpointRow, Ownership
from .action import Action, Argument, Context, Done, Kind
from .request import Preview, Refused

_db = DatabaseThread("leaseboard-resets")  # the dashboard's one way off the event loop: dbthread.py

ADMIN_OWNER = RESET_OWNER  # the owner id the dashboard claims a partition under to reset it
TIME_SCAN_LIMIT = 5_000_000  # events read at most to find a time


@dataclass(frozen=True, slots=True)
class Target:
    sequence_number: int | None  # None: no checkpoint (the next owner starts at its initial position)
    offset: str | None
    description: str
    last_enqueued: int


def parse_time(value: str) -> float | None:
    """Seconds since the epoch for an ISO 8601 time (no zone: UTC), None if ``value`` is not one."""
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _resolve(source: EventSource, pid: str, spec: str) -> Target:
    """Where ``spec`` puts the checkpoint of ``pid``. Blocking (reads the source); Refused when it cannot."""
    props = source.properties(pid)
    first, last = props.begin_sequence_number, props.last_enqueued_sequence_number

    def earliest(why: str) -> Target:
        if first <= 0:
            return Target(None, None, f"{why}: no checkpoint, the next owner starts at the first event", last)
        return Target(first - 1, None, f"{why}: just before event {first}, the first retained", last)

    if spec == "earliest":
        return earliest("earliest")
    if spec == "latest":
        if last < 0:
            return earliest("latest (the partition is empty)")
        return Target(last, props.last_enqueued_offset, f"latest: after event {last}, skipping what is there", last)
    if spec.lstrip("-").isdigit():
        sequence = int(spec)
        if not first <= sequence <= last:
            raise Refused(
                "bad_request", f"sequence number {sequence} is not in partition {pid} (it holds {first}..{last})"
            )
        event = EnqueuedTimes().event(source, pid, sequence)
        if event is None:
            raise Refused("bad_request", f"event {sequence} of partition {pid} could not be read")
        return Target(sequence, event.offset, f"event {sequence}: processing resumes at {sequence + 1}", last)
    when = parse_time(spec)
    if when is None:
        raise Refused("bad_request", f"reset to earliest, latest, a sequence number or an ISO 8601 time, not {spec!r}")
    return _at_time(source, pid, when, spec, last, earliest)


def _at_time(source: EventSource, pid: str, when: float, spec: str, last: int, earliest: Any) -> Target:
    """The checkpoint just before the first event enqueued at or after ``when``."""
    reader = source.reader(pid, Position.earliest())
    previous = None
    read = 0
    try:
        while read < TIME_SCAN_LIMIT:
            events = reader.receive(1000)
            if not events:
                break
            for event in events:
                if event.enqueued_time >= when:
                    if previous is None:
                        return earliest(f"{spec} (before the first retained event)")  # type: ignore[no-any-return]
                    return Target(
                        previous.sequence_number,
                        previous.offset,
                        f"{spec}: processing resumes at event {event.sequence_number}, the first enqueued then",
                        last,
                    )
                previous = event
            read += len(events)
    finally:
        reader.close()
    if read >= TIME_SCAN_LIMIT:
        raise Refused("bad_request", f"no event at or after {spec} in the first {TIME_SCAN_LIMIT} of partition {pid}")
    if previous is None:
        return earliest(f"{spec} (the partition is empty)")  # type: ignore[no-any-return]
    return Target(previous.sequence_number, previous.offset, f"{spec}: after the last event, nothing later", last)


def _can_remove(stores: Stores) -> bool:
    from ..sql.store import SqlStore

    store = getattr(stores.checkpoints, "_store", stores.checkpoints)  # under workers.store_metrics.InstrumentedStore
    return hasattr(store, "delete_checkpoint") or isinstance(store, SqlStore)


async def reset_preview(ctx: Context) -> Preview:
    """The checkpoint's move and what it means for lag; Refused when the source cannot say or a worker owns it."""
    fleet, request, stores = ctx.fleet, ctx.request, ctx.stores
    pid = request.target
    holder = fleet.active.get(pid)
    if holder is not None and not request.force:
        raise Refused(
            "owned", f"partition {pid} is owned by {holder.owner_id}: drain or stop it first, or force the reset"
        )
    target = await asyncio.to_thread(with_source, fleet.ref.hub, lambda s: _resolve(s, pid, request.value))
    if target is None:
        raise Refused("no_source", f"the event source of hub {fleet.ref.hub!r} cannot be read")
    if target.sequence_number is None and not _can_remove(stores):
        raise Refused("unsupported", "this store cannot remove a checkpoint: reset to a sequence number instead")
    current = fleet.checkpoints.get(pid)
    before = current.sequence_number if current is not None else None
    after = target.sequence_number
    last = target.last_enqueued
    done_before, done_after = (-1 if before is None else before), (-1 if after is None else after)
    checkpoint = {
        "partition_id": pid,
        "owner": holder.owner_id if holder is not None else None,
        "from": before,
        "to": after,
        "description": target.description,
        "lag_before": max(0, last - done_before) if last >= 0 else 0,
        "lag_after": max(0, last - done_after) if last >= 0 else 0,
        "again": max(0, done_before - done_after),
        "skipped": max(0, done_after - done_before),
    }
    verb = f"reset partition {pid} to {request.value}"
    if after == before:
        summary = f"{verb}: the checkpoint stays at {before}"
    elif checkpoint["again"]:
        summary = f"{verb}: {checkpoint['again']} events are handled again"
    else:
        summary = f"{verb}: {checkpoint['skipped']} events are skipped"
    preview = Preview(request, summary, checkpoint=checkpoint, effect=target)
    preview.notes.append(target.description)
    if holder is not None:
        preview.notes.append(
            f"forced: {holder.owner_id} loses the partition; the events it is handling now may be handled again"
        )
    if after is None:
        preview.notes.append("workers started with --initial-position latest would start at the end instead")
    return preview


async def reset_write(ctx: Context, shown: Preview) -> Done:
    """Claim the partition, write (or remove) its checkpoint fenced by that claim, release it."""
    fleet, stores, pid, target = ctx.fleet, ctx.stores, ctx.request.target, shown.effect
    assert isinstance(target, Target)
    seen = fleet.records.get(pid)
    claim = OwnershipRecord(fleet.ref, pid, ADMIN_OWNER) if seen is None else seen.claimed_by(ADMIN_OWNER)
    won = await stores.ownership.claim_ownership([claim])
    if not won:
        raise Refused("conflict", f"partition {pid} changed hands during the reset; nothing was written, try again")
    held = won[0]
    try:
        if target.sequence_number is None:
            await _remove_checkpoint(stores, fleet.ref, pid)
            return Done(f"partition {pid}: checkpoint removed", wake=False)
        checkpoint = Checkpoint(fleet.ref, pid, target.sequence_number, target.offset)
        await stores.checkpoints.update_checkpoint(checkpoint, ADMIN_OWNER)
        return Done(f"partition {pid}: checkpoint set to {target.sequence_number}", wake=False)
    finally:
        # Released at once, so the planned owner takes it at its next cycle rather than after expiry.
        await stores.ownership.claim_ownership([held.claimed_by("")])


async def _remove_checkpoint(stores: Stores, ref: HubRef, pid: str) -> None:
    store: Any = getattr(stores.checkpoints, "_store", stores.checkpoints)
    delete = getattr(store, "delete_checkpoint", None)
    if delete is not None:
        await delete(ref, pid, ADMIN_OWNER)
        return
    using: str = store.using

    def remove() -> None:
        with transaction.atomic(using=using):
            # Fenced like a checkpoint write: only while the dashboard holds the partition.
            held = Ownership.objects.using(using).filter(**Ownership.scope(ref), partition_id=pid, owner_id=ADMIN_OWNER)
            if not held.exists():
                raise Refused("conflict", f"partition {pid} changed hands during the reset; nothing was removed")
            CheckpointRow.objects.using(using).filter(**CheckpointRow.scope(ref), partition_id=pid).delete()

    await _db.acall(remove)


RESETCHECKPOINT = Action(
    "resetcheckpoint",
    "Resets a partition's checkpoint: the next owner resumes after the new one.",
    "Reset the checkpoint of partition {target}",
    reset_preview,
    reset_write,
    target=Argument(Kind.PARTITION, "the partition id"),
    value=Argument(
        Kind.POSITION, "where to reset to: earliest, latest, a sequence number or an ISO 8601 time", option="--to"
    ),
    force="reset even while a worker owns the partition (it loses it)",
)
