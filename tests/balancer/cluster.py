"""A cluster of real coordinators on one in-memory store, driven by a fake clock.

Each ``cycle()`` runs every live worker's coordinator once, in a fixed order, then advances time by
the interval. Nothing sleeps.
"""

from __future__ import annotations

import random
from collections import Counter

from balancer.coordinator import Coordinator
from balancer.model import BalancerEvent, HubRef, partition_ids
from balancer.stores.memory import MemoryStore
from balancer.strategies import get_strategy

REF = HubRef("ns.example", "sensors", "$Default")


class Cluster:
    def __init__(
        self,
        partitions: int,
        *,
        strategy: str = "balanced",
        expiry: float = 30.0,
        interval: float = 10.0,
        seed: int = 0,
    ) -> None:
        self.now = 1_700_000_000.0
        self.store = MemoryStore(clock=lambda: self.now)
        self.partitions = partitions
        self.expiry = expiry
        self.interval = interval
        self.strategy = get_strategy(strategy)
        self.rng = random.Random(seed)
        self.workers: dict[str, Coordinator] = {}
        self.skew: dict[str, float] = {}
        self.events: list[BalancerEvent] = []

    async def _partition_ids(self) -> tuple[str, ...]:
        return partition_ids(self.partitions)

    def add(self, owner_id: str) -> Coordinator:
        coordinator = Coordinator(
            ref=REF,
            owner_id=owner_id,
            store=self.store,
            partitions=self._partition_ids,
            strategy=self.strategy,
            expiry=self.expiry,
            interval=self.interval,
            on_event=self.events.append,
            rng=random.Random(self.rng.random()),
            clock=lambda: self.now + self.skew.get(owner_id, 0.0),
            monotonic=lambda: self.now,
        )
        self.workers[owner_id] = coordinator
        return coordinator

    def crash(self, owner_id: str) -> None:
        """Stop a worker without releasing anything: its leases expire."""
        del self.workers[owner_id]

    async def cycle(self, times: int = 1) -> None:
        for _ in range(times):
            for coordinator in list(self.workers.values()):
                await coordinator.cycle()
            self.now += self.interval

    async def owners(self) -> dict[str, str]:
        """Partition -> owner, of records not expired by the store's clock."""
        records = await self.store.list_ownership(REF)
        return {
            r.partition_id: r.owner_id for r in records if not r.expired(self.now, self.expiry)
        }

    async def counts(self) -> list[int]:
        """Owned partitions per live worker, sorted."""
        owners = await self.owners()
        counter = Counter(owners.values())
        return sorted(counter.get(w, 0) for w in self.workers)

    async def settle(self, limit: int = 100) -> int:
        """Cycle until every partition is owned and counts differ by at most one; return cycles used."""
        for used in range(1, limit + 1):
            await self.cycle()
            counts = await self.counts()
            if len(await self.owners()) == self.partitions and counts[-1] - counts[0] <= 1:
                return used
        raise AssertionError(f"not balanced after {limit} cycles: {await self.counts()}")
