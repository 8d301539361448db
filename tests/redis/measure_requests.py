"""How many Redis round trips one race worker makes per normal lease time in steady state.

Run: ``.venv/bin/python -m tests.redis.measure_requests [--partitions P] [--workers N]``. Starts a
throwaway redis-server, runs N ``RaceCoordinator``s in this process on it (the Redis race backend
and ``RedisStore`` for ownership records, heartbeats and controls: every call a Redis round trip),
each cycling as ``runworkers`` does, with 001's spans scaled by ``--scale`` and the interval
scaled alike (the default 60 s lease and 2 s interval: 30 cycles per lease time). Once balanced,
it counts each worker's round trips over ``--leases`` normal lease times. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from balancer.model import HubRef, partition_ids
from balancer.race.coordinator import RaceCoordinator
from balancer.race.redis import RedisRaceBackend
from balancer.race.times import RaceTimes
from balancer.stores.redis.store import RedisStore
from tests.support.redis_server import start_redis
from tests.support.waiting import until

REF = HubRef("measure.example", "sensors", "$Default")


async def measure(partitions: int, workers: int, scale: float, leases: int) -> dict[str, float]:
    server = start_redis()
    defaults = RaceTimes()
    times = RaceTimes(
        normal_lease=defaults.normal_lease * scale,
        maximum_lease=defaults.maximum_lease * scale,
        maximum_shutdown=defaults.maximum_shutdown * scale,
        minimum_lease_grab=defaults.minimum_lease_grab * scale,
        leases_held_delay=0.05,
    )
    interval = 2.0 * scale
    try:
        async with RedisStore(server.url) as store:

            async def pids() -> tuple[str, ...]:
                return partition_ids(partitions)

            nodes = [
                RaceCoordinator(REF, f"w{i}", store, RedisRaceBackend(store, REF), pids, times, controls=store)
                for i in range(workers)
            ]

            async def run(node: RaceCoordinator) -> None:
                while True:
                    await node.cycle()
                    await asyncio.sleep(interval)

            tasks = [asyncio.create_task(run(n)) for n in nodes]

            def balanced() -> bool:
                counts = [len(n.owned) for n in nodes]
                return sum(counts) == partitions and max(counts) - min(counts) <= 1

            await until(
                balanced,
                "a balanced share",
                10 * times.normal_lease,
                step=0.05,
                detail=lambda: f"owned {[len(n.owned) for n in nodes]}",
            )
            before = [n.requests for n in nodes]
            await asyncio.sleep(leases * times.normal_lease)
            per_lease = [(n.requests - b) / leases for n, b in zip(nodes, before, strict=True)]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for node in nodes:
                await node.release_all()
    finally:
        server.stop()
    return {"median": statistics.median(per_lease), "max": max(per_lease), "cycles_per_lease": 30.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--scale", type=float, default=0.1, help="spans and interval times this (default 0.1)")
    parser.add_argument("--leases", type=int, default=5, help="normal lease times counted (default 5)")
    args = parser.parse_args()
    result = asyncio.run(measure(args.partitions, args.workers, args.scale, args.leases))
    print(
        f"{args.partitions} partitions, {args.workers} workers, 30 cycles per normal lease time: Redis round "
        f"trips per worker per normal lease time: median {result['median']:.0f}, max {result['max']:.0f}"
    )


if __name__ == "__main__":
    main()
