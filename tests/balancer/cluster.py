"""A cluster of real coordinators on one in-memory store, driven by a fake clock.

Each ``cycle()`` runs every live worker's coordinator once, in a fixed order, then advances time by
the interval. With ``renewal_steps`` the clock stops on the way wherever a worker's lease falls due
(``Coordinator.next_renewal``) and that worker's ``renew()`` runs, as the runtime's loop does between
cycles. Nothing sleeps.
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from typing import Any

from balancer.errors import StoreUnavailable
from balancer.lease import Coordinator
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
        renewal_steps: bool = False,
        steady_cycles: bool = True,
    ) -> None:
        self.renewal_steps = renewal_steps
        self.steady_cycles = steady_cycles
        self.renewed: list[tuple[float, str, int]] = []  # (time, worker, requests) of each renewal step
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

    def add(self, owner_id: str, **hooks: Any) -> Coordinator:
        """A worker joins, its coordinator built with ``hooks`` too (``on_released``, ``on_handoff``, ...)."""
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
            renewal_steps=self.renewal_steps,
            steady_cycles=self.steady_cycles,
            **hooks,
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
            await self.advance(self.interval)

    async def advance(self, seconds: float) -> None:
        """Move the clock on by ``seconds``; with renewal steps, stopping at each lease that falls due
        on the way (earliest first) for its worker's ``renew()`` (a store outage fails it: tried again
        at the next ``next_renewal()``)."""
        end = self.now + seconds
        while self.renewal_steps:
            due = [(at, name) for name, c in self.workers.items() if (at := c.next_renewal()) is not None and at < end]
            if not due:
                break
            at, name = min(due)
            self.now = max(self.now, at)
            with contextlib.suppress(StoreUnavailable):
                report = await self.workers[name].renew()
                self.renewed.append((self.now, name, report.requests))
        self.now = end

    async def owners(self) -> dict[str, str]:
        """Partition -> owner, of records not expired by the store's clock."""
        records = await self.store.list_ownership(REF)
        return {r.partition_id: r.owner_id for r in records if not r.expired(self.now, self.expiry)}

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
