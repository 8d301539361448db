"""The simulator's run of the lease-table strategies: real ``Coordinator``s, each planning with the
chosen strategy, on simulated time.

``plan_ms`` is the wall time each plan call took (``time.perf_counter``), measured from the
disturbance on and never fed back into the simulation.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace

from balancer.lease import Coordinator
from balancer.model import EventKind, partition_ids
from balancer.sim.base import Run
from balancer.sim.scenarios import REF, Settings, claim_offsets
from balancer.sim.store import LatentStore
from balancer.strategies import Claim, Plan, Strategy, View


def _scripted(plan: Plan) -> Callable[[View, random.Random], Plan]:
    """A plan function that always returns ``plan``."""
    return lambda view, rng: plan


class TableRun(Run):
    """One seeded run of one scenario with lease-table ``Coordinator``s."""

    def __init__(
        self, strategy: Strategy, scenario: str, partitions: int, workers: int, seed: int, settings: Settings
    ) -> None:
        super().__init__(strategy, scenario, partitions, workers, seed, settings)
        self.timed = replace(strategy, plan=self._timed(strategy.plan))
        self.tables: dict[str, Coordinator] = {}

    def _timed(self, plan: Callable[[View, random.Random], Plan]) -> Callable[[View, random.Random], Plan]:
        def timed(view: View, rng: random.Random) -> Plan:
            started = time.perf_counter()  # measurement only: never read by the simulation
            result = plan(view, rng)
            if self._now() >= self.disturbed_at:
                self.plan_ms.append((time.perf_counter() - started) * 1000)
            return result

        return timed

    def _coordinator(self, w: str, store: LatentStore) -> Coordinator:
        coordinator = self.tables[w] = Coordinator(
            ref=REF,
            owner_id=w,
            store=store,
            partitions=self._partition_ids,
            strategy=self.timed,
            expiry=self.s.expiry,
            interval=self.s.interval,
            controls=store,
            rng=random.Random(f"{self.seed}/{w}"),
            clock=self._clock_of(w),
            monotonic=self._now,
            on_handoff=self._on_handoff(w),
            on_released=self._tell,
            announce_joining=self.s.notice_latency is not None,  # news for the workers waiting quietly
        )
        return coordinator

    async def _adopt(self, workers: list[str]) -> None:
        """Deal the partitions out; each worker claims its deal with a scripted plan."""
        pids = list(partition_ids(self.hub_size))
        self.env.shuffle(pids)
        start, offsets = self._now(), claim_offsets(self.s, self.scenario, workers, self.seed, self.partitions)
        deals = {w: pids[i :: len(workers)] for i, w in enumerate(workers)}
        for w in sorted(workers, key=lambda w: offsets[w]):  # in worker order when all claim at once
            await self._sleep_until(start + offsets[w])
            deal = Plan(claims=tuple(Claim(p, EventKind.CLAIM, None, "initial state") for p in deals[w]))
            self.tables[w].strategy = replace(self.strategy, plan=_scripted(deal))
            self.alive.add(w)
            await self._cycle(w)
            self.tables[w].strategy = self.timed
        for w in workers:
            self._launch(w, self._now() + self.env.uniform(0, self.s.interval))
