"""The SQL store's plumbing: its threads, its connections, and how it reads what it lists.

ORM work runs on threads the store owns (``dbthread.DatabaseThread``), one per *lane*: ``lease``
(ownership, clock, members, controls) and ``checkpoint``, so a burst of checkpoint writes never
delays a lease renewal. A connection that failed is closed, and the call fails with
``StoreUnavailable`` naming the database (never its password); the next call reconnects. Rows a
listing cannot read in full are logged once (``balancer.stores.flaws.CorruptLog``).
"""

from __future__ import annotations

import logging
import secrets
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import QuerySet

from balancer.errors import CorruptRecord, StoreUnavailable
from balancer.model import Checkpoint, HubRef, OwnershipRecord
from balancer.stores.flaws import CorruptLog
from balancer.stores.unchanged import LastReads

from ..dbthread import DatabaseThread
from ..models import OwnershipClock
from .rows import Listing

log = logging.getLogger(__name__)
T = TypeVar("T")

LEASE, CHECKPOINT = "lease", "checkpoint"


def _shut_lanes(lanes: list[DatabaseThread]) -> None:
    """Close a dropped store's connections and let its threads end (no waiting: may run in GC)."""
    for lane in lanes:
        lane.close_soon()


class Lanes:
    """The threads and connections of a store on the Django database ``using``, and the listing
    helpers its reads and writes share (``SqlStore`` is built on it)."""

    def __init__(self, using: str = "default") -> None:
        if using not in connections:
            raise StoreUnavailable(f"no database {using!r} in settings.DATABASES")
        self.using = using
        self.requests = 0
        self._statements: dict[str, int] = {}
        # Threads start on first use. No check of an idle connection: a connection the server
        # dropped fails one call (StoreUnavailable) and the next reconnects, without the round trip
        # a check would add to every call of a worker's cycle.
        self._lanes = {
            lane: DatabaseThread(f"sqlstore-{using}-{lane}", using, checks=False) for lane in (LEASE, CHECKPOINT)
        }
        self._finalizer = weakref.finalize(self, _shut_lanes, list(self._lanes.values()))
        self._corrupt = CorruptLog(log, f" (database {using!r})")
        self._unchanged = LastReads()  # the members and controls listings, by (table, hub)

    @property
    def corrupt(self) -> list[CorruptRecord]:
        """The rows the latest listings could not read in full (listed in part, or skipped)."""
        return self._corrupt.records

    @property
    def statements(self) -> int:
        return sum(self._statements.values())

    async def aclose(self) -> None:
        """Close this store's connections and stop its threads; it must not be used afterwards."""
        for lane in self._lanes.values():
            await lane.aclose()
        self._finalizer.detach()

    def __repr__(self) -> str:
        return f"SqlStore(using={self.using!r})"

    async def _run(self, lane: str, work: Callable[..., T], *args: Any) -> T:
        self.requests += 1
        # If the awaiting task is cancelled the statement still runs to the end on its thread; a
        # claim may then be won without the caller hearing of it (the next listing shows it).
        return await self._lanes[lane].acall(self._guarded, lane, work, *args)

    def _guarded(self, lane: str, work: Callable[..., T], *args: Any) -> T:
        connection = connections[self.using]
        if not any(getattr(w, "lane", None) == (id(self), lane) for w in connection.execute_wrappers):
            connection.execute_wrappers.append(self._counter(lane))
        try:
            return work(connection, *args)
        except (OperationalError, InterfaceError) as exc:
            # A broken connection is never reused: the next call on this lane reconnects.
            connection.close()
            raise StoreUnavailable(self._describe(exc)) from exc
        except DatabaseError as exc:
            if "does not exist" in str(exc):  # PostgreSQL's missing table
                raise StoreUnavailable(self._describe(exc)) from exc
            raise

    def _counter(self, lane: str) -> Callable[..., Any]:
        # The wrapper lives on the lane thread's connection: it must not hold the store itself,
        # or a dropped store would never be collected (and its threads never end).
        statements = self._statements
        statements.setdefault(lane, 0)

        def count(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
            statements[lane] += 1
            return execute(sql, params, many, context)

        count.lane = (id(self), lane)  # type: ignore[attr-defined]
        return count

    def _describe(self, exc: Exception) -> str:
        """Names the database, never its password."""
        conf = connections.settings[self.using]
        where = conf.get("NAME") or "?"
        if conf.get("HOST"):
            where = f"{where} at {conf['HOST']}:{conf.get('PORT') or 'default port'}"
        problem = " ".join(str(exc).split())
        password = conf.get("PASSWORD")
        if password:
            problem = problem.replace(str(password), "***")
        hint = ""
        if "no such table" in problem or "does not exist" in problem:
            hint = " (run `python manage.py migrate`)"
        engine = str(conf.get("ENGINE", "?")).rsplit(".", 1)[-1]
        return f"database {self.using!r} ({engine} {where}) is unavailable: {problem}{hint}"

    def _rows(self, model: type[Any], ref: HubRef) -> QuerySet[Any]:
        rows: QuerySet[Any] = model.objects.using(self.using).filter(**model.scope(ref))
        return rows

    def _valid(
        self,
        listing: Listing,
        rows: list[Any],
        ref: HubRef,
        convert: Callable[[Any, HubRef, list[str]], T],
        whole: bool = True,
    ) -> list[T]:
        """``rows`` of one listing (``whole``: every row of ``ref``) converted to records. ``convert``
        notes in its list what it had to read around, or raises ValueError or TypeError for a row that
        cannot be read at all, which is skipped. Either is logged once (see ``CorruptLog``); only a
        whole listing forgets rows no longer found."""
        out = []
        found: dict[str, CorruptRecord] = {}
        skipped = set()
        for row in rows:
            flaws: list[str] = []
            try:
                out.append(convert(row, ref, flaws))
            except (ValueError, TypeError) as exc:
                flaws = [str(exc)]
                skipped.add(str(row.pk))
            if flaws:
                found[str(row.pk)] = CorruptRecord(
                    f"{listing.table} id={row.pk} ({listing.describe(row, ref)})", "; ".join(flaws)
                )
        if whole:
            self._corrupt.listing(f"{listing.table} {ref}", found, frozenset(skipped))
        return out

    def _small(
        self,
        listing: Listing,
        connection: BaseDatabaseWrapper,
        ref: HubRef,
        convert: Callable[[Any, HubRef, list[str]], T],
        found: list[tuple[Any, ...]] | None = None,
    ) -> list[T]:
        """A whole listing of a small table (read now, or ``found``: as ``Listing.fetch`` gave it), not
        converted again when its rows came back as they were (``balancer.stores.unchanged``)."""
        if found is None:
            found = listing.fetch(connection, ref)
        return self._unchanged.records(
            (listing.table, ref), found, lambda: self._valid(listing, listing.rows(connection, found), ref, convert)
        )

    def _make_clock(self, ref: HubRef) -> None:
        """The hub's clock row, with a fresh epoch (a no-op if another writer made it meanwhile)."""
        OwnershipClock.objects.using(self.using).bulk_create(
            [OwnershipClock(**OwnershipClock.scope(ref), serial=0, epoch=secrets.token_hex(8))],
            ignore_conflicts=True,
        )


def by_partition(record: OwnershipRecord | Checkpoint) -> int:
    return int(record.partition_id)
