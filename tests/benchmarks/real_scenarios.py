"""The simulator's scenarios played on real ``runworkers`` processes, for ``bench_sim_vs_real``.

One round is a fleet of the fault-injection suite (``tests.chaos.fleet.Fleet``: ``runworkers --count
1`` processes on the SQL store on PostgreSQL, an embedded hub, a producer writing one event per
partition every 20 ms) on a hub of its own, which goes through the scenarios one after another, each
starting from the state its simulated twin starts from (``balancer.sim.scenarios``):

    N workers start and balance on ⌊2P/3⌋ partitions;
    drain (N balanced, one drained), then it is undrained (not measured);
    stop (N balanced, one gets SIGTERM: a graceful stop, releasing what it holds);
    stop-and-join (N-1 balanced; one joins and at that instant another gets SIGTERM; timed from
    the stopping one's release, when the simulator's starts), twice;
    scale-out (N-1 balanced, one joins); stop, stop-and-join and scale-out again;
    add-partitions (N balanced, the hub grows to P);
    crash (N balanced on P, one gets SIGKILL at a moment up to one expiry later), last.

The crash comes last because a killed worker's member record stays in the store (nothing removes
it; a graceful stop does), and while it does no other worker's plan settles (``Coordinator``'s
steady cycles wait for every member to hold a partition or heartbeat), so nobody waits quietly and
a join or the hub's growth is seen at each worker's next read instead of at once: played after a
crash, scale-out took 0.9-1.1 s where the same fleet took 0.02-0.03 s before it. The simulator's
twins start with no such record, so no real phase may follow the crash.

Each phase ends once balance has held ``HOLD`` intervals (which is also the steady state the next
one starts from, as the simulator's runs have two intervals of it). Measured as the simulator
measures (``balancer.sim.run``), from ownership records sampled every ``SAMPLE`` seconds: balance is
every partition of the hub named by a running, undrained worker in a record that has not expired by
the store's clock, owned counts within one; seconds to balance run from the event to the start of
the last balanced stretch; a move is a record that names a worker other than the partition's last
named holder while that holder still runs (a stopped or killed worker's partitions are no move).

The event is the drain's control write (with the operator's news on the store's channel, as the
dashboard's action sends it), the SIGTERM, the SIGKILL, the hub's growth, and for a join the new
worker's first cycle, read from its member record (its "joined", the store's clock at its first
heartbeat, placed on the monotonic clock by the sample that finds it; ``Watch.announced``): the
simulator starts a joining worker at its disturbance, while a real process first spends seconds
importing Python and Django (``startup`` keeps those seconds, reported apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from balancer.lease.read import joined_at
from balancer.model import Control, ControlKind
from balancer.notices import OPERATOR, Released, release_channel
from tests.chaos.evidence import Lease, OwnershipSample
from tests.chaos.faults import new_name
from tests.chaos.fleet import Fleet, Worker
from tests.chaos.stores import SqlKit

SAMPLE = 0.01  # seconds between two reads of the ownership records
HOLD = 3  # intervals balance must hold to end a phase
PHASE_TIMEOUT = 90.0


@dataclass
class Phase:
    """One scenario played once: its event, who counts, and what was measured."""

    scenario: str
    at: float  # the event, on the monotonic clock
    eligible: set[str]  # the owners that should share the partitions afterwards
    gone: set[str] = field(default_factory=set)  # stopped or killed at the event: taking theirs is no move
    seconds: float | None = None
    moves: int = 0


def balanced(sample: OwnershipSample, eligible: set[str], expiry: float) -> bool:
    """Every partition named by an eligible owner in a live record; owned counts within one."""
    counts = dict.fromkeys(eligible, 0)
    for pid in sample.partitions:
        lease = sample.leases.get(pid)
        if lease is None or lease.owner not in counts or lease.last_modified is None:
            return False
        if sample.now - lease.last_modified > expiry:
            return False
        counts[lease.owner] += 1
    return bool(counts) and max(counts.values()) - min(counts.values()) <= 1


def count_moves(samples: list[OwnershipSample], phase: Phase, end: float) -> int:
    """Records naming another worker than the last named holder, from the event to ``end``, while
    that holder still ran."""
    last: dict[str, str] = {}
    moves = 0
    for sample in samples:
        if sample.at > end:
            break
        for pid, lease in sample.leases.items():
            if not lease.owner:
                continue
            before = last.get(pid)
            if sample.at >= phase.at and before not in (None, lease.owner) and before not in phase.gone:
                moves += 1
            last[pid] = lease.owner
    return moves


@dataclass
class Watch:
    """The ownership records sampled, and the join notices heard, in the bench's process."""

    fleet: Fleet
    samples: list[OwnershipSample] = field(default_factory=list)
    trips: list[float] = field(default_factory=list)  # seconds each listing of the records took
    joined: dict[str, float] = field(default_factory=dict)  # owner -> when its join notice came
    # owner -> its first cycle: its member record's "joined" (the store's clock at its first heartbeat),
    # on the monotonic clock by the sample that found it. The join notice comes a cycle later, once the
    # worker is ready for partitions (``cooperative.unproven``); the simulator times a join from the first.
    announced: dict[str, float] = field(default_factory=dict)
    releases: list[tuple[str, float]] = field(default_factory=list)  # (owner, when) of each release notice
    _news: asyncio.Event = field(default_factory=asyncio.Event)

    async def sample(self) -> None:
        fleet = self.fleet
        while True:
            try:
                sent = time.monotonic()
                records = await fleet.store.list_ownership(fleet.ref)
                self.trips.append(time.monotonic() - sent)
                now = await fleet.store.now()
                members = await fleet.store.list_members(fleet.ref)
            except Exception:  # a sample lost is only a sample
                await asyncio.sleep(0.1)
                continue
            for member in members:
                if member.owner_id not in self.announced and (at := joined_at(member)) is not None:
                    self.announced[member.owner_id] = time.monotonic() - max(0.0, now - at)
            leases = {r.partition_id: Lease(r.owner_id, r.last_modified) for r in records}
            self.samples.append(OwnershipSample(time.monotonic(), now, fleet.hub.partition_ids(), leases))
            await asyncio.sleep(SAMPLE)

    async def listen(self) -> None:
        channel = release_channel(self.fleet.store, self.fleet.ref)
        assert channel is not None, "the store has no channel: the joins cannot be timed"
        try:
            async for notice in channel.listen():
                if not notice.partition_ids:
                    self.joined.setdefault(notice.by, time.monotonic())
                else:
                    self.releases.append((notice.by, time.monotonic()))
                self._news.set()
        finally:
            await channel.aclose()

    async def join_of(self, worker: Worker) -> float:
        """When ``worker`` announced itself (its first cycle: ``announced``)."""
        deadline = time.monotonic() + PHASE_TIMEOUT
        while worker.owner not in self.announced:
            if not worker.running:
                raise AssertionError(f"{worker.owner} exited before its first cycle\n{self.fleet.log_tail()}")
            await asyncio.sleep(SAMPLE)
            if time.monotonic() > deadline:
                raise AssertionError(f"no member record of {worker.owner} in {PHASE_TIMEOUT:g}s")
        return self.announced[worker.owner]

    async def release_of(self, worker: Worker, after: float) -> float:
        """When ``worker`` released its partitions after ``after`` (its graceful stop's release notice);
        when it ends having released nothing, ``after``."""
        deadline = time.monotonic() + PHASE_TIMEOUT
        while True:
            heard = [at for by, at in self.releases if by == worker.owner and at >= after]
            if heard:
                return heard[0]
            if not worker.running:
                return after
            if time.monotonic() > deadline:
                raise AssertionError(f"no release notice from {worker.owner} in {PHASE_TIMEOUT:g}s")
            self._news.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), 0.05)

    async def heard(self) -> None:
        """Until the next notice the listener hears."""
        self._news.clear()
        await self._news.wait()

    def balanced_since(self, eligible: set[str], after: float) -> float | None:
        """The start of the balanced stretch the latest sample is in (not before ``after``)."""
        since = None
        for sample in reversed(self.samples):
            if sample.at < after or not balanced(sample, eligible, self.fleet.expiry):
                break
            since = sample.at
        return since

    async def settle(self, phase: Phase) -> Phase:
        """Until balance has held ``HOLD`` intervals after ``phase``'s event; then measure it."""
        hold = HOLD * self.fleet.interval

        def held() -> bool:
            since = self.balanced_since(phase.eligible, phase.at)
            return since is not None and self.samples[-1].at - since >= hold

        await self.fleet.until(held, PHASE_TIMEOUT, f"{phase.scenario}: balance held {hold:g}s")
        since = self.balanced_since(phase.eligible, phase.at)
        assert since is not None
        first = next(s.at for s in self.samples if s.at >= phase.at)
        phase.seconds = 0.0 if since == first else since - phase.at
        phase.moves = count_moves(self.samples, phase, self.samples[-1].at)
        return phase


