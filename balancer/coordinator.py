"""The coordinator: one worker's load-balancing cycle (list -> plan -> claim and renew -> report).

It owns no timer and no processing. The runtime calls ``cycle()`` on its own schedule (so lease
renewal never waits behind a handler) and asks ``holds()`` before handing an event on; the
simulator calls the same ``cycle()`` on simulated time. A driver that also calls ``renew()`` at
``next_renewal()`` between cycles (the runtime's loop does, and says so: ``renewal_steps``) has each
lease renewed on its own schedule, when ``renew_share`` of the expiry has passed, not at a cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from balancer.protocol import (
    Balancer,
    CheckpointStore,
    ControlStore,
    CycleReport,
    EventSink,
    HandoffHook,
    OwnershipStore,
    PartitionSource,
    Snapshot,
    by_partition,
    snapshot,
)

from . import changes, load
from .changes import ChangeFeed, OwnershipTable
from .errors import StoreUnavailable
from .model import BalancerEvent, Control, ControlKind, Controls, EventKind, HubRef, Member, OwnershipRecord, pid_key
from .notices import Released
from .strategies import Claim, Plan, Strategy, View
from .strategies.base import age, modified

T = TypeVar("T")
log = logging.getLogger("leaseboard.balancer")

# Renewal with renewal steps (``Coordinator.renewal_steps``: the driver calls ``renew()`` at
# ``next_renewal()`` between cycles): a lease is renewed once RENEW_SHARE of the expiry has passed since
# the send time of its last winning write, at that moment, whatever the balancing interval; every 6.5 s
# at a 10 s expiry, 19.5 s at 30 s. A renewal that fails (the store cannot be reached, or a cycle failed)
# is tried again RETRY_SHARE of the expiry later, the wait doubling, while the lease still holds (at
# 10 s: at 6.5, 7 and 8 s; cycles go on trying too, and the pumps pause at 10 s until one succeeds). A
# renewal also takes every lease at least GATHER as old as a due one, so leases claimed a cycle or two
# apart are renewed by one write from then on (one round trip on SQL and Redis).
RENEW_SHARE, RETRY_SHARE, GATHER = 0.65, 0.05, 0.5
EARLY = 1e-3  # seconds: a renewal step woken this much early (timer resolution) still finds its lease due
# Renewal without renewal steps (cycles alone renew): a lease is renewed once half the expiry has
# passed since its last renewal, or sooner if waiting one more cycle and then failing once
# (RETRY_CYCLES late cycles, timer jitter included) could let it lapse. At the defaults (10 s interval,
# 30 s expiry) that is every cycle; at 2 s and 10 s every third. With no interval known, every cycle.
RETRY_CYCLES, LATE = 2, 1.1
# Reading what changed (``balancer.changes``) without other workers' renewals: a store that can leaves
# them out, and lists instead every record not written for STALE_SHARE of the expiry (at least 0.1
# more than the renewal share, at most 0.9), so a record a live worker renews is never read again
# while one whose owner stopped is read, with its current ETag, before it can be judged expired.
STALE_SHARE, STALE_MAX = 0.85, 0.9


@dataclass
class _Lease:
    record: OwnershipRecord
    renewed_at: float  # local monotonic time the winning request was *sent*


@dataclass(frozen=True, slots=True)
class _Settled:
    """What a cycle read when its plan came out empty with every partition held (``Strategy.settles``):
    the next cycle skips its plan if it reads the same and nothing else changed (``steady_cycles``)."""

    partition_ids: tuple[str, ...]
    members: tuple[Member, ...]
    controls: tuple[Control, ...]
    holders: frozenset[str]  # the members that held a live lease
    leases: frozenset[str]  # what this worker held


_NOTHING = Plan()


@dataclass
class Coordinator:
    """Balances one worker's share of one hub and consumer group."""

    ref: HubRef
    owner_id: str
    store: OwnershipStore
    partitions: PartitionSource
    strategy: Strategy
    expiry: float = 60.0
    controls: ControlStore | None = None
    on_event: EventSink | None = None
    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], float] = time.time  # the worker's wall clock (strategies that use it)
    monotonic: Callable[[], float] = time.monotonic  # for the local lease deadline
    etag_retries: int = 3
    # Called with a partition id when a planned move starts: the runtime stops that partition's pump
    # after the event in hand, checkpoints, then calls ``release()``. None: release in the same cycle.
    on_handoff: HandoffHook | None = None
    handoff_timeout: float | None = None  # None: the expiry
    interval: float | None = None  # seconds between the driver's cycles (None: unknown)
    # Told the partitions this worker has just released (won releases only), so the worker waiting
    # for them hears of it at once (``balancer.notices``) instead of at its next cycle.
    on_released: Callable[[Released], None] | None = None
    # Where a load-weighted strategy (``Strategy.uses_load``) reads the checkpoints it measures rates
    # from (``balancer.load``); None: the ownership store, if it keeps checkpoints too.
    checkpoints: CheckpointStore | None = None
    # The driver calls ``renew()`` at ``next_renewal()`` between cycles: leases are renewed when
    # ``renew_share`` of the expiry has passed (see RENEW_SHARE), by those steps and by any cycle that
    # finds one due. False: cycles alone renew, each lease in the last cycle that is safely early.
    renewal_steps: bool = False
    renew_share: float = RENEW_SHARE
    # A steady cycle skips the plan: with a strategy whose plan ``settles``, when the last plan was
    # empty with every partition held, and this cycle's read (a quiet delta: ``STALE_SHARE``) listed
    # no ownership record and the same members, controls and partitions, while this worker holds
    # what it held, waits for nothing and hands nothing off, and no cycle failed within the expiry.
    # Nothing the plan reads then changed but the clock, and no age crossed the expiry: every record
    # the delta left out was written within ``stale_after``. At 1024 partitions the plan and the
    # view's judgement of every record were most of an idle worker's CPU. False: plan every cycle.
    steady_cycles: bool = True
    # Tell the others when this worker joins (after its first cycle): a notice naming no partition
    # (``on_released``), which a worker waiting quietly (``quiet_until``) hears as news. Off where
    # nobody waits quietly (the simulator: its workers cycle every interval).
    announce_joining: bool = False
    _leases: dict[str, _Lease] = field(default_factory=dict, init=False)
    _requests: int = field(default=0, init=False)
    _announced: bool = field(default=False, init=False)
    _waiting: dict[str, float] = field(default_factory=dict, init=False)
    _waiting_on: dict[str, str] = field(default_factory=dict, init=False)  # partition -> the holder waited for
    # Local monotonic send time of the last write that showed this worker alive to the others (a
    # heartbeat, a won claim or renewal). A gap longer than the expiry restarts every handoff wait.
    _proved_at: float | None = field(default=None, init=False)
    _rebalance_token: str | None = field(default=None, init=False)
    _rebalance: bool = field(default=False, init=False)
    _handing_off: set[str] = field(default_factory=set, init=False)
    # Dark time: spans on the view's clock between the last view read before a failed cycle and the
    # next one read after it. Nobody could renew then, so they do not age records (View.dark).
    _dark: list[tuple[float, float]] = field(default_factory=list, init=False)
    _last_view: float | None = field(default=None, init=False)
    _failed: bool = field(default=False, init=False)
    # (store time, local monotonic time) of the latest store clock reading: events are stamped with
    # the store's clock from it, whatever this worker's own clock says.
    _anchor: tuple[float, float] | None = field(default=None, init=False)
    _previous: dict[str, str] = field(default_factory=dict, init=False)  # the last active owner seen
    # cycle(), release() and release_all() each read and rewrite the lease table across awaits: a
    # release sent while a cycle's renewal is in flight would lose to it (the renewal moves the ETag)
    # and leave the store saying we own a partition we have forgotten. One at a time, then.
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    _heartbeat_at: float | None = field(default=None, init=False)  # local monotonic time of the last one
    # This worker's copy of the ownership table, kept current from what changed (``balancer.changes``)
    # on a store that can say; read in full at least once an expiry, as a safety net.
    _table: OwnershipTable = field(default_factory=lambda: OwnershipTable(60.0), init=False)
    # This cycle's read left renewals out (``View.fresh_after``, ``View.exact``); None: it did not.
    _fresh_after: float | None = field(default=None, init=False)
    _exact: frozenset[str] = field(default=frozenset(), init=False)
    _rows: int = field(default=0, init=False)  # ownership records read in this cycle
    _meter: load.RateMeter = field(default_factory=load.RateMeter, init=False)
    _published: dict[str, float] = field(default_factory=dict, init=False)  # rates in this worker's member info
    _retry_at: float | None = field(default=None, init=False)  # local monotonic time to retry a failed renewal
    _renew_failures: int = field(default=0, init=False)  # failed renewals in a row
    _settled: _Settled | None = field(default=None, init=False)
    _quiet_empty: bool = field(default=False, init=False)  # this cycle's read: a quiet delta that listed nothing
    _read: tuple[tuple[Member, ...], tuple[Control, ...], frozenset[str]] | None = field(default=None, init=False)
    _steady: bool = field(default=False, init=False)  # this cycle skips its plan
    _read_at: float | None = field(default=None, init=False)  # local monotonic time the last read was sent

    def __post_init__(self) -> None:
        if not 0 < self.renew_share < 1:  # also refuses NaN
            raise ValueError(
                f"renew_share is the share of the lease expiry after which a lease is renewed: more than 0 "
                f"and less than 1, got {self.renew_share!r}"
            )
        self._table.resync_after = self.expiry
        if self.controls is None and self.strategy.uses_members and isinstance(self.store, ControlStore):
            self.controls = self.store
        if self.checkpoints is None and self.strategy.uses_load and isinstance(self.store, CheckpointStore):
            self.checkpoints = self.store
        if self.interval is not None:  # a rate spans three cycles' checkpoints, and half a minute at least
            self._meter.window = max(3 * self.interval, self._meter.window)

    # queries -------------------------------------------------------------------------------

    @property
    def owned(self) -> frozenset[str]:
        return frozenset(self._leases)

    def handing_off(self, partition_id: str) -> bool:
        """True once a planned move of ``partition_id`` started and until it is released."""
        return partition_id in self._handing_off

    def holds(self, partition_id: str) -> bool:
        """True while this worker owns ``partition_id`` and its lease cannot have expired yet.

        Judged on the local monotonic clock from the moment the last winning claim or renewal was
        sent, so a worker that was stopped (SIGSTOP, a long GC pause) knows on waking, before it
        touches another event, that someone else may hold the partition now.
        """
        lease = self._leases.get(partition_id)
        return lease is not None and self.monotonic() - lease.renewed_at < self.expiry

    def deadline(self, partition_id: str) -> float:
        """The local monotonic time from which ``holds(partition_id)`` is False unless renewed meanwhile
        (-inf when not held): lets a pump check its lease per event with one clock read."""
        lease = self._leases.get(partition_id)
        return -math.inf if lease is None else lease.renewed_at + self.expiry

    def next_renewal(self) -> float | None:
        """The local monotonic time at which ``renew()`` next has a lease to renew (perhaps already
        past), or None: none held that still holds. A lease whose deadline passed is left to the cycles,
        which renew it with the ETag it had if nobody took it meanwhile."""
        now, times = self.monotonic(), []
        for lease in self._leases.values():
            at = self._due_at(lease) if self._retry_at is None else max(self._due_at(lease), self._retry_at)
            if now - lease.renewed_at < self.expiry and at < lease.renewed_at + self.expiry:
                times.append(at)
        return min(times, default=None)

    def quiet_until(self, interval: float | None = None) -> float | None:
        """While nothing changes, the local monotonic time by which the next cycle must read the store,
        or None: read at the next interval. Set after a steady cycle (``steady_cycles``: its read was a
        quiet delta that listed no record), when the interval is known (``interval``, else the one the
        coordinator was given).

        Every record that read left out was written within ``stale_after`` of it, so none can expire
        before ``expiry - stale_after`` after it. A read by then plus one interval still finds a lease
        whose holder stopped within one interval of its expiry, as reading every interval does. At a
        2 s interval and a 10 s expiry that is 3.5 s; at the defaults (10 s, 30 s), 14.5 s.

        Waiting that long is only for a driver that hears of every other change at once: joins
        (``announce_joining``), releases (``on_released``), operators' controls (their wake-up). A
        notice it misses costs at most this wait instead of one interval."""
        interval = self.interval if interval is None else interval
        if not self._steady or self._read_at is None or interval is None:
            return None
        return self._read_at + self.expiry - self._stale_after() + interval

    # the cycle -----------------------------------------------------------------------------

    async def cycle(self) -> CycleReport:
        """Run one load-balancing cycle. Raises StoreUnavailable (holding on to current leases)."""
        async with self._lock:
            return await self._guarded(self._cycle())

    async def _cycle(self) -> CycleReport:
        started = self.monotonic()
        self._absent_until(started)  # before the view carries the handoff waits into the plan
        self._requests = self._rows = 0
        pids = tuple(await self.partitions())
        view = await self._view(pids)
        listed, now = view.ownership, view.now
        if self._steady:
            plan = _NOTHING  # what the plan would say (``steady_cycles``); the last active owners stand
        else:
            plan = self.strategy.plan(view, self.rng)
            active = view.active()
            self._previous.update((p, r.owner_id) for p, r in active.items())
            self._settled = self._settles(view, plan, active)
        first, self._announced = not self._announced, True
        # The handoff timeout runs per holder: a partition that changed hands meanwhile (its holder's
        # lease ran out and a third worker took it) is waited for afresh, not taken from the new
        # holder at once on the old holder's account.
        self._waiting = {p: view.waiting.get(p, now) for p in plan.waiting}
        self._waiting_on = {p: listed[p].owner_id for p in plan.waiting if p in listed}

        lost = self._drop_taken(listed)
        releases = self._start_handoffs([p for p in plan.releases if p in self._leases])
        renewing = self._renewing(self.monotonic()) - set(releases)
        requests: list[OwnershipRecord] = [self._leases[p].record for p in self._leases if p in renewing]
        requests += [replace(self._leases[p].record, owner_id="") for p in releases]
        claims = {c.partition_id: c for c in plan.claims if c.partition_id not in self._leases}
        requests += [self._claim_record(c) for c in claims.values()]

        sent_at = self.monotonic()
        won = by_partition(await self._call(self.store.claim_ownership(requests))) if requests else {}
        failed = [r for r in requests if r.partition_id not in won]
        if failed:
            # A write lost: the record had changed since the copy was read, perhaps behind the store's
            # back (a hand edit no change feed sees). The next read is whole.
            self._table.forget()
            won.update(await self._retry(failed, claims, sent_at))

        stamp = self._stamp(list(won.values()))
        held = bool(self._leases)
        gained, lost2, released = self._apply(won, claims, releases, renewing, sent_at, stamp)
        self._handing_off &= set(self._leases)
        if held and not self._leases and self.controls is not None:
            await self._heartbeat(self._stamp())  # alive by its leases until now: by a heartbeat from now on
        report = CycleReport(
            owned=self.owned,
            gained=tuple(gained),
            lost=tuple(lost + lost2 + released),
            requests=self._requests,
            seconds=self.monotonic() - started,
            rebalance=self._rebalance,
            announced=first,
            waiting=tuple(p for p in plan.waiting if p not in self._leases),
            rows=self._rows,
            planned=not self._steady,
        )
        for event in report.gained + report.lost:
            self._emit(event)
        self._announce([e.partition_id for e in released])
        if first and self.announce_joining and self.on_released is not None:
            self.on_released(Released(self.ref, (), self.owner_id))  # joined: news for the quiet
        return report

    async def release(self, partition_id: str, reason: str = "handed off") -> BalancerEvent | None:
        """Give one held partition up now (the end of a handoff: the event's ``handoff`` is True); None
        if it was not held."""
        events = await self.release_many([partition_id], reason)
        return events[0] if events else None

    async def release_many(self, partition_ids: Sequence[str], reason: str = "handed off") -> list[BalancerEvent]:
        """Give the held ones of ``partition_ids`` up now in one store request (the ends of handoffs
        that finished together); their events, in the order given. A worker handing over a hundred
        partitions at once (a cold start, a scale-out) makes one request, not a hundred one after the
        other, each holding the lock its renewals wait for."""
        async with self._lock:
            return await self._release(partition_ids, reason)

    async def _release(self, partition_ids: Sequence[str], reason: str) -> list[BalancerEvent]:
        leases = {p: self._leases.pop(p) for p in dict.fromkeys(partition_ids) if p in self._leases}
        self._handing_off.difference_update(partition_ids)
        if not leases:
            return []
        try:
            won, events = await self._write_releases(leases, reason, handoff=True)
        except StoreUnavailable:
            # Nothing changed in the store: the leases are still ours. Keep them, so the next cycle
            # renews them and plans the handoffs again, rather than leave them unowned until they expire.
            self._leases.update(leases)
            raise
        for event in events:
            self._emit(event)
        if not self._leases and self.controls is not None:
            with contextlib.suppress(StoreUnavailable):  # the next cycle heartbeats anyway
                await self._heartbeat(self._stamp())  # alive by its leases until now: by a heartbeat from now on
        if won:
            self._announce(list(won))
        return events

    async def release_all(self, reason: str = "shutting down") -> list[BalancerEvent]:
        """Give every held partition up at once, so others take them now rather than after expiry."""
        async with self._lock:
            return await self._release_all(reason)

    async def _release_all(self, reason: str) -> list[BalancerEvent]:
        if not self._leases:
            return []
        won, events = await self._write_releases(self._leases, reason, handoff=False)
        self._leases.clear()
        self._handing_off.clear()
        if self.controls is not None:
            await self._call(self.controls.remove_member(self.ref, self.owner_id))
        for event in events:
            self._emit(event)
        self._announce(list(won))
        return events

    async def _write_releases(
        self, leases: dict[str, _Lease], reason: str, *, handoff: bool
    ) -> tuple[dict[str, OwnershipRecord], list[BalancerEvent]]:
        """Release ``leases`` in one store request: the records won, and an event per lease (RELEASE, or
        LOST where another worker had taken it), in their order, not emitted yet. Raises what the
        store raises, having changed nothing here."""
        records = [replace(lease.record, owner_id="") for lease in leases.values()]
        won = by_partition(await self._call(self.store.claim_ownership(records)))
        if len(won) < len(leases):
            self._table.forget()  # a record changed behind this worker's copy: read it all next time
        stamp = self._stamp(list(won.values()))
        events = [
            self._event(EventKind.RELEASE, pid, None, reason, stamp, handoff=handoff)
            if pid in won
            else self._event(EventKind.LOST, pid, None, "taken by another worker before the release", stamp)
            for pid in leases
        ]
        return won, events

    # renewal steps -------------------------------------------------------------------------

    async def renew(self) -> CycleReport:
        """Renew the leases due now (``next_renewal()``), between cycles: one conditional write per
        lease with the ETag this worker holds, no listing, no plan. Raises StoreUnavailable (holding on
        to the leases, to be tried again at ``next_renewal()``). The report names the leases lost
        (another worker's write moved the ETag) and the requests spent."""
        async with self._lock:
            return await self._guarded(self._renew())

    async def _guarded(self, step: Awaitable[CycleReport]) -> CycleReport:
        """Run a cycle or a renewal step (under the lock): on failure, note an outage, read the table
        in full next time (whatever the step missed) and schedule the renewal's retry."""
        try:
            report = await step
        except Exception as exc:
            self._failed = self._failed or isinstance(exc, StoreUnavailable)
            self._table.forget()
            self._renewal_failed()
            raise
        self._renewal_worked()
        return report

    async def _renew(self) -> CycleReport:
        started = self.monotonic()
        self._requests = self._rows = 0
        renewing = self._renewing(self.monotonic())
        if not renewing:
            return CycleReport(owned=self.owned)
        requests = [self._leases[p].record for p in self._leases if p in renewing]
        sent_at = self.monotonic()
        won = by_partition(await self._call(self.store.claim_ownership(requests)))
        failed = [r for r in requests if r.partition_id not in won]
        if failed:
            self._table.forget()  # as in a cycle: the record changed behind this worker's copy
            won.update(await self._retry(failed, {}, sent_at))
        stamp = self._stamp(list(won.values()))
        held = bool(self._leases)
        _, lost, _ = self._apply(won, {}, [], renewing, sent_at, stamp)
        self._handing_off &= set(self._leases)
        if held and not self._leases and self.controls is not None:
            await self._heartbeat(self._stamp())  # alive by its leases until now: by a heartbeat from now on
        report = CycleReport(
            owned=self.owned, lost=tuple(lost), requests=self._requests, seconds=self.monotonic() - started,
            rows=self._rows,
        )
        for event in report.lost:
            self._emit(event)
        return report

    def _due_at(self, lease: _Lease) -> float:
        return lease.renewed_at + self.renew_share * self.expiry

    def _renewing(self, at: float) -> set[str]:
        """The held partitions to renew in a request sent at ``at`` (local monotonic time)."""
        if not self.renewal_steps:
            return {p for p, lease in self._leases.items() if self._renewal_due(lease, at)}
        due = {p for p, lease in self._leases.items() if at + EARLY >= self._due_at(lease)}
        if not due:
            return due
        gather = GATHER * self.renew_share * self.expiry
        return due | {p for p, lease in self._leases.items() if at - lease.renewed_at >= gather}

    def _renewal_failed(self) -> None:
        """A renewal (or a cycle, which may have carried one) failed: try again after a backoff."""
        self._renew_failures += 1
        backoff = RETRY_SHARE * 2 ** min(self._renew_failures - 1, 10) * self.expiry
        self._retry_at = self.monotonic() + backoff

    def _renewal_worked(self) -> None:
        self._renew_failures, self._retry_at = 0, None

    # helpers -------------------------------------------------------------------------------

    async def _view(self, pids: tuple[str, ...]) -> View:
        """The strategy's view; with heartbeats and controls when the strategy uses them."""
        members: frozenset[str] = frozenset()
        heartbeats: dict[str, float] = {}
        drained: frozenset[str] = frozenset()
        pins: dict[str, str] = {}
        self._steady, self._read = False, None
        if self.controls is not None and self.strategy.uses_members:
            snap, requests, copy = await self._snapshot(self.controls)
            self._requests += requests
            listed, now = copy if copy is not None else by_partition(snap.ownership), snap.now
            self._seen_store_time(now)
            dark = self._darkness(now)
            listed_members = snap.members
            if self.strategy.uses_load:
                listed_members = await self._measure(snap, now)
            elif self._heartbeat_due():
                await self._heartbeat(now)
            heartbeats = {m.owner_id: m.last_seen for m in snap.members if age(m.last_seen, now, dark) <= self.expiry}
            # A worker that has announced itself and holds a live lease is a member, heartbeat or not
            # (it renews its leases instead); an owner that never announced itself (a phantom or
            # hand-edited record) is none: its partitions go to the members.
            read = (tuple(snap.members), tuple(snap.controls))
            self._steady = self._steady_read(pids, read, dark)
            if self._steady:
                assert self._settled is not None
                holders = self._settled.holders  # the same records, all still live
            else:
                known = {m.owner_id for m in snap.members}
                holders = frozenset(
                    r.owner_id for r in listed.values()
                    if r.owner_id in known and age(self._modified(r), now, dark, self.expiry) <= self.expiry
                )  # fmt: skip
            self._read = (*read, holders)
            members = frozenset(heartbeats) | holders | {self.owner_id}
            controls = Controls.of(snap.controls)
            drained, pins = controls.drained, dict(controls.pins)
            token = next((c.value for c in snap.controls if c.kind is ControlKind.REBALANCE), None)
            # A token first seen at start is old news; one that changed since is a fresh request.
            self._rebalance = self._announced and token is not None and token != self._rebalance_token
            self._rebalance_token = token
        else:
            listed = by_partition(await self._call(self.store.list_ownership(self.ref)))
            self._rows += len(listed)
            if self.strategy.store_clock:
                now = await self._call(self.store.now())
                self._seen_store_time(now)
            else:
                now = self.clock()
            dark = self._darkness(now)
            if self.controls is not None and self._heartbeat_due():  # for the dashboard's worker list
                await self._heartbeat(now)
        return View(
            self.owner_id,
            pids,
            listed,
            now,
            self.expiry,
            members=members,
            drained=drained,
            pins=pins,
            waiting={p: since for p, since in self._waiting.items() if self._still_held_by(p, listed)},
            handoff_timeout=self.handoff_timeout,
            first_cycle=not self._announced,
            dark=dark,
            clock_is_store=self.strategy.store_clock,
            heartbeats=heartbeats,
            interval=self.interval,
            previous=self._previous,
            loads=load.published(listed_members, listed.values()) if self.strategy.uses_load else {},
            fresh_after=self._fresh_after,
            exact=self._exact,
        )

    def _steady_read(
        self, pids: tuple[str, ...], read: tuple[tuple[Member, ...], tuple[Control, ...]], dark: tuple[object, ...]
    ) -> bool:
        """Whether this cycle may skip its plan (``steady_cycles``), given what it read."""
        settled = self._settled
        return (
            settled is not None and self._quiet_empty and not dark and not self._waiting and not self._handing_off
            and pids == settled.partition_ids and read == (settled.members, settled.controls)
            and settled.leases == self._leases.keys()
        )  # fmt: skip

    def _settles(self, view: View, plan: Plan, active: Mapping[str, OwnershipRecord]) -> _Settled | None:
        """What the next cycle compares its read with to skip its plan, when this one may be the last
        to plan for a while: an empty plan, every partition held by a live worker, and every other
        member holding some or drained (a member that holds nothing drops out when its heartbeat ages,
        which changes the plan without a write). None: the next cycle plans."""
        if not (self.steady_cycles and self.strategy.settles and not self.strategy.uses_load) or self._read is None:
            return None
        if plan != _NOTHING or view.first_cycle or self._rebalance or view.dark:
            return None
        if len(active) != len(view.partition_ids):
            return None
        members, controls, holders = self._read
        idle = {m.owner_id for m in members} - holders - view.drained - {self.owner_id}
        if idle:
            return None
        return _Settled(view.partition_ids, members, controls, holders, frozenset(self._leases))

    def _modified(self, record: OwnershipRecord) -> float | None:
        """``View.modified`` for this cycle's read (a record a quiet delta left out: at least its bound)."""
        return modified(record, self._fresh_after, self._exact)

    async def _measure(self, snap: Snapshot, now: float) -> list[Member]:
        """Read the checkpoints into this worker's rate meter; publish the rates of the partitions it
        holds when they changed (``balancer.load``), with the heartbeat if one is due anyway. Returns
        the members as the store has them now (this worker's with what it just published)."""
        if self.checkpoints is not None:
            self._meter.observe(await self._call(self.checkpoints.list_checkpoints(self.ref)))
        current = load.published(snap.members, snap.ownership)
        rates = self._meter.to_publish(self._leases, current, now)
        covered = load.held_and_published(snap.members, snap.ownership)  # those given up: until then
        rates |= {p: r for p, r in self._published.items() if p not in rates and p not in covered}
        if not self._heartbeat_due() and rates == self._published:
            return snap.members
        self._published = rates
        await self._heartbeat(now)
        return [m for m in snap.members if m.owner_id != self.owner_id] + [self._member(now)]

    async def _snapshot(self, controls: ControlStore) -> tuple[Snapshot, int, Mapping[str, OwnershipRecord] | None]:
        """This cycle's snapshot and the store requests it took: on a store with a change feed, what
        changed since the last read merged into this worker's copy (read in full when the copy cannot
        be trusted: ``OwnershipTable``), and the copy by partition; else the whole snapshot, and None."""
        store: object = self.store
        requests = 0
        self._fresh_after, self._exact, self._quiet_empty = None, frozenset(), False
        self._read_at = self.monotonic()
        if store is controls and isinstance(store, ChangeFeed):
            done = await changes.read(store, self.ref, self._table, self.monotonic, self._stale_after())
            self._rows += done.rows
            requests = done.requests
            if done.ownership is not None:
                found = done.changes
                self._fresh_after, self._exact = self._table.fresh_after, self._table.exact
                self._quiet_empty = not found.full and not found.ownership and self._fresh_after is not None
                snap = Snapshot(done.ownership, found.members, found.controls, found.now)
                return snap, requests, self._table.by_partition
        snap, listed = await snapshot(self.store, controls, self.ref)
        self._rows += len(snap.ownership)
        return snap, requests + listed, None

    def _stale_after(self) -> float:
        """Seconds without a write after which the change feed lists a record (see STALE_SHARE)."""
        return self.expiry * min(STALE_MAX, max(STALE_SHARE, self.renew_share + 0.1))

    def _still_held_by(self, partition_id: str, listed: Mapping[str, OwnershipRecord]) -> bool:
        """Whether ``partition_id`` is still held by the worker this one started waiting for."""
        record = listed.get(partition_id)
        return record is not None and record.owner_id == self._waiting_on.get(partition_id)

    def _darkness(self, now: float) -> tuple[tuple[float, float], ...]:
        """The dark spans as of a view read at ``now``: the span since the last view read is dark if a
        cycle failed since (the store could not be reached, so nobody could renew). A span that ended
        more than the expiry ago is dropped: whatever it covers has aged past the expiry anyway."""
        if self._failed and self._last_view is not None and now > self._last_view:
            self._dark.append((self._last_view, now))
        self._failed = False
        self._last_view = now
        self._dark = [(start, end) for start, end in self._dark if now - end <= self.expiry]
        return tuple(self._dark)

    def _seen_store_time(self, at: float) -> None:
        self._anchor = (at, self.monotonic())

    def _stamp(self, won: list[OwnershipRecord] | None = None) -> float:
        """The time to stamp an event with: the store's clock (a won write's own last-modified, else
        the latest reading of the store's clock carried forward on the monotonic clock), never this
        worker's wall clock unless the store's was never read."""
        for record in won or ():
            if record.last_modified is not None and math.isfinite(record.last_modified):
                self._seen_store_time(record.last_modified)
                return record.last_modified
        if self._anchor is None:
            return self.clock()
        at, read = self._anchor
        return at + max(0.0, self.monotonic() - read)

    def _member(self, now: float) -> Member:
        """This worker's heartbeat; its info names the strategy, so the dashboard previews with it,
        and the expiry, so a reader judges the heartbeat by the fleet's expiry, not its own setting."""
        info = {"strategy": self.strategy.name, "expiry": f"{self.expiry:g}"}
        if self._published:
            info[load.INFO_KEY] = load.format_rates(self._published)
        return Member(self.ref, self.owner_id, now, info)

    def _renewal_due(self, lease: _Lease, at: float) -> bool:
        """Whether to renew ``lease`` in the cycle starting at ``at`` (local monotonic time)."""
        if self.interval is None:
            return True
        age = at - lease.renewed_at
        return age >= self.expiry / 2 or age + RETRY_CYCLES * self.interval * LATE >= self.expiry

    def _heartbeat_due(self) -> bool:
        """A worker that holds partitions is alive by its ownership records (renewed while it lives:
        ``balancer.model.signs_of_life``), so it sends no heartbeat; one that holds nothing heartbeats
        every cycle, and every worker does in its first cycle, announcing itself, its strategy and its
        expiry (the member record that makes its leases count as a live worker's)."""
        return not self._leases or self._heartbeat_at is None

    async def _heartbeat(self, now: float) -> None:
        assert self.controls is not None
        sent_at = self.monotonic()
        await self._call(self.controls.heartbeat(self._member(now)))
        self._heartbeat_at = self.monotonic()
        self._proved_alive(sent_at)

    def _proved_alive(self, sent_at: float) -> None:
        """A write sent at ``sent_at`` (local monotonic) showed this worker alive to the others."""
        self._absent_until(sent_at)
        self._proved_at = sent_at if self._proved_at is None else max(self._proved_at, sent_at)

    def _absent_until(self, at: float) -> None:
        """If nothing showed this worker alive for longer than the expiry before ``at``, the others may
        have counted it gone meanwhile: a holder may have taken back the partition it was handing over
        (released, unclaimed, claimed again), a new tenure the store cannot tell from a renewal. Every
        handoff wait then starts afresh, so the timeout never takes over a lease on the old account
        (the partition suite saw it: a receiver on a flapping link stole a lease claimed 0.3 s before)."""
        if self._proved_at is not None and at - self._proved_at > self.expiry:
            self._waiting.clear()
            self._waiting_on.clear()

    def _start_handoffs(self, planned: list[str]) -> list[str]:
        """The partitions to release in this cycle's request. With a handoff hook, a planned release
        first tells the runtime (which stops the pump, checkpoints and calls ``release``); the lease
        keeps being renewed meanwhile, so nobody else starts on it before the last checkpoint."""
        if self.on_handoff is None:
            return planned
        for pid in planned:
            if pid not in self._handing_off:
                self._handing_off.add(pid)
                self.on_handoff(pid)
        return []

    async def _call(self, awaitable: Awaitable[T]) -> T:
        self._requests += 1
        return await awaitable

    def _claim_record(self, claim: Claim) -> OwnershipRecord:
        if claim.seen is None:
            return OwnershipRecord(self.ref, claim.partition_id, self.owner_id)
        return claim.seen.claimed_by(self.owner_id)

    def _drop_taken(self, listed: Mapping[str, OwnershipRecord]) -> list[BalancerEvent]:
        """Forget leases the listing shows in someone else's hands; refresh our own ETags."""
        events = []
        for pid, lease in list(self._leases.items()):
            current = listed.get(pid)
            if current is not None and current.owner_id == self.owner_id:
                if self._fresh_after is None or pid in self._exact:  # else: its renewals were not read
                    lease.record = current
                continue
            holder = current.owner_id if current is not None and current.owner_id else None
            why = f"now held by {holder}" if holder else "record released or removed by another party"
            events.append(self._event(EventKind.LOST, pid, holder, why, self._stamp()))
            del self._leases[pid]
        return events

    async def _retry(
        self, failed: list[OwnershipRecord], claims: dict[str, Claim], sent_at: float
    ) -> dict[str, OwnershipRecord]:
        """The ETag loop of 000: while the partition's owner is still the one we meant to replace
        (it renewed, so the ETag moved), try again with the fresh ETag; stop as soon as a third
        worker holds it, which means another claimer beat us to it.

        Only steals (and our own renewals) go round the loop. A claim of an expired or released
        partition that lost because its owner renewed meanwhile found that owner alive: taking
        the fresh lease would leave two workers processing the partition until the owner's next
        cycle (the fault-injection suite saw it after a store outage, when everyone renews and
        claims at once). The next cycle plans again with what the store says then.
        """
        won: dict[str, OwnershipRecord] = {}
        pending = [r for r in failed if r.partition_id not in claims or claims[r.partition_id].kind is EventKind.STEAL]
        for _ in range(self.etag_retries if pending else 0):
            listed = by_partition(await self._call(self.store.list_ownership(self.ref)))
            self._rows += len(listed)
            again = []
            for request in pending:
                current = listed.get(request.partition_id)
                if current is None:
                    continue
                expected = self._expected_owner(request, claims)
                if current.owner_id != expected or current.etag == request.etag:
                    continue
                again.append(replace(current, owner_id=request.owner_id))
            if not again:
                break
            result = by_partition(await self._call(self.store.claim_ownership(again)))
            won.update(result)
            pending = [r for r in again if r.partition_id not in result]
            if not pending:
                break
        return won

    def _expected_owner(self, request: OwnershipRecord, claims: dict[str, Claim]) -> str:
        claim = claims.get(request.partition_id)
        if claim is not None:
            return claim.seen.owner_id if claim.seen is not None else ""
        return self.owner_id  # a renewal or a release of our own lease

    def _apply(
        self,
        won: dict[str, OwnershipRecord],
        claims: dict[str, Claim],
        releases: list[str],
        renewing: set[str],
        sent_at: float,
        now: float,
    ) -> tuple[list[BalancerEvent], list[BalancerEvent], list[BalancerEvent]]:
        if any(record.owner_id == self.owner_id for record in won.values()):
            self._proved_alive(sent_at)  # a claim or renewal of its own (a won release shows nothing)
        gained, lost, released = [], [], []
        for pid in list(self._leases):
            record = won.get(pid)
            if pid not in releases and pid not in renewing:
                continue  # not due for renewal this cycle: held as it was
            if pid in releases:
                del self._leases[pid]
                if record is not None:
                    released.append(self._event(EventKind.RELEASE, pid, None, "handed off", now, handoff=True))
                else:
                    lost.append(self._event(EventKind.LOST, pid, None, "taken before release", now))
            elif record is not None and record.owner_id == self.owner_id:
                self._leases[pid] = _Lease(record, sent_at)
            else:
                del self._leases[pid]
                lost.append(self._event(EventKind.LOST, pid, None, "renewal refused (ETag moved)", now))
        for pid, claim in claims.items():
            record = won.get(pid)
            if record is None or record.owner_id != self.owner_id:
                continue
            self._leases[pid] = _Lease(record, sent_at)
            if claim.reason.startswith("corrupt record"):
                log.warning("partition %s: replaced a %s (%s)", pid, claim.reason, self.ref)
            gained.append(
                BalancerEvent(
                    claim.kind, self.ref, pid, self.owner_id, claim.previous_owner,
                    self.owner_id, claim.reason, now,
                )
            )
        return gained, lost, released

    def _event(
        self, kind: EventKind, pid: str, new_owner: str | None, reason: str, now: float, handoff: bool = False
    ) -> BalancerEvent:
        """An event this worker reports about a lease it held (release or loss); ``handoff``: a release
        on a planned move, not a shutdown."""
        return BalancerEvent(kind, self.ref, pid, new_owner, self.owner_id, self.owner_id, reason, now, handoff)

    def _emit(self, event: BalancerEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)

    def _announce(self, released: list[str]) -> None:
        if released and self.on_released is not None:
            self.on_released(Released(self.ref, tuple(sorted(released, key=pid_key)), self.owner_id))


_IS_A_BALANCER: type[Balancer] = Coordinator  # the type checker proves it satisfies the protocol
