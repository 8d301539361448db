"""Store requests per worker per cycle, on every real store (`make bench`).

Four workers (each with its own store client, as four processes would have) balance 32 partitions
with the real coordinator; once balanced, five more cycles each are measured: store requests (the
coordinator's calls), what they cost on the wire (HTTP requests for Blob, SQL statements for SQL),
and the cycle's duration. Servers are started here on free loopback ports and stopped at the end.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tests.benchmarks.size import size

PARTITIONS = size(32, 8)
WORKERS = size(4, 2)
MEASURED = size(5, 1)


async def measure(strategy: str, make_store: Callable[[], Awaitable[Any]]) -> dict[str, float | str]:
    from balancer.lease import Coordinator
    from balancer.model import HubRef, partition_ids
    from balancer.strategies import get_strategy

    ref = HubRef("bench.example", f"sensors-{strategy}-{time.monotonic_ns()}", "$Default")

    async def pids() -> tuple[str, ...]:
        return partition_ids(PARTITIONS)

    stores = [await make_store() for _ in range(WORKERS)]
    workers = [
        Coordinator(ref=ref, owner_id=f"w{i}", store=s, partitions=pids, strategy=get_strategy(strategy), expiry=60.0)
        for i, s in enumerate(stores)
    ]
    for _ in range(PARTITIONS + 5):  # balance first (balanced claims one partition per cycle)
        for w in workers:
            await w.cycle()
        counts = sorted(len(w.owned) for w in workers)
        if sum(counts) == PARTITIONS and counts[-1] - counts[0] <= 1:
            break
    requests, wire, seconds = [], [], []
    for _ in range(MEASURED):
        for w, s in zip(workers, stores, strict=True):
            before = getattr(s, "statements", None), getattr(s, "requests", 0)
            report = await w.cycle()
            requests.append(report.requests)
            if before[0] is not None:
                wire.append(s.statements - before[0])
            else:
                wire.append(s.requests - before[1])
            seconds.append(report.seconds)
    for s in stores:
        closer = getattr(s, "aclose", None) or getattr(s, "close", None)
        if closer is not None:
            result = closer()
            if asyncio.iscoroutine(result):
                await result
    return {
        "requests": statistics.median(requests),
        "wire": statistics.median(wire),
        "cycle_ms": statistics.median(seconds) * 1000,
    }


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-stores-")))
        os.environ["LEASEBOARD_VAR_DIR"] = str(tmp)
        os.environ["DATABASE_URL"] = f"sqlite:///{tmp / 'bench.sqlite3'}"
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)

        from balancer.stores.memory import MemoryStore
        from dashboard.sql.store import SqlStore
        from tests.support.databases import add_django_database
        from tests.support.postgres import start_postgres

        shared_memory = MemoryStore()
        backends: list[tuple[str, str, Callable[[], Awaitable[Any]]]] = []

        async def memory() -> Any:
            return shared_memory

        backends.append(("memory", "store calls", memory))

        async def sqlite() -> Any:
            return SqlStore("default")

        backends.append(("sql (SQLite)", "SQL statements", sqlite))
        try:
            pg = start_postgres()
            stack.callback(pg.stop)
            add_django_database("postgres", pg.url)
            call_command("migrate", database="postgres", verbosity=0)

            async def postgres() -> Any:
                return SqlStore("postgres")

            backends.append(("sql (PostgreSQL)", "SQL statements", postgres))
        except Exception as exc:
            print(f"PostgreSQL not measured: {exc}")
        try:
            from balancer.stores.blob.store import BlobStore
            from tests.support.azurite import start_azurite

            azurite = start_azurite()
            stack.callback(azurite.stop)

            async def blob() -> Any:
                return BlobStore(azurite.connection_string, "bench")

            backends.append(("blob (Azurite)", "HTTP requests", blob))
        except Exception as exc:
            print(f"Blob not measured: {exc}")
        try:
            from balancer.stores.redis.store import RedisStore
            from tests.support.redis_server import start_redis

            redis_server = start_redis()
            stack.callback(redis_server.stop)

            async def redis() -> Any:
                return RedisStore(redis_server.url)

            backends.append(("redis", "store calls", redis))
        except Exception as exc:
            print(f"Redis not measured: {exc}")

        rows = []
        for strategy in ("cooperative", "balanced"):
            for name, unit, make in backends:
                figures = asyncio.run(measure(strategy, make))
                rows.append((strategy, name, figures, unit))
        print_table(rows)


def print_table(rows: list[tuple[str, str, dict[str, float | str], str]]) -> None:
    title = f"store requests per worker per steady cycle ({WORKERS} workers, {PARTITIONS} partitions, median)"
    header = ("strategy", "store", "store requests", "on the wire", "cycle ms")
    lines = [
        (s, n, f"{f['requests']:g}", f"{f['wire']:g} {unit}", f"{float(f['cycle_ms']):.1f}") for s, n, f, unit in rows
    ]
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for column in header:
            table.add_column(column)
        for line in lines:
            table.add_row(*line)
        Console(width=120).print(table)
    except ImportError:
        print(title)
        for line in [header, *lines]:
            print("  ".join(f"{cell:<22}" for cell in line))


if __name__ == "__main__":
    main()
