"""Fixtures for driving workers: a real embedded hub, a fake clock, a recording handler."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from balancer.lease import Coordinator
from balancer.model import HubRef
from balancer.stores.memory import MemoryStore
from balancer.strategies import get_strategy
from tests.support.clock import FakeClock
from workers.handlers import PartitionContext
from workers.hub.embedded import EmbeddedHub
from workers.runtime.config import PumpConfig
from workers.runtime.deadletters import DeadLetters
from workers.runtime.processor import EventProcessor
from workers.runtime.sink import EventSink
from workers.sources.base import ReceivedEvent

REF = HubRef("test.example", "sensors", "$Default")


async def quick_sleep(seconds: float) -> None:
    """The injected sleep: yields to the loop (and the pumps' threads) without waiting ``seconds``."""
    await asyncio.sleep(0.001)


class Recorder:
    """A handler recording (partition, sequence number, owner) of every event it handled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[str, int, str]] = []

    def __call__(self, event: ReceivedEvent, ctx: PartitionContext) -> None:
        with self.lock:
            self.seen.append((event.partition_id, event.sequence_number, ctx.owner_id))

    def sequences(self, partition_id: str, owner_id: str | None = None) -> list[int]:
        with self.lock:
            return [s for p, s, o in self.seen if p == partition_id and (owner_id is None or o == owner_id)]

    def count(self) -> int:
        with self.lock:
            return len(self.seen)


@dataclass
class Rig:
    """One store, one hub, one fake clock, and workers built on them."""

    hub: EmbeddedHub
    store: Any
    clock: FakeClock
    dead_dir: Path
    sinks: dict[str, EventSink] = field(default_factory=dict)

    def worker(
        self,
        owner_id: str,
        handler: Callable[..., Any],
        *,
        monotonic: Callable[[], float] | None = None,
        expiry: float = 30.0,
        interval: float = 10.0,
        sleep: Callable[[float], Awaitable[None]] = quick_sleep,
        strategy: str = "balanced",
        source: Any = None,
        renew_share: float | None = None,
        **config: Any,
    ) -> EventProcessor:
        hub = self.hub
        sink = self.sinks[owner_id] = EventSink()

        async def partitions() -> tuple[str, ...]:
            return hub.partition_ids()

        coordinator = Coordinator(
            ref=REF,
            owner_id=owner_id,
            store=self.store,
            partitions=partitions,
            strategy=get_strategy(strategy),
            expiry=expiry,
            on_event=sink,
            rng=random.Random(7),
            clock=self.clock,
            monotonic=monotonic or self.clock,
            renew_share=renew_share,
        )
        options: dict[str, Any] = {"checkpoint_events": 5, "checkpoint_seconds": 1e9, "retries": 2}
        options.update(config)
        pump_config = PumpConfig(backoff_seconds=0.01, dead_letter_dir=self.dead_dir, **options)
        return EventProcessor(
            coordinator,
            checkpoints=self.store,
            source=hub if source is None else source,
            handler=handler,
            interval=interval,
            pump_config=pump_config,
            dead_letters=DeadLetters(self.dead_dir),
            rng=random.Random(1),
            sleep=sleep,
            shutdown_timeout=5.0,
        )

    def send(self, partition_id: str, count: int, body: bytes = b'{"n": 1}') -> None:
        self.hub.send_batch([body] * count, partition_id=partition_id)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def rig(tmp_path: Path, clock: FakeClock) -> Iterator[Rig]:
    """A rig on the in-memory store, whose clock is the fake one (expiry can be driven)."""
    hub = EmbeddedHub(tmp_path / "hub", "sensors", partitions=4)
    try:
        yield Rig(hub, MemoryStore(clock=clock), clock, tmp_path / "deadletter")
    finally:
        hub.close()


@pytest.fixture(params=["memory", pytest.param("sql", marks=pytest.mark.django_db(transaction=True))])
def store_kind(request: pytest.FixtureRequest) -> str:
    # transaction=True: SqlStore's own threads must see committed rows.
    return str(request.param)


@pytest.fixture
async def any_rig(store_kind: str, tmp_path: Path) -> AsyncIterator[Rig]:
    """A rig on each store. The SQL store (the SQLite test database) writes last-modified with its
    own clock, so tests using it must not rely on expiry; the workers' fake clock starts at the
    real time and stands still."""
    hub = EmbeddedHub(tmp_path / "hub", "sensors", partitions=4)
    store: Any
    if store_kind == "memory":
        clock = FakeClock()
        store = MemoryStore(clock=clock)
    else:
        from dashboard.sql.store import SqlStore

        clock = FakeClock(time.time())
        store = SqlStore()
    try:
        yield Rig(hub, store, clock, tmp_path / "deadletter")
    finally:
        hub.close()
        if store_kind == "sql":
            await store.aclose()


def metric(name: str, **labels: str) -> float:
    """The value of one series of the default registry (0 when it was never written)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def checkpoints(rig: Rig) -> dict[str, int]:
    """Partition -> checkpointed sequence number, as the rig's store has them."""
    return {c.partition_id: c.sequence_number for c in await rig.store.list_checkpoints(REF)}


async def own_all(processor: EventProcessor, partitions: int, steps: int = 20) -> None:
    """Step ``processor`` until it owns ``partitions`` partitions (balanced claims one per cycle)."""
    for _ in range(steps):
        await processor.step()
        if len(processor.coordinator.owned) == partitions:
            return
    raise AssertionError(f"owns {sorted(processor.coordinator.owned)} after {steps} cycles")
