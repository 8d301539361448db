"""The read and the view: what one cycle reads from the stores and hands the strategy to plan with.

On a store with a change feed the read is what changed since the last one (``balancer.changes``),
merged into this worker's copy of the table. A steady cycle (``steady_cycles``) finds nothing changed
but the clock and skips its plan; after one, ``quiet_until`` says how long a driver that hears of
every other change at once may wait before reading again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from balancer import avoid, changes, load
from balancer.changes import ChangeFeed
from balancer.model import Control, ControlKind, Controls, Member, OwnershipRecord
from balancer.protocol import ControlStore, Snapshot, by_partition, snapshot
from balancer.schedule import Last, soon_after
from balancer.strategies import Plan, View
from balancer.strategies.base import age, modified

from .renewal import Renewal
from .state import NOTHING, Settled


@dataclass(frozen=True, slots=True)
class Read:
    """What one cycle read for its view: the ownership records by partition, the clock they are judged
    by and the dark spans on it; with members (``Strategy.uses_members``), who is a member, their
    heartbeats, the drained workers, the pins and the published loads."""

    listed: Mapping[str, OwnershipRecord]
    now: float
    dark: tuple[tuple[float, float], ...]
    members: frozenset[str] = frozenset()
    heartbeats: dict[str, float] = field(default_factory=dict)
    drained: frozenset[str] = frozenset()
    pins: dict[str, str] = field(default_factory=dict)
    loads: Mapping[str, float] = field(default_factory=dict)
    avoided: Mapping[str, frozenset[str]] = field(default_factory=dict)
    joined: Mapping[str, float] = field(default_factory=dict)  # member -> when it announced itself (store clock)
    unready: frozenset[str] = frozenset()  # members whose heartbeat is their announcing cycle's only


def joined_at(member: Member) -> float | None:
    """When ``member`` announced itself by the store's clock, as its heartbeat says; None if it does not."""
    try:
        at = float(member.info.get("joined", ""))
    except ValueError:
        return None
    return at if math.isfinite(at) else None


