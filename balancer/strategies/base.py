"""What every strategy plans over and what it returns.

A strategy is a pure function ``plan(view, rng) -> Plan``: time, randomness, the worker's id and
the store's view come in as arguments; nothing inside reads a clock or the global ``random``.
The runtime, the simulator and the property tests all call the same function.
"""

from __future__ import annotations

import math
import random
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..model import EventKind, OwnershipRecord


@dataclass(frozen=True, slots=True)
class View:
    """Everything one worker knows at the start of a cycle."""

    owner_id: str
    partition_ids: tuple[str, ...]
    ownership: Mapping[str, OwnershipRecord]  # by partition id; may lack never-owned partitions
    now: float  # the clock expiry is judged by (the worker's or the store's, per strategy)
    expiry: float  # seconds without renewal after which a record is free
    members: frozenset[str] = frozenset()  # live workers by heartbeat (may own nothing yet)
    drained: frozenset[str] = frozenset()
    pins: Mapping[str, str] = field(default_factory=dict)  # partition id -> the only allowed owner
    # partition id -> when (same clock as ``now``) this worker began waiting for its current owner to
    # hand it over; filled by the coordinator from earlier plans' ``Plan.waiting``
    waiting: Mapping[str, float] = field(default_factory=dict)
    handoff_timeout: float | None = None  # how long to wait for a handoff before taking over; None: expiry
    first_cycle: bool = False  # this worker has not announced itself before this cycle
    # Spans (from, to) on the clock of ``now`` during which this worker could not reach the store:
    # nobody could renew then, so they do not count toward the age of a record or a heartbeat.
    dark: tuple[tuple[float, float], ...] = ()
    # ``now`` is the store's own clock (the strategy's ``store_clock``): a time written by the store
    # cannot lie ahead of it by more than the expiry, so one that does is corrupt, not early.
    clock_is_store: bool = False
    heartbeats: Mapping[str, float] = field(default_factory=dict)  # owner id -> last heartbeat (members')
    # Members that have announced themselves and not yet run a cycle after it (``cooperative.unproven``)
    unready: frozenset[str] = frozenset()
    interval: float | None = None  # seconds between this fleet's cycles, when the coordinator knows it
    # partition id -> its active owner in this worker's previous view: who released a free partition
    previous: Mapping[str, str] = field(default_factory=dict)
    # partition id -> measured events per second, as the owners published them (``balancer.load``):
    # the same for every worker that read the same store state. Filled for strategies that use load.
    loads: Mapping[str, float] = field(default_factory=dict)
    # From a change feed that leaves renewals out (``balancer.changes``): every record of ``ownership``
    # but those in ``exact`` was written at or after ``fresh_after`` (the store's clock), whatever
    # older time it shows, so it is judged by that time. None: every record shows its last write.
    fresh_after: float | None = None
    exact: frozenset[str] = frozenset()
    # owner id -> partitions it will not take for now (it gave them up, stuck on it: ``balancer.avoid``),
    # this worker's own included. Honoured by ``cooperative``'s plan.
    avoided: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def modified(self, record: OwnershipRecord) -> float | None:
        """When ``record`` was last written, as far as this view can tell (see ``fresh_after``)."""
        return modified(record, self.fresh_after, self.exact)

    def age(self, at: float | None) -> float:
        """Seconds since ``at`` on the clock of ``now``, not counting dark time (see ``age``)."""
        return age(at, self.now, self.dark, self.expiry if self.clock_is_store else None)

    def corrupt(self, record: OwnershipRecord) -> bool:
        """True for a held record whose ``last_modified`` no store wrote: not a number, or (on the
        store's clock) ahead of it by more than the expiry. Such a record counts as expired."""
        at = record.last_modified
        if not record.owner_id:
            return False
        return at is None or not math.isfinite(at) or (self.clock_is_store and at - self.now > self.expiry)

    def active(self) -> dict[str, OwnershipRecord]:
        """Records of partitions of this hub held by someone whose lease has not expired."""
        known = set(self.partition_ids)
        if self.dark:
            return {
                p: r
                for p, r in self.ownership.items()
                if p in known and r.owner_id and self.age(self.modified(r)) <= self.expiry
            }
        # ``age`` inlined for the usual case, no dark time (every record, every cycle): alive while its
        # age is at most the expiry; never for a time that is None or not a number, nor on the store's
        # clock for one ahead of it by more than the expiry.
        now, expiry = self.now, self.expiry
        ahead = expiry if self.clock_is_store else sys.float_info.max
        floor, exact, inf = self.fresh_after, self.exact, math.inf
        if floor is not None:  # ``modified`` inlined too
            return {
                p: r
                for p, r in self.ownership.items()
                if p in known
                and r.owner_id
                and (at := r.last_modified) is not None
                and -ahead <= now - (max(at, floor) if -inf < at < inf and p not in exact else at) <= expiry
            }
        return {
            p: r
            for p, r in self.ownership.items()
            if p in known and r.owner_id and (at := r.last_modified) is not None and -ahead <= now - at <= expiry
        }

    def counts(self, active: Mapping[str, OwnershipRecord]) -> Counter[str]:
        """Partitions held per active owner, with this worker present even when it holds none."""
        counts = Counter(r.owner_id for r in active.values())
        counts[self.owner_id] += 0
        return counts

    def unclaimed(self, active: Mapping[str, OwnershipRecord]) -> list[str]:
        """Partitions nobody actively holds, in id order."""
        return [p for p in self.partition_ids if p not in active]


