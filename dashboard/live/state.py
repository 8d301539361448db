"""Reading the console's state of one hub and consumer group from the stores and the event source.

``read`` returns a ``console.ConsoleState`` without figures; ``stored_figures`` gives the figures of
the newest stored sampling round (for when no monitor is running). The state carries
``last_event_id``, the newest EventLog id read *before* the stores: every event above it may or may
not be reflected yet, so a client applies exactly the events above it on top of the state, and
every event at or below it already is.

Outages (``health.py``): when the database does not answer but the store does (Redis or Blob), the
state is still read, with the last watermark this process saw (lower is safe: the client replays
a few events it already has). A store call that failed because the SQL store's kept connection
died in a database restart is run once more (the store reconnects on the next call), so the first
read after the restart succeeds. Every read reports to ``health``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from django.conf import settings
from django.db.models import Max, Q, Subquery

from balancer.errors import StoreUnavailable
from balancer.model import Checkpoint, Control, HubRef, Member, OwnershipRecord, pid_key
from workers.sources.base import EventSource, PartitionProperties
from workers.wiring import Stores, build_source, build_stores, close_stores, hub_ref

from ..dbthread import DatabaseThread
from ..models import EventLog, LagSample
from .console import ConsoleState, Figures, Json, LagRules, assemble
from .health import DATABASE, DATABASE_ERRORS, health, report, store_backend
from .lag import Status

log = logging.getLogger(__name__)

# Event Hubs' naming rules (letters, digits, '.', '-', '_', starting with a letter or digit), which
# also keep a hub name safe as the embedded hub's directory name; "$Default" is the one '$' name.
# Matched whole (``fullmatch``: a trailing newline is refused) and at most 255 characters: the
# database's columns and a file name's limit (a hub names the dead-letter folder).
_HUB = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
_CONSUMER_GROUP = re.compile(r"(?=.{1,255}\Z)\$?[A-Za-z0-9][A-Za-z0-9._-]*", re.DOTALL)

T = TypeVar("T")
# Seconds the console's reads of the store (one state: its clock and four listings) may take. A store
# cut off by a silent network answers nothing, and a Blob or Redis client waits out its own timeouts
# (10 s and more, and a retry) before it fails: the console says the store is down after this long
# instead, so /metrics (leaseboard_store_up 0) and /api/state (503, or the last state marked stale)
# answer within a scrape's timeout.
STORE_READ_SECONDS = 5.0


def parse_ref(hub: object, consumer_group: object) -> HubRef:
    """The HubRef for query values or a JSON body's (missing, null or empty: the configured ones);
    ValueError saying what is wrong (a value that is no string included: ``{}`` is no name)."""
    for name, value in (("hub", hub), ("consumer_group", consumer_group)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {value!r}")
    assert hub is None or isinstance(hub, str)
    assert consumer_group is None or isinstance(consumer_group, str)
    ref = hub_ref(hub or None, consumer_group or None)
    if not _HUB.fullmatch(ref.hub):
        raise ValueError(
            f"hub must be 1-255 letters, digits, '.', '-' or '_' starting with a letter or digit, got {ref.hub!r}"
        )
    if not _CONSUMER_GROUP.fullmatch(ref.consumer_group):
        raise ValueError(
            "consumer_group must be 1-255 letters, digits, '.', '-' or '_' (optionally after one leading '$'), "
            f"got {ref.consumer_group!r}"
        )
    return ref


def lag_rules() -> LagRules:
    """The configured rules of the lag status."""
    return LagRules(
        settings.LEASEBOARD_LAG_WINDOW, settings.LEASEBOARD_LAG_SAMPLE_SECONDS, settings.LEASEBOARD_LAG_STOP_SECONDS
    )


# --- the event source -------------------------------------------------------------------------

# Sources are opened once per (name, hub, directory) and kept: opening one may cost a connection.
# Reads are serialised: a source object need not be thread-safe, and reads run on threads.
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
        ids = sorted(source.partition_ids(), key=pid_key)
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


def read_source(hub: str) -> tuple[str, list[str] | None, dict[str, PartitionProperties], str | None]:
    """The configured source's name, and the partition ids and properties of ``hub`` as ``read`` reads
    them (None, {} and why not where it cannot say). Blocking: call it on a thread."""
    key = _source_key(hub)
    return (key[0], *_read_source(key))


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
            except Exception as exc:  # reported by the state's source.error; nothing to add here
                log.debug("event source %s for hub %r unavailable: %s", name, hub, exc)
                return None
        return work(source)


def _embedded_exists(directory: str, hub: str) -> bool:
    from workers.hub.embedded import EmbeddedHub

    return EmbeddedHub.exists(directory, hub)


# --- the stores -------------------------------------------------------------------------------

# One Stores per store name per process: an adapter may hold connections and threads.
_stores: dict[str, Stores] = {}


def configured_stores() -> Stores:
    """The stores named by ``settings.LEASEBOARD_STORE``, built once per process."""
    name = settings.LEASEBOARD_STORE
    stores = _stores.get(name)
    if stores is None:
        stores = _stores[name] = build_stores(name)
    return stores


# The newest state served per store and hub (``remember``): what /api/state answers, marked stale,
# while the store is down.
_served: dict[tuple[str, HubRef], Json] = {}


def remember(ref: HubRef, served: Json) -> None:
    """Keep ``served`` (a state's JSON) as the last known state of ``ref`` in the configured store."""
    _served[(settings.LEASEBOARD_STORE, ref)] = served


def last_served(ref: HubRef) -> Json | None:
    """The last state of ``ref`` in the configured store that ``remember`` kept, if any."""
    return _served.get((settings.LEASEBOARD_STORE, ref))


# What readers of the stores keep open beside them (the groups page's Blob listing client), closed with them.
_closers: list[Callable[[], Awaitable[None]]] = []


def close_with_stores(close: Callable[[], Awaitable[None]]) -> None:
    """Have ``forget_stores`` call ``close()`` when it closes the stores."""
    _closers.append(close)


async def forget_stores() -> None:
    """Close and drop the cached stores and sources, and the states kept (tests switching settings; shutdown)."""
    stores = list(_stores.values())
    _stores.clear()
    _served.clear()
    for each in stores:
        await close_stores(each)
    closers = list(_closers)
    _closers.clear()
    for close in closers:
        await close()
    with _sources_lock:
        sources = list(_sources.values())
        _sources.clear()
    for source in sources:
        source.close()


# --- reading ----------------------------------------------------------------------------------


def _last_event_id(ref: HubRef) -> int:
    found = EventLog.objects.filter(**EventLog.scope(ref)).aggregate(top=Max("id"))["top"]
    return int(found or 0)


# The newest watermark read per hub: what a read uses while the database does not answer.
_watermarks: dict[HubRef, int] = {}


async def _watermark(ref: HubRef, db: DatabaseThread) -> int:
    """The newest EventLog id of ``ref``; while the database is down, the last one read (or 0)."""
    started = time.monotonic()
    try:
        found = await db.acall(_last_event_id, ref)
    except DATABASE_ERRORS as exc:
        report(exc, started)
        if store_backend() == DATABASE:
            raise  # the SQL store is down too: nothing to read
        return _watermarks.get(ref, 0)
    health.ok(DATABASE)
    _watermarks[ref] = max(found, _watermarks.get(ref, 0))
    return found


def _broken_connection(exc: BaseException) -> bool:
    """A SQL store's call failed on a connection the database had dropped (it reconnects next call)."""
    return isinstance(exc.__cause__, DATABASE_ERRORS)


async def store_call(call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, run once more when it failed on a connection the database had dropped (the SQL
    store reconnects on the next call); any other failure is raised."""
    try:
        return await call()
    except Exception as exc:
        if not _broken_connection(exc):
            raise
    return await call()  # once more, on the connection the store opens now


async def store_read(call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, the console's read of the store, within ``STORE_READ_SECONDS``: raises the store's
    error (StoreUnavailable when it took longer), reported to ``health`` as the outcome is."""
    started = time.monotonic()
    try:
        try:
            async with asyncio.timeout(STORE_READ_SECONDS):
                found = await call()
        except TimeoutError:
            raise StoreUnavailable(
                f"{store_backend()} did not answer within {STORE_READ_SECONDS:g} s (cut off or overloaded)"
            ) from None
    except Exception as exc:
        report(exc, started)
        raise
    health.ok(store_backend())
    return found


async def read(ref: HubRef, *, db: DatabaseThread, stores: Stores | None = None) -> ConsoleState:
    """The state of ``ref`` (without figures) from the configured (or given) stores and the
    configured source; the event log is read on ``db``.

    Raises the store's error (StoreError, or the database's) when the store cannot be read; an
    unreachable event source only leaves nulls and says why in ``source.error``. Outages are
    reported to ``health`` (one log line per change, none per call).
    """
    watermark = await _watermark(ref, db)  # first: see the module docstring
    used = stores or configured_stores()

    async def listings() -> tuple[float, list[OwnershipRecord], list[Checkpoint], list[Member], list[Control]]:
        return (
            await store_call(used.ownership.now),
            await store_call(lambda: used.ownership.list_ownership(ref)),
            await store_call(lambda: used.checkpoints.list_checkpoints(ref)),
            await store_call(lambda: used.controls.list_members(ref)),
            await store_call(lambda: used.controls.list_controls(ref)),
        )

    now, ownership, checkpoints, members, controls = await store_read(listings)
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


_STATUS_OF = {status.value: status for status in Status}  # "" (no status) and anything else: None


def stored_figures(ref: HubRef) -> Figures:
    """The figures of the newest stored sampling round of ``ref`` (no rates: a round has none).
    Blocking ORM code: run it on a DatabaseThread."""
    return stored_figures_of([ref])[ref]


FIGURES_CHUNK = 100  # hubs per query of ``stored_figures_of`` (each a term of one OR)


def stored_figures_of(refs: Sequence[HubRef]) -> dict[HubRef, Figures]:
    """``stored_figures`` of each of ``refs``: one query per ``FIGURES_CHUNK`` of them, each finding
    every hub's newest round through the index on (hub, at). Blocking ORM code."""
    rules = lag_rules()
    rounds: dict[HubRef, list[tuple[str, float | None, str, float]]] = {}
    for start in range(0, len(refs), FIGURES_CHUNK):
        newest = Q()
        for ref in refs[start : start + FIGURES_CHUNK]:
            scope = LagSample.scope(ref)
            top = LagSample.objects.filter(**scope).order_by("-at").values("at")[:1]
            newest |= Q(**scope, at=Subquery(top))
        fields = ("namespace", "hub", "consumer_group", "partition_id", "lag_seconds", "status", "at")
        for namespace, hub, group, *row in LagSample.objects.filter(newest).values_list(*fields):
            rounds.setdefault(HubRef(namespace, hub, group), []).append(tuple(row))
    found = {ref: Figures(rules) for ref in refs}
    for ref, rows in rounds.items():
        found[ref] = Figures(
            rules,
            lag_seconds={pid: seconds for pid, seconds, _, _ in rows},
            statuses={pid: _STATUS_OF.get(status) for pid, _, status, _ in rows},
            sampled_at=rows[0][3],
        )
    return found
