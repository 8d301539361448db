"""The ``/api/state`` snapshot of one hub and consumer group (shape fixed by DESIGN.md).

``assemble`` is a pure function of what was read; ``snapshot`` reads it from the configured
stores and event source. The snapshot carries ``last_event_id``, the newest EventLog id read
*before* the stores: every event above it may or may not be reflected yet, so a client applies
exactly the events above it on top of the snapshot, and every event at or below it already is.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from channels.db import database_sync_to_async
from django.conf import settings
from django.db.models import Max

from balancer.model import Checkpoint, Control, Controls, HubRef, Member, OwnershipRecord
from workers.sources.base import EventSource, PartitionProperties
from workers.wiring import Stores, build_source, build_stores, hub_ref

from .models import EventLog

log = logging.getLogger(__name__)

# Event Hubs' naming rules (letters, digits, '.', '-', '_', starting with a letter or digit), which
# also keep a hub name safe as the embedded hub's directory name; "$Default" is the one '$' name.
_HUB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,255}$")
_CONSUMER_GROUP = re.compile(r"^\$?[A-Za-z0-9][A-Za-z0-9._-]{0,255}$")

Snapshot = dict[str, Any]
T = TypeVar("T")


def parse_ref(hub: str | None, consumer_group: str | None) -> HubRef:
    """The HubRef for query values (missing or empty: the configured ones); ValueError saying what is wrong."""
    ref = hub_ref(hub or None, consumer_group or None)
    if not _HUB.match(ref.hub):
        raise ValueError(
            f"hub must be 1-256 letters, digits, '.', '-' or '_' starting with a letter or digit, got {ref.hub!r}"
        )
    if not _CONSUMER_GROUP.match(ref.consumer_group):
        raise ValueError(
            "consumer_group must be 1-256 letters, digits, '.', '-' or '_' (optionally after one leading '$'), "
            f"got {ref.consumer_group!r}"
        )
    return ref


def _pid_key(partition_id: str) -> tuple[int, str]:
    return (int(partition_id), partition_id) if partition_id.isdigit() else (1 << 62, partition_id)


def assemble(
    ref: HubRef,
    *,
    now: float,
    expiry: float,
    ownership: Iterable[OwnershipRecord],
    checkpoints: Iterable[Checkpoint],
    members: Iterable[Member],
    controls: Iterable[Control],
    partition_ids: Sequence[str] | None,
    properties: Mapping[str, PartitionProperties],
    source_name: str,
    source_error: str | None,
    last_event_id: int,
) -> Snapshot:
    """The snapshot of ``ref`` from what was read at store time ``now``.

    ``partition_ids`` None means the source could not say; the partitions the store has records
    for are shown then. A partition without properties gets null last-enqueued and lag.
    """
    owned_by = {r.partition_id: r for r in ownership if r.ref == ref}
    checkpointed = {c.partition_id: c for c in checkpoints if c.ref == ref}
    standing = Controls.of(controls)
    pins, drained = standing.pins, standing.drained
    ids = list(partition_ids) if partition_ids is not None else sorted(set(owned_by) | set(checkpointed), key=_pid_key)

    partitions = []
    owned_count: dict[str, int] = {}
    for pid in ids:
        record = owned_by.get(pid)
        if record is None or not record.owner_id:
            status, owner = "unowned", None
        elif record.expired(now, expiry):
            status, owner = "expired", None
        else:
            status, owner = "owned", record.owner_id
            owned_count[owner] = owned_count.get(owner, 0) + 1
        checkpoint = checkpointed.get(pid)
        props = properties.get(pid)
        last_enqueued = props.last_enqueued_sequence_number if props is not None else None
        last_time = props.last_enqueued_time if props is not None else None
        lag = None
        if last_enqueued is not None:
            # Without a checkpoint everything retained is still to do (-1 + 1 = 0 for an empty partition).
            done = checkpoint.sequence_number if checkpoint is not None else -1
            lag = max(0, last_enqueued - done)
        partitions.append(
            {
                "id": pid,
                "owner": owner,
                "last_modified": record.last_modified if record is not None else None,
                "sequence_number": checkpoint.sequence_number if checkpoint is not None else None,
                "last_enqueued_sequence_number": last_enqueued,
                "last_enqueued_time": last_time,
                "checkpoint_modified": checkpoint.last_modified if checkpoint is not None else None,
                "lag": lag,
                "pinned_to": pins.get(pid),
                "status": status,
            }
        )

    seen = {m.owner_id: m for m in members if m.ref == ref}
    workers = []
    for worker_id in sorted(set(seen) | set(owned_count) | drained):
        member = seen.get(worker_id)
        workers.append(
            {
                "id": worker_id,
                "owned": owned_count.get(worker_id, 0),
                "draining": worker_id in drained,
                "last_seen": member.last_seen if member is not None else None,
                "alive": member is not None and member.alive(now, expiry),
            }
        )

    return {
        "namespace": ref.namespace,
        "hub": ref.hub,
        "consumer_group": ref.consumer_group,
        "generated_at": now,
        "expiry": expiry,
        "last_event_id": last_event_id,
        "source": {"name": source_name, "available": source_error is None, "error": source_error},
        "partitions": partitions,
        "workers": workers,
    }


# --- reading ----------------------------------------------------------------------------------

# Sources are opened once per (name, hub, directory) and kept: opening one may cost a connection.
# Reads are serialised: a source object need not be thread-safe, and snapshots run on threads.
_sources: dict[tuple[str, str, str], EventSource] = {}
_sources_lock = threading.Lock()


def _source_key(hub: str) -> tuple[str, str, str]:
    return (settings.LEASEBOARD_SOURCE, hub, str(settings.LEASEBOARD_HUB_DIR))


def _read_source(key: tuple[str, str, str]) -> tuple[list[str] | None, dict[str, PartitionProperties], str | None]:
    """Partition ids and properties from the source; on failure, what is known and why not more."""
    with _sources_lock:
        return _read_source_locked(key)


def _read_source_locked(
    key: tuple[str, str, str],
) -> tuple[list[str] | None, dict[str, PartitionProperties], str | None]:
    name, hub, directory = key
    try:
        source = _sources.get(key)
        if source is None:
            if name == "embedded" and not _embedded_exists(directory, hub):
                # Opening an embedded hub creates it; a page view must not create hubs on disk.
                return None, {}, f"embedded hub {hub!r} does not exist yet under {directory}"
            source = _sources[key] = build_source(name, hub)
        ids = sorted(source.partition_ids(), key=_pid_key)
    except Exception as exc:  # a source is a foreign system; whatever it raises, the page still renders
        _sources.pop(key, None)
        log.warning("event source %s for hub %r unavailable: %s", name, hub, exc)
        return None, {}, f"event source {name!r} unavailable: {exc}"
    properties: dict[str, PartitionProperties] = {}
    failures: list[str] = []
    for pid in ids:
        try:
            properties[pid] = source.properties(pid)
        except Exception as exc:  # one unreadable partition leaves nulls in its tile, not an error page
            failures.append(f"{pid}: {exc}")
    error = None
    if failures:
        _sources.pop(key, None)  # maybe a stale handle; reopen next time
        error = f"could not read {len(failures)} partition(s) from {name!r}: " + "; ".join(failures[:3])
    return ids, properties, error


def with_source(hub: str, work: Callable[[EventSource], T]) -> T | None:
    """``work(source)`` on the configured source of ``hub`` (None when it does not exist or cannot
    be opened), serialised with every other read of it. Blocking: call it on a thread."""
    key = _source_key(hub)
    with _sources_lock:
        source = _sources.get(key)
        if source is None:
            name, _, directory = key
            if name == "embedded" and not _embedded_exists(directory, hub):
                return None
            try:
                source = _sources[key] = build_source(name, hub)
            except Exception as exc:  # reported by the snapshot's source.error; nothing to add here
                log.debug("event source %s for hub %r unavailable: %s", name, hub, exc)
                return None
        return work(source)


def _embedded_exists(directory: str, hub: str) -> bool:
    from workers.hub.embedded import EmbeddedHub

    return EmbeddedHub.exists(directory, hub)


_recent: dict[HubRef, tuple[float, Snapshot]] = {}  # for shared_snapshot

# One Stores per store name per process: an adapter may hold connections and threads.
_stores: dict[str, Stores] = {}


def configured_stores() -> Stores:
    """The stores named by ``settings.LEASEBOARD_STORE``, built once per process."""
    name = settings.LEASEBOARD_STORE
    stores = _stores.get(name)
    if stores is None:
        stores = _stores[name] = build_stores(name)
    return stores


async def forget_stores() -> None:
    """Close and drop the cached stores and sources (tests switching settings; shutdown)."""
    stores = list(_stores.values())
    _stores.clear()
    _recent.clear()
    for each in stores:
        for store in {id(s): s for s in (each.ownership, each.checkpoints, each.controls)}.values():
            close = getattr(store, "aclose", None)
            if close is not None:
                await close()
    with _sources_lock:
        sources = list(_sources.values())
        _sources.clear()
    for source in sources:
        source.close()


def _last_event_id(ref: HubRef) -> int:
    found = EventLog.objects.filter(**EventLog.scope(ref)).aggregate(top=Max("id"))["top"]
    return int(found or 0)


async def last_event_id(ref: HubRef) -> int:
    """The newest EventLog id of ``ref`` (0 when there is none)."""
    found: int = await database_sync_to_async(_last_event_id)(ref)
    return found


async def snapshot(ref: HubRef, stores: Stores | None = None) -> Snapshot:
    """The snapshot of ``ref`` from the configured (or given) stores and the configured source.

    Raises the store's error (StoreError, or the database's) when the store cannot be read; an
    unreachable event source only leaves nulls and says why in ``source.error``.
    """
    watermark = await last_event_id(ref)  # first: see the module docstring
    stores = stores or configured_stores()
    now = await stores.ownership.now()
    ownership = await stores.ownership.list_ownership(ref)
    checkpoints = await stores.checkpoints.list_checkpoints(ref)
    members = await stores.controls.list_members(ref)
    controls = await stores.controls.list_controls(ref)
    key = _source_key(ref.hub)
    ids, properties, source_error = await asyncio.to_thread(_read_source, key)
    return assemble(
        ref,
        now=now,
        expiry=settings.LEASEBOARD_EXPIRY,
        ownership=ownership,
        checkpoints=checkpoints,
        members=members,
        controls=controls,
        partition_ids=ids,
        properties=properties,
        source_name=key[0],
        source_error=source_error,
        last_event_id=watermark,
    )


async def shared_snapshot(ref: HubRef, max_age: float = 0.5) -> Snapshot:
    """A snapshot at most ``max_age`` seconds old, shared by every websocket of this process.

    Two callers racing past an old entry both build one; that costs a read, never correctness.
    """
    cached = _recent.get(ref)
    if cached is not None and time.monotonic() - cached[0] <= max_age:
        return cached[1]
    state = await snapshot(ref)
    _recent[ref] = (time.monotonic(), state)
    return state
