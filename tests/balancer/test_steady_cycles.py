"""Steady cycles (``Coordinator.steady_cycles``): a cycle whose quiet read brought nothing new skips
its plan, and the fleet does exactly what it does when every cycle plans.

The property runs the same random life of a fleet (joins, crashes, stops, pauses past the expiry,
drains, pins, rebalances, uneven clock steps) twice on the in-memory store, whose change feed leaves
renewals out as PostgreSQL's and Redis's do: once planning every cycle, once skipping where steady.
Every event (kind, partition, owners, time) and the final table must be the same.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from balancer.model import BalancerEvent, Control, ControlKind
from balancer.protocol import CycleReport
from balancer.strategies import Plan, PlanFunction, View

from .cluster import REF, Cluster

EXPIRY, INTERVAL = 10.0, 2.0


@dataclass(frozen=True)
class Step:
    kind: str  # cycle, advance, add, crash, stop, pause, resume, drain, undrain, pin, unpin, rebalance
    worker: int = 0
    partition: int = 0
    seconds: float = 0.0


steps = st.one_of(
    st.just(Step("cycle")),
    st.builds(Step, st.just("advance"), seconds=st.floats(0.1, 12.0)),
    st.just(Step("add")),
    st.builds(Step, st.just("crash"), worker=st.integers(0, 7)),
    st.builds(Step, st.just("stop"), worker=st.integers(0, 7)),
    st.builds(Step, st.just("pause"), worker=st.integers(0, 7)),
    st.builds(Step, st.just("resume"), worker=st.integers(0, 7)),
    st.builds(Step, st.just("drain"), worker=st.integers(0, 7)),
    st.builds(Step, st.just("undrain"), worker=st.integers(0, 7)),
    st.builds(Step, st.just("pin"), worker=st.integers(0, 7), partition=st.integers(0, 23)),
    st.builds(Step, st.just("unpin"), partition=st.integers(0, 23)),
    st.just(Step("rebalance")),
)


class Fleet:
    """A ``Cluster`` whose workers can be paused (alive, not cycling: a SIGSTOP) and whose steps
    count the plans made."""

    def __init__(self, partitions: int, workers: int, steady: bool) -> None:
        self.cluster = Cluster(
            partitions,
            strategy="cooperative",
            expiry=EXPIRY,
            interval=INTERVAL,
            seed=7,
            renewal_steps=True,
            steady_cycles=steady,
        )
        self.partitions = partitions
        self.plans = 0
        self.paused: set[str] = set()
        self.reports: list[CycleReport] = []
        self.names: list[str] = []
        self.tokens = 0
        for _ in range(workers):
            self.add()

    def add(self) -> None:
        name = f"w{len(self.names)}"
        self.names.append(name)
        coordinator = self.cluster.add(name)
        coordinator.strategy = replace(coordinator.strategy, plan=self._counted(coordinator.strategy.plan))

    def _counted(self, plan: PlanFunction) -> PlanFunction:
        def counted(view: View, rng: random.Random) -> Plan:
            self.plans += 1
            return plan(view, rng)

        return counted

    def named(self, index: int) -> str | None:
        alive = [n for n in self.names if n in self.cluster.workers]
        return alive[index % len(alive)] if alive else None

    async def cycle(self) -> None:
        for name, coordinator in list(self.cluster.workers.items()):
            if name not in self.paused:
                self.reports.append(await coordinator.cycle())
        await self.advance(INTERVAL)

    async def advance(self, seconds: float) -> None:
        paused = {n: self.cluster.workers.pop(n) for n in self.paused if n in self.cluster.workers}
        try:  # a paused worker renews nothing either
            await self.cluster.advance(seconds)
        finally:
            self.cluster.workers.update(paused)

    async def control(self, control: Control, put: bool = True) -> None:
        store = self.cluster.store
        await (store.put_control(control) if put else store.delete_control(REF, control.kind, control.target))

    async def run(self, step: Step) -> None:
        name = self.named(step.worker)
        if step.kind == "cycle":
            await self.cycle()
        elif step.kind == "advance":
            await self.advance(step.seconds)
        elif step.kind == "add" and len(self.names) < 8:
            self.add()
        elif step.kind == "crash" and name is not None and len(self.cluster.workers) > 1:
            self.cluster.crash(name)
            self.paused.discard(name)
        elif step.kind == "stop" and name is not None and len(self.cluster.workers) > 1:
            await self.cluster.workers[name].release_all()  # a graceful stop: released at once
            self.cluster.crash(name)
            self.paused.discard(name)
        elif step.kind == "pause" and name is not None:
            self.paused.add(name)
        elif step.kind == "resume" and name is not None:
            self.paused.discard(name)
        elif step.kind in ("drain", "undrain") and name is not None:
            await self.control(Control(REF, ControlKind.DRAIN, name), put=step.kind == "drain")
        elif step.kind == "pin" and name is not None:
            pid = str(step.partition % self.partitions)
            await self.control(Control(REF, ControlKind.PIN, pid, name))
        elif step.kind == "unpin":
            await self.control(Control(REF, ControlKind.PIN, str(step.partition % self.partitions)), put=False)
        elif step.kind == "rebalance":
            self.tokens += 1
            await self.control(Control(REF, ControlKind.REBALANCE, "*", f"t{self.tokens}"))


Life = tuple[list[BalancerEvent], dict[str, str], int]  # the events, the final owners, the plans made


async def life(partitions: int, workers: int, script: list[Step], steady: bool) -> Life:
    fleet = Fleet(partitions, workers, steady)
    for step in script:
        await fleet.run(step)
        await fleet.cycle()
    for _ in range(10):  # then quiet: everyone resumes and the fleet settles
        fleet.paused.clear()
        await fleet.cycle()
    return list(fleet.cluster.events), await fleet.cluster.owners(), fleet.plans


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(partitions=st.integers(1, 24), workers=st.integers(1, 6), script=st.lists(steps, max_size=25))
# Settled first, then: a graceful stop (its partitions are left free for an interval, then claimed),
# a crash, a pause past the expiry.
@example(partitions=8, workers=3, script=[Step("cycle")] * 8 + [Step("stop")])
@example(partitions=8, workers=3, script=[Step("cycle")] * 8 + [Step("crash", worker=1)])
@example(partitions=8, workers=3, script=[Step("cycle")] * 8 + [Step("pause", worker=2)] + [Step("cycle")] * 8)
def test_steady_cycles_change_nothing_the_fleet_does(partitions: int, workers: int, script: list[Step]) -> None:
    planned = asyncio.run(life(partitions, workers, script, steady=False))
    steady = asyncio.run(life(partitions, workers, script, steady=True))
    assert steady[0] == planned[0], "the events differ when steady cycles skip their plans"
    assert steady[1] == planned[1]
    assert steady[2] <= planned[2]


def test_a_balanced_fleet_stops_planning_until_something_changes() -> None:
    async def scenario() -> None:
        fleet = Fleet(64, 8, steady=True)
        cluster = fleet.cluster
        await cluster.settle()
        await fleet.cycle()  # the last plan, empty, with every partition held
        before = fleet.plans
        reports = [await c.cycle() for c in cluster.workers.values()]
        assert fleet.plans == before and not any(r.planned for r in reports)
        await cluster.advance(INTERVAL)
        fleet.reports.clear()
        for _ in range(20):  # 40 s: leases renewed by their steps, never read again
            await fleet.cycle()
        # Only the safety-net full reads (once an expiry on this store) plan; they find nothing to do.
        planned = [r for r in fleet.reports if r.planned]
        assert fleet.plans == before + len(planned)
        assert all(r.rows == 64 for r in planned) and all(r.rows == 0 for r in fleet.reports if not r.planned)
        assert len(planned) <= 8 * 40 / EXPIRY
        assert not any(r.gained or r.lost for r in fleet.reports)

        fleet.add()  # a join: the member list changed, so everyone plans
        await fleet.cycle()
        assert fleet.plans >= before + 9
        await cluster.settle()
        assert sorted(await cluster.counts()) == [7] * 8 + [8]

        await fleet.cycle()
        fleet.reports.clear()
        await fleet.cycle()
        assert not all(r.planned for r in fleet.reports)
        quiet = fleet.plans
        victim = fleet.named(0)
        assert victim is not None
        fleet.paused.add(victim)  # stops renewing: its records come back in the read before they expire
        taken_at = None
        for _ in range(10):
            await fleet.cycle()
            if victim not in (await cluster.owners()).values():
                taken_at = cluster.now
                break
        assert fleet.plans > quiet
        assert taken_at is not None, "the paused worker's partitions were never taken over"

    asyncio.run(scenario())
