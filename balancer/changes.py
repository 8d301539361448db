"""Reading what changed: a worker's copy of the ownership table, kept current from the store's changes.

A store that can say what changed since a worker's last read implements ``ChangeFeed``: its
``snapshot_since(ref, cursor)`` is ``SnapshotStore.snapshot`` with only the ownership records written
since ``cursor``; members and controls come whole, as they are few, unless the store can tell what
changed among them too (``Changes.members_full``, ``controls_full``: SQL numbers their writes as it
does ownership's, Redis compares a digest of each hash). Each write of an ownership record
takes a change number from a per-hub counter whose order is the order in which the writes became
visible, so "changed after the cursor" misses nothing (each adapter says how it gets that order).

``OwnershipTable`` is the worker's copy. It keeps every record, written lately or not, so expiry is
judged from it exactly as from a full listing (a record nobody writes keeps its last-modified time and
expires in the copy when it would in the store). It reads everything again (cursor None) when it
cannot trust the copy: at the first read, after a failed cycle (``forget``), when the store's counter
was reset or went backwards or records were deleted (the store answers such a cursor with a full
listing), when the store's count of records disagrees with the copy's, and every ``resync_after``
seconds (the expiry) as a safety net against writes the feed does not see (a hand edit in the
store's own tool); a feed that sees those too (SQL, by triggers) gets one every ``TRUSTED`` times that.

A reader that does not need other workers' renewals says so with ``stale_after`` (the coordinator:
most of an expiry, more than the renewal share). A store that numbers owner changes apart from other
writes (SQL: ``owner_changed``; the memory store) then leaves renewals out of a delta: it lists the
records whose owner or owner level changed since the cursor, and every record last written more
than ``stale_after`` seconds ago on its clock, with its current ETag, and says from when the others
are fresh (``Changes.fresh_after``). A live worker renews each lease well within that time, so in a
steady fleet a delta is empty, however many partitions; a record whose owner stopped is listed
again before it can be judged expired, exactly as the store holds it, so it is claimed with its
current ETag, no later than before. The copy keeps the older time of a record left out, and the
strategy's view judges it by the bound instead (``View.fresh_after``, ``View.exact``): it may think a
lease older than it is, never younger, and never old enough to be expired. A steal needs a live
record's current ETag, which the copy may not have: it loses once, and the coordinator's ETag loop
lists the records and tries again. Redis reads every write still.

A store without a feed keeps working through full listings (``balancer.protocol.snapshot``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

from balancer.model import Control, HubRef, Member, OwnershipRecord, pid_key


@dataclass(frozen=True, slots=True)
class Changes:
    """One read of a ``ChangeFeed``.

    ``ownership`` holds every record (``full``) or those written after the cursor passed (not full),
    each at most once, in the order a full listing would list them. ``cursor`` is what to pass next
    time (None: the store offers no cursor from here, so the next read is full). ``count`` is how many
    ownership records the store holds now, when it knows that cheaply (else None).
    """

    ownership: list[OwnershipRecord]
    members: list[Member]
    controls: list[Control]
    now: float  # the store's clock when it was read
    cursor: str | None
    full: bool
    count: int | None = None
    # A full listing lists records in partition id order (True), or in the order they were first
    # written (False: the in-memory store): where a record new to the copy goes.
    in_partition_order: bool = True
    # The feed sees every write, those made behind the store's back included (SQL: triggers; Redis
    # leaving renewals out: a record no script wrote lately is listed as stored), so the safety-net
    # full read can be rare (``OwnershipTable.TRUSTED``); else it comes once an expiry.
    sees_every_write: bool = False
    # A delta read with ``stale_after`` from a store that leaves renewals out (see ``ChangeFeed``):
    # every record it did not list was last written at or after this time (the store's clock), so
    # the copy's older time for it is only a lower bound of its age. None: nothing was left out.
    fresh_after: float | None = None
    # ``members`` holds every member (True: always on a full read), or those written after the cursor
    # passed (False: a store that knows which; SQL numbers member writes, Redis compares a digest).
    members_full: bool = True
    controls_full: bool = True  # the same for ``controls``


@runtime_checkable
class ChangeFeed(Protocol):
    """Optional, beside ``SnapshotStore``: a store that can read only what changed implements this."""

    async def snapshot_since(self, ref: HubRef, cursor: str | None, stale_after: float | None = None) -> Changes:
        """Members, controls, the clock and the ownership records of ``ref`` written after ``cursor``
        (from an earlier read of the same store); every record (``full``) when ``cursor`` is None or
        cannot be trusted: a store restarted or flushed, a counter reset, records deleted since.

        ``stale_after`` (seconds): the reader does not need renewals (writes that keep a record's
        owner and owner level) as long as it gets every record that may be near its expiry. A store
        that can may then leave renewals out of a delta, provided it lists every record last written
        more than ``stale_after`` seconds ago on its clock (with its current ETag: the ones the reader
        may claim by expiry) and sets ``fresh_after`` to that bound. Others ignore it."""


class OwnershipTable:
    """One worker's copy of one hub's ownership records (see the module docstring)."""

    # Times ``resync_after`` between safety-net full reads on a feed that sees every write.
    TRUSTED = 30

    def __init__(self, resync_after: float) -> None:
        self.resync_after = resync_after  # seconds (local monotonic) between full reads at most
        self._records: dict[str, OwnershipRecord] = {}
        self._members: dict[str, Member] = {}
        self._controls: dict[tuple[str, str], Control] = {}
        self._cursor: str | None = None
        self._full_at: float | None = None
        self._trusted = False  # the last read's feed sees every write
        # After a delta that left renewals out (``Changes.fresh_after``): the bound, and the records the
        # delta listed, as the store holds them now. Every other record was written at or after the
        # bound, whatever older time the copy shows (``View.fresh_after``). None: the copy is exact.
        self.fresh_after: float | None = None
        self.exact: frozenset[str] = frozenset()
        self.full_reads = 0
        self.delta_reads = 0

    def cursor(self, at: float) -> str | None:
        """The cursor to read from at local monotonic time ``at``; None when the read must be full."""
        every = self.resync_after * (self.TRUSTED if self._trusted else 1)
        if self._cursor is None or self._full_at is None or at - self._full_at >= every:
            return None
        return self._cursor

    def forget(self) -> None:
        """Distrust the copy (a failed cycle): the next read is full."""
        self._cursor = None

    def merge(self, changes: Changes, at: float) -> list[OwnershipRecord] | None:
        """The whole table after ``changes`` (read at local monotonic time ``at``), in the order a full
        listing gives; None when the result cannot be trusted (the caller reads again in full)."""
        self.fresh_after, self.exact = None, frozenset()
        self._members = _merged(self._members, changes.members, changes.members_full, _member_key)
        self._controls = _merged(self._controls, changes.controls, changes.controls_full, _control_key)
        if changes.full:
            self._records = {r.partition_id: r for r in changes.ownership}
            self._full_at = at
            self.full_reads += 1
        elif self._cursor is None:
            return None  # a delta the copy was not ready for: a store answering a None cursor with one
        else:
            self.delta_reads += 1
            if changes.fresh_after is not None:
                self.fresh_after = changes.fresh_after
                self.exact = frozenset(r.partition_id for r in changes.ownership)
            new = [r for r in changes.ownership if r.partition_id not in self._records]
            self._records.update((r.partition_id, r) for r in changes.ownership)
            if new and changes.in_partition_order:
                self._records = dict(sorted(self._records.items(), key=lambda item: pid_key(item[0])))
        self._cursor = changes.cursor
        self._trusted = changes.sees_every_write
        if changes.count is not None and changes.count != len(self._records):
            # Records were deleted (or written) past the feed: a hand edit. Read everything again.
            self.forget()
            return None
        return list(self._records.values())

    @property
    def members(self) -> list[Member]:
        """The members after the last ``merge``, by owner id (as a whole listing gives them)."""
        return list(self._members.values())

    @property
    def controls(self) -> list[Control]:
        """The controls after the last ``merge``, by kind and target (as a whole listing gives them)."""
        return list(self._controls.values())

    @property
    def records(self) -> Sequence[OwnershipRecord]:
        return list(self._records.values())

    @property
    def by_partition(self) -> Mapping[str, OwnershipRecord]:
        """The copy itself, by partition id, in the order ``merge`` lists it: read it, never change it,
        and not past the next ``merge``."""
        return self._records


K = TypeVar("K", str, tuple[str, str])
V = TypeVar("V")


def _merged(kept: dict[K, V], listed: list[V], whole: bool, key: Callable[[V], K]) -> dict[K, V]:
    """A small table's copy (members, controls) after a read that listed it ``whole`` or only the rows
    written since the cursor, in key order."""
    if whole:
        return {key(row): row for row in listed}
    new = any(key(row) not in kept for row in listed)
    kept.update((key(row), row) for row in listed)
    return dict(sorted(kept.items(), key=lambda item: item[0])) if new else kept


def _member_key(member: Member) -> str:
    return member.owner_id


def _control_key(control: Control) -> tuple[str, str]:
    return (str(getattr(control.kind, "value", control.kind)), control.target)


@dataclass(frozen=True, slots=True)
class Read:
    """What ``read`` gives: the last ``Changes`` read, the whole table after them (None: the copy could
    not be trusted even after a full read), the store requests and the ownership records read."""

    changes: Changes
    ownership: list[OwnershipRecord] | None
    requests: int
    rows: int


async def read(
    feed: ChangeFeed,
    ref: HubRef,
    table: OwnershipTable,
    monotonic: Callable[[], float],
    stale_after: float | None = None,
) -> Read:
    """Bring ``table`` up to date from ``feed``: what changed since its cursor, or everything when it
    cannot be trusted; a read that leaves it disagreeing with the store's count is done again in full
    (records were deleted past the feed). ``ownership`` None: even that one disagreed (records deleted
    while being read): the caller plans on a plain listing this once. ``stale_after``: see
    ``ChangeFeed.snapshot_since`` (the table then knows which of its records are exact)."""
    rows = requests = 0
    while True:
        at = monotonic()
        changes = await feed.snapshot_since(ref, table.cursor(at), stale_after)
        requests += 1
        rows += len(changes.ownership)
        ownership = table.merge(changes, at)
        if ownership is not None or requests == 2:
            return Read(changes, ownership, requests, rows)
