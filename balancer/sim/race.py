"""The simulator's run of the ``race`` strategy: real ``RaceCoordinator``s on simulated time.

Everything of ``balancer.sim.base.Run`` holds (scenarios, latency, ledger, processing, measures);
what differs is the coordinator and one more store: the race's hashes and channels live in one
``MemoryRaceHub``, and each worker reaches it through its own ``MemoryRaceBackend`` with the
same latency as the ownership store (a message reaches each subscriber after a one-way latency
of its own). The workers' cycles (renewals, repairs, grab timers) run every ``interval`` as for
the lease-table strategies; the races run between cycles, driven by the notifications.

Spans: the normal lease time is the lease-table ``expiry`` (a partition is challenged about as
often as a lease-table lease must be renewed at the latest), the maximum lease time 1.5 times
that, the maximum shutdown time and the minimum lease grab time half of it (the maximum shutdown
time at least 1.5 intervals: it is also the local lease a worker holds between two cycles), and
001's 250 ms delay per partition held.

``store_requests_per_worker_cycle`` counts the round trips to both stores; ``plan_ms`` is empty:
the race has no plan function.
"""

from __future__ import annotations

import asyncio
import random

from balancer.model import partition_ids
from balancer.race.backend import MemoryRaceBackend, MemoryRaceHub
from balancer.race.coordinator import RaceCoordinator
from balancer.race.times import RaceTimes
from balancer.sim.base import Run
from balancer.sim.scenarios import REF, Outcome, Settings
from balancer.sim.store import LatentStore
from balancer.strategies import Strategy


def sim_times(settings: Settings) -> RaceTimes:
    """The race's spans for a simulation with ``settings`` (see the module docstring)."""
    half = settings.expiry / 2
    return RaceTimes(
        normal_lease=settings.expiry,
        maximum_lease=1.5 * settings.expiry,
        maximum_shutdown=max(half, 1.5 * settings.interval),
        minimum_lease_grab=half,
        leases_held_delay=0.25,
    )


class RaceRun(Run):
    """One seeded run of one scenario with ``RaceCoordinator``s."""

    def __init__(
        self, strategy: Strategy, scenario: str, partitions: int, workers: int, seed: int, settings: Settings
    ) -> None:
        super().__init__(strategy, scenario, partitions, workers, seed, settings)
        self.times = sim_times(settings)
        self.hub = MemoryRaceHub()
        self.races: dict[str, RaceCoordinator] = {}

    def _coordinator(self, w: str, store: LatentStore) -> RaceCoordinator:
        backend = MemoryRaceBackend(self.hub, REF, self.s.latency, random.Random(self.env.random()))
        race = self.races[w] = RaceCoordinator(
            REF,
            w,
            store,
            backend,
            self._partition_ids,
            self.times,
            controls=store,
            on_handoff=self._on_handoff(w),
            rng=random.Random(f"{self.seed}/{w}"),
            clock=self._clock_of(w),
            monotonic=self._now,
        )
        return race

    def _spent(self, w: str) -> int:
        return super()._spent(w) + self.races[w].backend.requests

    async def _adopt(self, workers: list[str]) -> None:
        """Deal the partitions out; each worker adopts its deal."""
        pids = list(partition_ids(self.hub_size))
        self.env.shuffle(pids)
        for i, w in enumerate(workers):
            await self.races[w].adopt(pids[i :: len(workers)], "initial state")
            self.alive.add(w)
            await self._cycle(w)
        for w in workers:
            self._launch(w, self._now() + self.env.uniform(0, self.s.interval))

    def _crash(self, w: str) -> None:
        self.races[w].abort()
        super()._crash(w)

    async def main(self) -> Outcome:
        try:
            return await super().main()
        finally:
            tasks = [t for race in self.races.values() for t in race.abort()]
            await asyncio.gather(*tasks, return_exceptions=True)