def owners(workers: list[Worker]) -> set[str]:
    return {w.owner for w in workers}


@dataclass
class Round:
    """One fleet through the scenarios (see the module's docstring)."""

    watch: Watch
    startup: list[float] = field(default_factory=list)  # seconds from a process's start to its first cycle
    join_leads: list[float] = field(default_factory=list)  # stop-and-join: from the newcomer's join to the release
    drained: set[str] = field(default_factory=set)

    @property
    def fleet(self) -> Fleet:
        return self.watch.fleet

    def live(self) -> list[Worker]:
        return [w for w in self.fleet.running() if w.expected_end is None]

    def eligible(self) -> set[str]:
        return owners(self.live()) - self.drained

    def pick(self) -> Worker:
        """A running worker, not stopping nor drained, chosen by the fleet's generator."""
        chosen = sorted((w for w in self.live() if w.owner not in self.drained), key=lambda w: w.name)
        return self.fleet.rng.choice(chosen)

    async def join(self) -> Worker:
        worker = self.fleet.start(new_name())
        joined = await self.watch.join_of(worker)
        self.startup.append(joined - worker.started)
        return worker

    def end(self, worker: Worker, how: signal.Signals) -> float:
        """Send ``how`` (SIGTERM or SIGKILL) to ``worker`` without waiting for it; the time sent."""
        worker.expected_end = "sigterm" if how == signal.SIGTERM else "sigkill"
        at = time.monotonic()
        worker.process.send_signal(how)
        return at

    async def drain(self) -> Phase:
        fleet = self.fleet
        victim = self.pick().owner
        at = time.monotonic()
        await fleet.store.put_control(Control(fleet.ref, ControlKind.DRAIN, victim))
        await self.news()
        self.drained.add(victim)
        phase = await self.watch.settle(Phase("drain", at, self.eligible()))
        await fleet.store.delete_control(fleet.ref, ControlKind.DRAIN.value, victim)  # undrain: back to N
        await self.news()
        self.drained.discard(victim)
        await self.watch.settle(Phase("undrain", time.monotonic(), self.eligible()))
        return phase

    async def listening(self) -> None:
        """Until the bench's own listener hears a notice of its own (sent again every 0.1 s until then):
        from then on it hears every join and release. Before any worker starts."""
        deadline = time.monotonic() + PHASE_TIMEOUT
        while OPERATOR not in self.watch.joined:
            if time.monotonic() > deadline:
                raise AssertionError(f"the bench's listener heard nothing in {PHASE_TIMEOUT:g}s")
            await self.news()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.watch.heard(), 0.1)

    async def news(self) -> None:
        channel = release_channel(self.fleet.store, self.fleet.ref)
        assert channel is not None
        try:
            await channel.publish(Released(self.fleet.ref, (), OPERATOR))
        finally:
            await channel.aclose()

    async def stop(self, how: signal.Signals, scenario: str) -> Phase:
        victim = self.pick()
        at = self.end(victim, how)
        return await self.watch.settle(Phase(scenario, at, self.eligible(), {victim.owner}))

    async def scale_out(self) -> Phase:
        worker = await self.join()
        return await self.watch.settle(Phase("scale-out", self.watch.announced[worker.owner], self.eligible()))

    async def stop_and_join(self) -> Phase:
        """The simulator's event: one worker releases everything as it stops while another has just
        joined. The newcomer joins first (a process takes a second or so to its first cycle), the victim
        gets SIGTERM at once, and the phase starts at the victim's release, as the simulated one does."""
        victim = self.pick()
        newcomer = await self.join()
        sent = self.end(victim, signal.SIGTERM)
        at = await self.watch.release_of(victim, sent)
        self.join_leads.append(at - self.watch.announced[newcomer.owner])
        return await self.watch.settle(Phase("stop-and-join", at, self.eligible(), {victim.owner}))

    async def add_partitions(self, partitions: int) -> Phase:
        """The hub grows at a moment drawn from the round's generator, up to one expiry into the steady
        state, as the simulator's growth comes (``Settings.steady_spread``), so it finds the workers'
        waits at any point: straight after the phase before it, it came at the same point of their
        quiet waits' looks each round (2.02 s against the simulator's 1.53 s, 5 runs from 1.35 s)."""
        await asyncio.sleep(self.fleet.rng.uniform(0.0, self.fleet.expiry))
        at = time.monotonic()
        self.fleet.hub.add_partitions(partitions)
        return await self.watch.settle(Phase("add-partitions", at, self.eligible()))

    async def play(self, workers: int, partitions: int) -> list[Phase]:
        for _ in range(workers):
            await self.join()
        await self.watch.settle(Phase("cold-start", time.monotonic(), self.eligible()))
        phases = [await self.drain(), await self.stop(signal.SIGTERM, "stop")]
        phases += [await self.stop_and_join(), await self.stop_and_join(), await self.scale_out()]
        phases += [await self.stop(signal.SIGTERM, "stop"), await self.stop_and_join(), await self.scale_out()]
        phases.append(await self.add_partitions(partitions))
        phases.append(await self.crash())  # last: see the module's docstring
        return phases

    async def crash(self) -> Phase:
        """SIGKILL at a moment drawn from the round's generator, up to one expiry into the steady state,
        as the simulator's crash comes (``Settings.steady_spread`` 1.0 in the bench), so it finds its
        victim's leases at any age. Straight after the phase before it, every real crash came just after
        the 6.5 s renewal of the last claims fell due, found its victim's leases freshly renewed, and
        took 10.0-11.2 s against the simulator's 8.4 s."""
        await asyncio.sleep(self.fleet.rng.uniform(0.0, self.fleet.expiry))
        return await self.stop(signal.SIGKILL, "crash")


