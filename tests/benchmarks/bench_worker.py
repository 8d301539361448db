"""Events per second through ONE worker on the embedded hub, end to end: the real EventProcessor
(coordinator cycle, one pump per partition, reads in the pumps' threads, handler calls,
checkpoints every ``--checkpoint-events`` events or 1 s) with a trivial handler.

Run: ``.venv/bin/python -m tests.benchmarks.bench_worker [--events N]``. Not collected by pytest
(no ``test_`` prefix). The hub is filled first; the clock runs from the worker's start (its first
cycles and claims included) until the last event was handled. Prints one table.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import django

from tests.benchmarks.size import size

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django.setup()

from django.core.management import call_command  # noqa: E402

from balancer.model import HubRef  # noqa: E402
from balancer.stores.memory import MemoryStore  # noqa: E402
from balancer.strategies import get_strategy  # noqa: E402
from workers.handlers import PartitionContext, batch_handler  # noqa: E402
from workers.hub.embedded import EmbeddedHub  # noqa: E402
from workers.runtime.config import PumpConfig  # noqa: E402
from workers.runtime.processor import EventProcessor  # noqa: E402
from workers.runtime.sink import EventSink  # noqa: E402
from workers.sources.base import ReceivedEvent  # noqa: E402
from workers.wiring import Stores, build_coordinator  # noqa: E402

if TYPE_CHECKING:
    from dashboard.sql.store import SqlStore

REF = HubRef("bench", "bench", "$Default")
BODY = b'{"event_id":"0","home":"home-00042","sensor":"door","sensor_id":"door-1","event":"opened","armed":false}'


def trivial(event: ReceivedEvent, ctx: PartitionContext) -> None:
    """The trivial handler: does nothing with the event."""


async def trivial_async(event: ReceivedEvent, ctx: PartitionContext) -> None:
    """The same, as a coroutine (runs on the event loop instead of the partition's thread)."""


@batch_handler(max_events=500)  # type: ignore[untyped-decorator]  # batch_handler(...) is typed as Any
def trivial_batch(events: list[ReceivedEvent], ctx: PartitionContext) -> None:
    """The same, taking up to 500 events per call."""


def sql_store(root: Path) -> SqlStore:
    """A SqlStore on a fresh, migrated SQLite file (WAL, as in the demo)."""
    from dashboard.sql.store import SqlStore
    from tests.support.databases import add_django_database

    alias = f"bench_{os.getpid()}_{time.monotonic_ns()}"
    add_django_database(
        alias,
        f"sqlite:///{root / 'bench.sqlite3'}",
        timeout=20,
        init_command="PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        transaction_mode="IMMEDIATE",
    )
    call_command("migrate", database=alias, verbosity=0)
    return SqlStore(alias)


async def run(
    events: int,
    partitions: int,
    handler: Callable[..., Any],
    store_kind: str,
    checkpoint_events: int,
    *,
    amqp: bytes = b"",
) -> float:
    """Seconds one worker takes to handle ``events`` events spread over ``partitions`` partitions
    (``amqp``: the AMQP sections every event carries beside its body, as ``bench_tracing`` sends)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        hub = EmbeddedHub(root / "hub", "bench", partitions=partitions)
        per_partition = events // partitions
        for pid in hub.partition_ids():
            for start in range(0, per_partition, 1000):
                n = min(1000, per_partition - start)
                hub.send_batch([BODY] * n, partition_id=pid, amqp=[amqp] * n if amqp else None)
        store = MemoryStore() if store_kind == "memory" else await asyncio.to_thread(sql_store, root)

        async def partition_ids() -> tuple[str, ...]:
            return hub.partition_ids()

        coordinator = build_coordinator(
            REF,
            "bench-0",
            Stores(store, store, store),
            partition_ids,
            strategy=get_strategy(None),
            expiry=30.0,
            on_event=EventSink(),
            rng=random.Random(0),
        )
        config = PumpConfig(checkpoint_events=checkpoint_events, checkpoint_seconds=1.0, max_events=500)
        processor = EventProcessor(
            coordinator, checkpoints=store, source=hub, handler=handler, interval=0.1, pump_config=config
        )
        total = per_partition * partitions
        started = time.perf_counter()
        runner = asyncio.create_task(processor.run())
        while sum(s.processed for s in processor.stats().values()) < total:
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - started
        processor.stop()
        await runner
        checkpointed = {c.partition_id: c.sequence_number for c in await store.list_checkpoints(REF)}
        assert checkpointed == {p: per_partition - 1 for p in hub.partition_ids()}, checkpointed
        if not isinstance(store, MemoryStore):  # the SQL store
            await store.aclose()
        hub.close()
        return elapsed


CASES = [
    ("sync handler, 16 partitions, memory store", 16, trivial, "memory", 100),
    ("sync handler, 16 partitions, SQL store (SQLite)", 16, trivial, "sql", 100),
    ("sync handler, 1 partition, SQL store (SQLite)", 1, trivial, "sql", 100),
    ("sync handler, 16 partitions, SQLite, checkpoint every 10", 16, trivial, "sql", 10),
    ("async handler, 16 partitions, SQL store (SQLite)", 16, trivial_async, "sql", 100),
    ("batch handler (500), 16 partitions, SQLite", 16, trivial_batch, "sql", 100),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=size(160_000, 3_200), help="events per case (default 160000)")
    args = parser.parse_args(argv or [])
    logging.getLogger("leaseboard").setLevel(logging.WARNING)
    print(
        f"one worker, embedded hub, {args.events} events of {len(BODY)} bytes, trivial handler; {os.cpu_count()} cores"
    )
    print(f"{'case':<58} {'seconds':>8} {'events/s':>10}")
    for title, partitions, handler, store_kind, every in CASES:
        seconds = asyncio.run(run(args.events, partitions, handler, store_kind, every))
        print(f"{title:<58} {seconds:>8.2f} {args.events / seconds:>10,.0f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