class Reading(Renewal):
    """The cycle's read, its view, and the steady cycles and quiet waits it allows."""

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
        notice it misses costs at most this wait instead of one interval. Never past the end of a
        stolen lease's fence (``holds``): the cycle after it starts that partition's pump."""
        interval = self.interval if interval is None else interval
        if not self._steady or self._read_at is None or interval is None:
            return None
        until = self._read_at + self.expiry - self._stale_after() + interval
        fence = self.fenced_until()  # a stolen lease's pump starts at the first cycle after its fence
        return until if fence is None else min(until, fence)

    async def partitions_changed(self) -> bool:
        """Whether the hub's partitions differ from those the last cycle read (one call of the partition
        source, no store request): news for a worker waiting quietly, which no store's channel carries.
        False before the first cycle. Raises what the partition source raises."""
        if self._partition_ids is None:
            return False
        return tuple(await self.partitions()) != self._partition_ids

    def _announcing(self, read: Read) -> bool:
        """Whether this cycle only announces the worker (``View.first_cycle``): its first; or, for up to
        an interval after it while the worker holds nothing, one that finds a worker joined since its
        last read that announced itself less than half the "soon" wait ago (``schedule.soon_after``; by
        its heartbeat's "joined"), so that more may be coming. Workers starting a second apart then
        claim once the last of them has announced itself, each its final share, instead of the first
        ones claiming shares of fewer workers and handing part over a cycle later (staggered cold
        starts moved partitions: 3 of 32 on 4 workers, 24 of 256 on 16, starts spread over 1 s at
        2 s / 10 s); workers starting together
        have all announced themselves well before the wait ends, and claim at once as before."""
        if not self._announced:
            return True
        if self._settle is None:
            return False
        until, seen = self._settle
        self._settle = (until, read.members)
        interval = self.interval or 0.0
        recent = soon_after(Last(announced=True), interval) or 0.0
        joined = [read.joined[w] for w in read.members - seen - {self.owner_id} if w in read.joined]
        if self._leases or self.monotonic() > until or all(read.now - at >= recent / 2 for at in joined):
            self._settle = None
            return False
        return True

    async def _view(self, pids: tuple[str, ...]) -> View:
        """The strategy's view; with heartbeats and controls when the strategy uses them."""
        self._steady, self._read = False, None
        if self.controls is not None and self.strategy.uses_members:
            read = await self._read_members(self.controls, pids)
        else:
            read = await self._read_ownership()
        listed = read.listed
        return View(
            self.owner_id,
            pids,
            listed,
            read.now,
            self.expiry,
            members=read.members,
            drained=read.drained,
            pins=read.pins,
            waiting={p: since for p, since in self._waiting.items() if self._still_held_by(p, listed)},
            handoff_timeout=self.handoff_timeout,
            first_cycle=self._announcing(read),
            dark=read.dark,
            clock_is_store=self.strategy.store_clock,
            heartbeats=read.heartbeats,
            unready=read.unready,
            interval=self.interval,
            previous=self._previous,
            loads=read.loads,
            avoided=read.avoided,
            fresh_after=self._fresh_after,
            exact=self._exact,
        )

    async def _read_members(self, controls: ControlStore, pids: tuple[str, ...]) -> Read:
        """The read of a strategy that uses members: a snapshot (or what changed), with heartbeats,
        controls and, for a load-weighted strategy, the rates; heartbeats if one is due."""
        snap, requests, copy = await self._snapshot(controls)
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
                r.owner_id
                for r in listed.values()
                if r.owner_id in known and age(self._modified(r), now, dark, self.expiry) <= self.expiry
            )
        self._read = (*read, holders)
        members = frozenset(heartbeats) | holders | {self.owner_id}
        standing = Controls.of(snap.controls)
        token = next((c.value for c in snap.controls if c.kind is ControlKind.REBALANCE), None)
        # A token first seen at start is old news; one that changed since is a fresh request.
        self._rebalance = self._announced and token is not None and token != self._rebalance_token
        self._rebalance_token = token
        loads = load.published(listed_members, listed.values()) if self.strategy.uses_load else {}
        # What each live member's heartbeat says it will not take; this worker's own as it is now.
        avoided = {w: ps for w, ps in avoid.avoided_by(snap.members).items() if w in members and w != self.owner_id}
        if mine := self.avoiding():
            avoided[self.owner_id] = mine
        pins = dict(standing.pins)
        # Parsed only where used: by the looks for late joiners (``_announcing``) and by a plan, which a
        # steady cycle skips (an idle fleet's every cycle would parse every member's heartbeat again).
        used = self._settle is not None or not self._steady
        joined = {
            m.owner_id: at for m in snap.members if used and m.owner_id in members and (at := joined_at(m)) is not None
        }
        unready = frozenset(m.owner_id for m in snap.members if m.owner_id in joined and m.info.get("ready") != "1")
        return Read(listed, now, dark, members, heartbeats, standing.drained, pins, loads, avoided, joined, unready)

    async def _read_ownership(self) -> Read:
        """The read of a strategy that uses no members: the ownership records and a clock (the store's,
        for a strategy that judges by it); a heartbeat for the dashboard's worker list if one is due."""
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
        return Read(listed, now, dark)

    def _steady_read(
        self, pids: tuple[str, ...], read: tuple[tuple[Member, ...], tuple[Control, ...]], dark: tuple[object, ...]
    ) -> bool:
        """Whether this cycle may skip its plan (``steady_cycles``), given what it read."""
        settled = self._settled
        return (
            settled is not None
            and self._quiet_empty
            and not dark
            and not self._waiting
            and not self._handing_off
            and pids == settled.partition_ids
            and read == (settled.members, settled.controls)
            and settled.leases == self._leases.keys()
        )

    def _settles(self, view: View, plan: Plan, active: Mapping[str, OwnershipRecord]) -> Settled | None:
        """What the next cycle compares its read with to skip its plan, when this one may be the last
        to plan for a while: an empty plan, every partition held by a live worker, and every other
        member holding some or drained (a member that holds nothing drops out when its heartbeat ages,
        which changes the plan without a write). None: the next cycle plans."""
        if not (self.steady_cycles and self.strategy.settles and not self.strategy.uses_load) or self._read is None:
            return None
        if plan != NOTHING or view.first_cycle or self._rebalance or view.dark:
            return None
        if len(active) != len(view.partition_ids):
            return None
        members, controls, holders = self._read
        idle = {m.owner_id for m in members} - holders - view.drained - {self.owner_id}
        if idle:
            return None
        return Settled(view.partition_ids, members, controls, holders, frozenset(self._leases))

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
                snap = Snapshot(done.ownership, self._table.members, self._table.controls, found.now)
                return snap, requests, self._table.by_partition
        snap, listed = await snapshot(self.store, controls, self.ref)
        self._rows += len(snap.ownership)
        return snap, requests + listed, None

    def _still_held_by(self, partition_id: str, listed: Mapping[str, OwnershipRecord]) -> bool:
        """Whether ``partition_id`` is still held by the worker this one started waiting for."""
        record = listed.get(partition_id)
        return record is not None and record.owner_id == self._waiting_on.get(partition_id)