def modified(record: OwnershipRecord, fresh_after: float | None, exact: frozenset[str]) -> float | None:
    """When ``record`` was last written, as far as a read that left renewals out can tell: its own
    time, or for a record the read did not list (not in ``exact``) at least ``fresh_after``."""
    at = record.last_modified
    if fresh_after is None or at is None or not math.isfinite(at) or record.partition_id in exact:
        return at  # a time that is no number stays what it is: never alive
    return max(at, fresh_after)


def age(at: float | None, now: float, dark: Sequence[tuple[float, float]] = (), future: float | None = None) -> float:
    """Seconds from ``at`` to ``now``, less the parts of ``dark`` in between.

    While no worker could reach the store nobody could renew a lease or write a heartbeat, so a
    record that ran out then says nothing about its holder: dark time does not age it, and after a
    store outage every live worker's records are as fresh as they were when it began. ``at`` None or
    not a number: infinitely old. With ``future`` (``now`` is the store's clock): an ``at`` ahead of
    ``now`` by more than that is not a time the store wrote, so infinitely old too.
    """
    if at is None or not math.isfinite(at) or (future is not None and at - now > future):
        return math.inf
    if not dark:  # the usual case, asked for every record every cycle
        return now - at
    unseen = sum(max(0.0, min(end, now) - max(start, at)) for start, end in dark)
    return now - at - unseen


@dataclass(frozen=True, slots=True)
class Claim:
    """One partition this worker asks the store for, and why."""

    partition_id: str
    kind: EventKind  # CLAIM, EXPIRE or STEAL
    seen: OwnershipRecord | None  # the record as listed (its ETag guards the claim); None if never owned
    reason: str

    @property
    def previous_owner(self) -> str | None:
        return self.seen.owner_id if self.seen is not None and self.seen.owner_id else None


@dataclass(frozen=True, slots=True)
class Plan:
    """What one cycle does besides renewing every partition the worker still holds."""

    claims: tuple[Claim, ...] = ()
    releases: tuple[str, ...] = ()  # partitions to hand off on purpose this cycle
    waiting: tuple[str, ...] = ()  # partitions this worker wants but waits for their owner to release
    recheck_in: float | None = None  # seconds until a partition it wants but leaves free now may be claimed


PlanFunction = Callable[[View, random.Random], Plan]


@dataclass(frozen=True, slots=True)
class Strategy:
    """A named planning function and the facts the coordinator needs to drive it."""

    name: str
    plan: PlanFunction
    store_clock: bool  # judge expiry by the store's clock (True) or the worker's own (False)
    summary: str
    uses_members: bool = False  # needs heartbeats and control records (drain, pin) in the view
    uses_load: bool = False  # needs the published rates (``View.loads``): reads checkpoints, publishes its own
    # Its plan reads time only through the ages of records and heartbeats, and stays empty while
    # nothing it reads changes but the clock, every partition is held by a live worker, and every
    # other member either holds some or is drained. The coordinator then skips it in a steady cycle
    # (``Coordinator.steady_cycles``): a quiet read that brought nothing new changes no such age
    # across the expiry, so the plan would come out empty again.
    settles: bool = False


def claim_for(view: View, partition_id: str, active: Mapping[str, OwnershipRecord]) -> Claim:
    """The claim of a partition nobody actively holds: never owned, released, or expired."""
    seen = view.ownership.get(partition_id)
    if seen is None:
        return Claim(partition_id, EventKind.CLAIM, None, "never owned")
    if not seen.owner_id:
        return Claim(partition_id, EventKind.CLAIM, seen, "released")
    assert partition_id not in active
    if view.corrupt(seen):
        ahead = (
            ""
            if seen.last_modified is None or not math.isfinite(seen.last_modified)
            else (f", {seen.last_modified - view.now:.0f}s ahead of the store's clock")
        )
        reason = f"corrupt record of {seen.owner_id}: last_modified {seen.last_modified!r}{ahead}"
        return Claim(partition_id, EventKind.EXPIRE, seen, reason)
    idle = view.age(seen.last_modified)
    return Claim(
        partition_id,
        EventKind.EXPIRE,
        seen,
        f"lease of {seen.owner_id} not renewed for {idle:.1f}s (expiry {view.expiry:g}s)",
    )
