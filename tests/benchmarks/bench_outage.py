"""Store outages against real ``runworkers`` processes (`make bench`): what an outage costs.

For PostgreSQL (the SQL store), Redis and Azurite (the Blob store), a small fleet (three
``runworkers --count 1`` processes, interval 2 s, expiry 10 s, 8 partitions of an embedded hub, a
producer writing one event per partition every 20 ms) settles; then the store goes away for 20 s
(twice the expiry) or 50 s (five times), comes back on the same port with its data, and the fleet
recovers. Per case: ownership moves and events handled twice from the outage's start until the
fleet has recovered, seconds from the store's return until every partition is handled again and
until the fleet is balanced and caught up, and events never handled (after a final drain).

Each case has stores of its own (a fresh PostgreSQL cluster for the dashboard tables, and Redis or
Azurite), so no case inherits another's leases or checkpoints. The machinery is the fault-injection
suite's (``tests.chaos``: ``Fleet``, the stores' kits, ``outage_of``, ``ownership_moves``).

One case alone: ``python -m tests.benchmarks.bench_outage --store postgresql --outage 20``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.benchmarks.django_env import temporary_django
from tests.benchmarks.size import size

if TYPE_CHECKING:
    from tests.chaos.stores import Kit

STORES = {"postgresql": "postgresql", "redis": "redis", "azurite": "blob", "blob": "blob"}
OUTAGES = size((20.0, 50.0), (3.0,))
WORKERS = 3
PARTITIONS = 8
INTERVAL = 2.0
EXPIRY = 10.0
RECOVERY_SECONDS = 180.0  # the longest the fleet may take to recover before the case is called failed


@dataclass
class Result:
    store: str
    outage: float  # seconds the store was away (from taking it down to its answering again)
    moves: int
    moved_twice: int  # partitions that moved more than once
    duplicates: int
    resumed: float | None  # seconds from the store's return until every partition was handled again
    recovered: float  # ... until balanced and caught up
    produced: int
    missing: int
    error: str = ""


def run_case(store: str, outage: float, root: Path) -> Result:
    """One case on stores of its own (Django's database aliases are made and removed outside the loop)."""
    from tests.chaos.stores import DASHBOARD_ALIAS, make_kit, migrated_database, start_cluster
    from tests.support.databases import remove_django_database

    cluster = start_cluster()
    try:
        kit = make_kit(store, cluster, migrated_database(cluster))
        try:
            return asyncio.run(measure(kit, outage, root))
        finally:
            getattr(kit, "finish", lambda: None)()
    finally:
        remove_django_database(DASHBOARD_ALIAS)
        cluster.stop()


async def measure(kit: Kit, outage: float, root: Path) -> Result:
    from tests.chaos.faults import PostCheck, new_name, outage_of
    from tests.chaos.fleet import Fleet
    from tests.chaos.rules import ownership_moves, repeats

    opened = await kit.open()
    fleet = Fleet(kit, root, opened, interval=INTERVAL, expiry=EXPIRY, partitions=PARTITIONS)
    sampler = asyncio.create_task(fleet.sample())
    try:
        for _ in range(WORKERS):
            fleet.start(new_name())
        fleet.start_producing()
        await fleet.settle(RECOVERY_SECONDS)
        checks: list[PostCheck] = []
        started = time.monotonic()
        await outage_of(outage)(fleet, checks)
        fault = fleet.faults[-1]
        await fleet.settle(RECOVERY_SECONDS)
        recovered = time.monotonic()
        fleet.stop_producing()
        await fleet.settle(RECOVERY_SECONDS)  # the last events too: then anything unhandled is lost
        evidence = await fleet.evidence()
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        fleet.shutdown()
        await kit.close(opened)
    moves = [m for m in ownership_moves(evidence) if started <= m.at <= recovered]
    per_partition = [m.partition for m in moves]
    again = [repeat for _, repeat in repeats(evidence.handlings) if repeat.at >= started]
    firsts = []
    for pid in evidence.produced:
        after = [h.at for h in evidence.handlings if h.partition == pid and h.at >= fault.ended]
        firsts.append(min(after) if after else None)
    resumed = None if None in firsts else max(at for at in firsts if at is not None) - fault.ended
    handled = {(h.partition, h.sequence) for h in evidence.handlings}
    produced = sum(len(events) for events in evidence.produced.values())
    return Result(
        store=kit.name,
        outage=fault.ended - fault.started,
        moves=len(moves),
        moved_twice=sum(1 for pid in set(per_partition) if per_partition.count(pid) > 1),
        duplicates=len(again),
        resumed=resumed,
        recovered=recovered - fault.ended,
        produced=produced,
        missing=produced - len(handled),
    )


def line(result: Result) -> str:
    if result.error:
        return f"{result.store:<11} {result.outage:>6.0f}s  FAILED: {result.error}"
    resumed = "never" if result.resumed is None else f"{result.resumed:.1f}"
    return (
        f"{result.store:<11} {result.outage:>6.1f}s  {result.moves:>5}  {result.moved_twice:>11}  "
        f"{result.duplicates:>10}  {resumed:>12}  {result.recovered:>13.1f}  {result.produced:>8}  {result.missing:>7}"
    )


HEADER = (
    f"{'store':<11} {'outage':>7}  {'moves':>5}  {'moved twice':>11}  {'duplicates':>10}  {'handled again':>12}  "
    f"{'caught up (s)':>13}  {'produced':>8}  {'missing':>7}"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--store", choices=sorted(STORES), action="append", help="default: postgresql, redis, azurite")
    parser.add_argument("--outage", type=float, action="append", help="seconds (default: 20 and 50)")
    options = parser.parse_args(sys.argv[1:] if argv is None else argv)
    stores = [STORES[s] for s in options.store or ["postgresql", "redis", "azurite"]]
    outages = options.outage or list(OUTAGES)

    with temporary_django("bench-outage-") as tmp:
        print(
            f"store outages: {WORKERS} runworkers processes, {PARTITIONS} partitions, interval {INTERVAL:g}s, "
            f"expiry {EXPIRY:g}s, 50 events/s per partition; moves and duplicates from the outage's start until "
            "the fleet recovered; 'handled again' and 'caught up': seconds after the store answered again"
        )
        print(HEADER, flush=True)
        failed = 0
        for store in stores:
            for outage in outages:
                root = Path(tmp) / f"{store}-{outage:g}"
                root.mkdir()
                try:
                    result = run_case(store, outage, root)
                except Exception as exc:  # one case failing must not hide the others
                    first = str(exc).splitlines()[0] if str(exc) else ""
                    result = Result(store, outage, 0, 0, 0, None, 0.0, 0, 0, f"{type(exc).__name__}: {first[:200]}")
                    failed += 1
                print(line(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
