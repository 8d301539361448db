"""The SQL store's reads of ownership, members and controls: the whole snapshot, and the changes
since a cursor (``balancer.changes``) that a worker's steady cycle reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.db.backends.base.base import BaseDatabaseWrapper

from balancer.changes import Changes
from balancer.model import Control, HubRef, Member, OwnershipRecord
from balancer.protocol import Snapshot

from ..models import OwnershipClock
from . import clock as sqlclock
from . import rows as sqlrows
from .clock import PG_CLOCK, read_clock
from .lanes import Lanes, by_partition
from .rows import CONTROL_PRINT, CONTROLS, MEMBER_PRINT, MEMBERS, OWNERSHIP, Listing

T = TypeVar("T")


class Reads(Lanes):
    """The listings of the lease lane, run on its thread (``SqlStore`` awaits them)."""

    def _snapshot(self, connection: BaseDatabaseWrapper, ref: HubRef) -> Snapshot:
        # Three reads, not one transaction: on SQLite a transaction here would take the write lock
        # (BEGIN IMMEDIATE), and each list is consistent on its own, which is all planning needs.
        return Snapshot(
            self._list_ownership(connection, ref),
            self._list_members(connection, ref),
            self._list_controls(connection, ref),
            read_clock(connection),
        )

    def _snapshot_since(
        self, connection: BaseDatabaseWrapper, ref: HubRef, cursor: str | None, stale_after: float | None = None
    ) -> Changes:
        # A cursor is "<epoch>:<n>:<members>:<controls>": every row whose change number is below n was
        # read (n is the first number a writer may still hold uncommitted), and <members> and
        # <controls> are those tables' prints then (``rows.Print``: count and id sum). The bound is
        # read before the rows, so the rows read next include every row below it; rows at or past it
        # may come again next time (they cost the reading, nothing more). Leaving renewals out, the
        # ownership rows are those whose owner changed (``owner_changed``, numbered as ``changed``)
        # and those last written before ``fresh_after``, the store's clock as the bound was read less
        # ``stale_after``. The members and controls are those written since n, or all of a table's
        # when one of its rows came or went since the cursor (its print differs: a delete leaves no
        # row to list).
        #
        # The bound, the prints, the rows changed since the cursor's number, the members and the
        # controls are asked for together (``fetch_together``: on PostgreSQL one round trip, every
        # statement on the clock the bound is read with), or every row when there is no cursor. The
        # cursor is checked against the bound afterwards: a cursor of another epoch, or past the
        # bound, throws the rows away and reads every row.
        # Off PostgreSQL the store's clock is this machine's, read now (a module attribute: tests skew it).
        local = None if connection.vendor == "postgresql" else sqlclock.local_clock()
        seen = _seen(cursor)
        scope = [ref.namespace, ref.hub, ref.consumer_group]
        statements = [
            (_clock_sql(connection), scope * 3),  # the prints' scopes, then the clock row's
            _ownership_statement(connection, ref, seen, stale_after, local),
            MEMBERS.statement(connection, ref, seen),
            CONTROLS.statement(connection, ref, seen),
        ]
        found, listed, members, controls = sqlrows.fetch_together(connection, statements)
        if not found:  # the hub's clock row is missing: made (with a fresh epoch), then read again
            self._make_clock(ref)
            return self._snapshot_since(connection, ref, cursor, stale_after)
        *bound_read, members_print, controls_print = found[0]
        epoch, bound, clock = _epoch_and_bound(tuple(bound_read), local)
        since = _since(cursor, epoch, bound)
        printed = [str(members_print), str(controls_print)]
        every = [since is None or p != was for p, was in zip(printed, _prints(cursor), strict=True)]
        whole = seen is None
        return Changes(
            self._ownership_since(connection, ref, listed, since is None, whole),
            self._small_since(MEMBERS, connection, ref, sqlrows.member, members, every[0], whole),
            self._small_since(CONTROLS, connection, ref, sqlrows.control, controls, every[1], whole),
            clock,
            ":".join((epoch, str(bound), *printed)),
            since is None,  # the clock as the bound was read: no statement more
            sees_every_write=True,  # a row written by hand changes the epoch (migrations 0005, 0008)
            fresh_after=None if since is None or stale_after is None else clock - stale_after,
            members_full=every[0],
            controls_full=every[1],
        )

    def _ownership_since(
        self, connection: BaseDatabaseWrapper, ref: HubRef, found: list[tuple[Any, ...]], every: bool, read_whole: bool
    ) -> list[OwnershipRecord]:
        """The ownership rows a delta lists (``found``), or ``every`` row: ``found`` if it was
        ``read_whole``, else read now (the rows since the cursor's number are of no use)."""
        if every and not read_whole:
            found = OWNERSHIP.fetch(connection, ref)
        rows = OWNERSHIP.rows(connection, found)
        return sorted(self._valid(OWNERSHIP, rows, ref, sqlrows.ownership, whole=every), key=by_partition)

    def _small_since(
        self,
        listing: Listing,
        connection: BaseDatabaseWrapper,
        ref: HubRef,
        convert: Callable[[Any, HubRef, list[str]], T],
        found: list[tuple[Any, ...]],
        every: bool,
        read_whole: bool,
    ) -> list[T]:
        """The members or controls a delta lists (``found``: those written since its cursor's number),
        or ``every`` one: ``found`` if it was ``read_whole``, else read now."""
        if every:
            return self._small(listing, connection, ref, convert, found if read_whole else None)
        return self._valid(listing, listing.rows(connection, found), ref, convert, whole=False)

    def _list_ownership(self, connection: BaseDatabaseWrapper, ref: HubRef) -> list[OwnershipRecord]:
        records = self._valid(OWNERSHIP, OWNERSHIP.read(connection, ref), ref, sqlrows.ownership)
        return sorted(records, key=by_partition)

    def _list_members(self, connection: BaseDatabaseWrapper, ref: HubRef) -> list[Member]:
        return self._small(MEMBERS, connection, ref, sqlrows.member)

    def _list_controls(self, connection: BaseDatabaseWrapper, ref: HubRef) -> list[Control]:
        return self._small(CONTROLS, connection, ref, sqlrows.control)


def _seen(cursor: str | None) -> int | None:
    """The change number a cursor names, whatever its epoch (``_since`` judges it)."""
    seen = (cursor or "").split(":")[1:2]
    return int(seen[0]) if seen and seen[0].isdigit() else None


def _prints(cursor: str | None) -> tuple[str | None, str | None]:
    """The members' and the controls' prints a cursor names (``rows.Print``), if any."""
    parts = (cursor or "").split(":")
    return (parts[2], parts[3]) if len(parts) == 4 else (None, None)


def _ownership_statement(
    connection: BaseDatabaseWrapper, ref: HubRef, seen: int | None, stale_after: float | None, local: float | None
) -> tuple[str, list[Any]]:
    """The ownership rows a read from change number ``seen`` asks for (every row without one)."""
    if seen is None or stale_after is None:
        return OWNERSHIP.statement(connection, ref, seen)
    if local is None:
        return OWNERSHIP.statement(connection, ref, seen, stale_after=stale_after)
    return OWNERSHIP.statement(connection, ref, seen, written_before=local - stale_after)


def _epoch_and_bound(found: tuple[Any, ...], clock: float | None) -> tuple[str, int, float]:
    """The epoch of a hub's change numbers, the first number a writer may still hold uncommitted
    (on PostgreSQL the oldest transaction id still running: ``Claims._clock_and_transaction_id``; elsewhere
    the hub's counter plus one) and the store's clock, from the hub's row as ``_clock_sql`` reads
    it (on PostgreSQL with the clock; elsewhere ``clock`` is the local clock, read before)."""
    if clock is None:
        epoch, number, now = found
        return str(epoch), int(number), float(now)
    epoch, number = found
    return str(epoch), int(number) + 1, clock


def _since(cursor: str | None, epoch: str, bound: int) -> int | None:
    """The change number a delta read from ``cursor`` starts at, if the cursor is of the hub's current
    ``epoch`` and not past ``bound`` (None, read all: a clock row made again, rows deleted or edited by
    hand since, a database restored with transaction ids that went back)."""
    seen_epoch = (cursor or "").split(":")[0]
    seen = _seen(cursor)
    if seen_epoch != epoch or seen is None or seen > bound:
        return None
    return seen


_CLOCK_SQL: dict[str, str] = {}


def _clock_sql(connection: BaseDatabaseWrapper) -> str:
    """The hub's change-number epoch and bound (``_epoch_and_bound``) and the members' and controls'
    prints (``rows.Print``), written once per vendor."""
    vendor, quote = connection.vendor, connection.ops.quote_name
    if vendor not in _CLOCK_SQL:
        if vendor == "postgresql":  # the bound, and the clock as it is read
            number = f"pg_snapshot_xmin(pg_current_snapshot())::text::bigint, {PG_CLOCK}"
        else:
            number = quote("serial")
        scope = " AND ".join(f"{quote(column)} = %s" for column in ("namespace", "hub", "consumer_group"))
        table = quote(OwnershipClock._meta.db_table)
        prints = f"{MEMBER_PRINT.sql(connection)}, {CONTROL_PRINT.sql(connection)}"
        _CLOCK_SQL[vendor] = f"SELECT {quote('epoch')}, {number}, {prints} FROM {table} WHERE {scope}"
    return _CLOCK_SQL[vendor]