async def play_round(
    kit: SqlKit, root: Path, name: str, timing: tuple[float, float], size: tuple[int, int, int]
) -> tuple[list[Phase], Round]:
    """One round on a hub of its own (``name``): the phases measured, and the round (the processes'
    start-up seconds, the samples). ``timing``: (interval, expiry); ``size``: (workers, partitions
    first, partitions last)."""
    interval, expiry = timing
    workers, first, last = size
    opened = await kit.open()
    fleet = Fleet(replace(kit, name=name), root, opened, interval=interval, expiry=expiry, partitions=first)
    watch = Watch(fleet)
    tasks = [asyncio.create_task(watch.sample()), asyncio.create_task(watch.listen())]
    played = Round(watch)
    try:
        fleet.start_producing()
        await played.listening()
        phases = await played.play(workers, last)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(fleet.shutdown)
        await kit.close(opened)
    return phases, played


def on_postgresql(body: Callable[[SqlKit], Any]) -> Any:
    """``body(kit)`` with the SQL store on a PostgreSQL cluster of its own, migrated; stopped after."""
    from tests.chaos.stores import DASHBOARD_ALIAS, migrated_database, start_cluster
    from tests.support.databases import remove_django_database

    cluster = start_cluster()
    try:
        return body(SqlKit(cluster, migrated_database(cluster)))
    finally:
        remove_django_database(DASHBOARD_ALIAS)
        cluster.stop()
