"""A cluster of real ``RaceCoordinator``s on the in-memory race hub and store, on simulated time.

Run a test's coroutine with ``sim_loop.run``: time jumps to the next timer, so a race with
minute-long spans takes milliseconds and every run is the same. Each node cycles every
``interval`` (as the runtime does) and hands a lost partition over after ``handoff`` seconds (as
the runtime's pumps do: stop after the event in hand, checkpoint, ``release``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from balancer.errors import StoreError
from balancer.model import BalancerEvent, EventKind, HubRef, partition_ids
from balancer.race.backend import MemoryRaceBackend, MemoryRaceHub
from balancer.race.coordinator import RaceCoordinator
from balancer.race.times import LoadWeights, RaceTimes
from balancer.stores.memory import MemoryStore
from tests.support import waiting

REF = HubRef("race.example", "sensors", "$Default")
EPOCH = 1_700_000_000.0
TIMES = RaceTimes()  # 001's own spans: 60 s normal lease time, simulated time makes them free


def now() -> float:
    return asyncio.get_running_loop().time()


@dataclass
class Node:
    coordinator: RaceCoordinator
    loop: asyncio.Task[None] | None = None
    dead: bool = False
    handoffs: list[asyncio.Task[None]] = field(default_factory=list)


@dataclass
class RaceCluster:
    partitions: int
    times: RaceTimes = TIMES
    interval: float = 2.0
    handoff: float = 0.2
    latency: tuple[float, float] | None = (0.001, 0.010)
    hub: MemoryRaceHub = field(default_factory=MemoryRaceHub)
    nodes: dict[str, Node] = field(default_factory=dict)
    events: list[tuple[float, BalancerEvent]] = field(default_factory=list)
    seed: int = 1

    def __post_init__(self) -> None:
        self.store = MemoryStore(clock=lambda: EPOCH + now())
        self.rng = random.Random(self.seed)

    async def pids(self) -> tuple[str, ...]:
        return partition_ids(self.partitions)

    def add(self, name: str, load: LoadWeights | None = None, start: bool = True) -> RaceCoordinator:
        backend = MemoryRaceBackend(self.hub, REF, self.latency, random.Random(self.rng.random()))
        built: list[Node] = []  # the node, once built: its coordinator's handoffs are kept on it
        coordinator = RaceCoordinator(
            REF,
            name,
            self.store,
            backend,
            self.pids,
            self.times,
            controls=self.store,
            on_event=lambda e: self.events.append((now(), e)),
            load=load,
            on_handoff=lambda pid: built[0].handoffs.append(asyncio.create_task(self._hand_off(built[0], pid))),
            rng=random.Random(f"{self.seed}/{name}"),
            clock=lambda: EPOCH + now(),
            monotonic=now,
        )
        node = self.nodes[name] = Node(coordinator)
        built.append(node)
        if start:
            node.loop = asyncio.create_task(self._cycles(node))
        return coordinator

    async def _cycles(self, node: Node) -> None:
        while True:
            with contextlib.suppress(StoreError):  # an outage: the runtime logs it, tries next interval
                await node.coordinator.cycle()
            await asyncio.sleep(self.interval * (1 + 0.1 * (2 * self.rng.random() - 1)))

    async def _hand_off(self, node: Node, pid: str) -> None:
        await asyncio.sleep(self.handoff)
        await node.coordinator.release(pid)

    def kill(self, name: str) -> None:
        """SIGKILL: every task gone, nothing released."""
        node = self.nodes[name]
        node.dead = True
        for task in [*node.coordinator.abort(), *node.handoffs, *([node.loop] if node.loop else [])]:
            task.cancel()

    async def close(self) -> None:
        tasks = []
        for node in self.nodes.values():
            tasks += node.coordinator.abort() + node.handoffs + ([node.loop] if node.loop else [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def owners(self) -> dict[str, str]:
        """Partition -> the node processing it, from the nodes themselves (fails on a double owner)."""
        out: dict[str, str] = {}
        for name, node in self.nodes.items():
            if node.dead:
                continue
            for pid in node.coordinator.owned:
                if node.coordinator.handing_off(pid):
                    continue
                assert pid not in out, f"partition {pid} processed by {out[pid]} and {name}"
                out[pid] = name
        return out

    def counts(self, names: list[str] | None = None) -> list[int]:
        owners = list(self.owners().values())
        alive = [n for n, node in self.nodes.items() if not node.dead]
        return [owners.count(n) for n in (names or alive)]

    def balanced(self, names: list[str] | None = None) -> bool:
        counts = self.counts(names)
        return sum(counts) == self.partitions and max(counts) - min(counts) <= 1

    async def until(
        self, condition: Callable[[], bool], within: float, step: float = 0.1, what: str = "the condition"
    ) -> float:
        """Simulated seconds until ``condition`` holds (``tests.support.waiting.until`` on the
        loop's clock); fails after ``within``, saying who processes what."""
        started = now()
        await waiting.until(condition, what, within, step=step, clock=now, detail=lambda: f"owners {self.owners()}")
        return now() - started

    def moves(self, since: float = 0.0) -> list[BalancerEvent]:
        """Starts of a partition that another live node processed before (steals)."""
        return [e for t, e in self.events if t >= since and e.kind is EventKind.STEAL]
