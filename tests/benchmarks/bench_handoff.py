"""A planned move, timed end to end (`make bench`; issue 15, item 1): real ``runworkers`` processes.

Worker A holds every partition of a hub that receives events all the time; worker B joins, and A
hands half the partitions over. Per moved partition the bench prints:

- **release to first event**: from the release, as the store recorded it (the first sample, every
  5 ms, that no longer shows A), to the first event B's handler got on that partition;
- **handler gap**: from the last event A's handler got to the first one B's got: what a consumer of
  the partition sees (it includes A's checkpoint and release).

On PostgreSQL (``LISTEN/NOTIFY``), on Redis (pub/sub) and on Azure Blob Storage (Azurite), which has
no notification of its own: there the notices go through the channel layer (``channels_redis`` on a
Redis of the bench's own, ``REDIS_URL`` set for both cases). Each with release notices and without
them (``--no-release-notices``: B claims at its next quick cycle, a quarter interval while it waits for
a handoff). Figures, not assertions: ``tests/workers/test_release_notices.py`` and
``tests/workers/test_layer_notices.py`` hold the bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from tests.benchmarks.django_env import temporary_django
from tests.benchmarks.size import size

PARTITIONS = 4
INTERVAL, EXPIRY = size((2.0, 10.0), (0.5, 3.0))  # the tiny run (make test) cycles faster
SAMPLE = 0.005  # seconds between two reads of the ownership records
SEND_EVERY = 0.005  # seconds between two events on each partition
TIMEOUT = 60.0


class TimedHandler:
    """``--handler tests.benchmarks.bench_handoff.TimedHandler``: appends "partition,owner,wall time"
    for each event to ``$LEASEBOARD_RECORD_DIR/<pid>.csv``."""

    def __init__(self) -> None:
        directory = Path(os.environ["LEASEBOARD_RECORD_DIR"])
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file: TextIO = (directory / f"{os.getpid()}.csv").open("a", encoding="utf-8")

    def __call__(self, event: Any, ctx: Any) -> None:
        with self._lock:
            self._file.write(f"{event.partition_id},{ctx.owner_id},{time.time():.6f}\n")
            self._file.flush()


def handled(directory: Path) -> dict[tuple[str, str], list[float]]:
    """(partition, owner) -> the wall times its events were handled, in order."""
    out: dict[tuple[str, str], list[float]] = {}
    for path in directory.glob("*.csv"):
        for line in path.read_text(encoding="utf-8").split("\n")[:-1]:
            partition, owner, at = line.split(",")
            out.setdefault((partition, owner), []).append(float(at))
    return out


async def one_move(kit: Any, root: Path, notices: bool) -> dict[str, tuple[float, float]]:
    """Per moved partition: (release to B's first event, A's last event to B's first), in seconds."""
    from balancer.model import HubRef
    from tests.support.processes import Processes, manage, worker_env
    from workers.hub.embedded import EmbeddedHub

    ref = HubRef("localhost", f"handoff-{root.name}", "$Default")  # a hub of its own: nothing left from before
    hub = EmbeddedHub(root / "hub", ref.hub, partitions=PARTITIONS)
    env = worker_env(root, **kit.env())
    env["LEASEBOARD_LOG_LEVEL"] = os.environ.get("BENCH_LOG_LEVEL", "WARNING")
    processes = Processes(root)
    samples: list[tuple[float, dict[str, str]]] = []  # (wall time, partition -> owner)
    store = await kit.open()

    async def sample() -> None:
        while True:
            with contextlib.suppress(Exception):
                records = await store.list_ownership(ref)
                samples.append((time.time(), {r.partition_id: r.owner_id for r in records}))
            await asyncio.sleep(SAMPLE)

    async def produce() -> None:
        n = 0
        while True:
            for pid in hub.partition_ids():
                await asyncio.to_thread(hub.send, f'{{"n": {n}}}'.encode(), partition_id=pid)
            n += 1
            await asyncio.sleep(SEND_EVERY)

    def start(name: str) -> None:
        processes.spawn(
            name,
            manage(
                "runworkers",
                "--count",
                "1",
                "--owner-prefix",
                name,
                "--store",
                kit.store,
                "--source",
                "embedded",
                "--hub",
                ref.hub,
                "--interval",
                str(INTERVAL),
                "--expiry",
                str(EXPIRY),
                "--shutdown-timeout",
                "5",
                "--handler",
                "tests.benchmarks.bench_handoff.TimedHandler",
                "--release-notices" if notices else "--no-release-notices",
            ),
            env,
        )

    def owners() -> dict[str, str]:
        return samples[-1][1] if samples else {}

    tasks = [asyncio.create_task(sample()), asyncio.create_task(produce())]
    try:
        start("A")
        await processes.until(lambda: owners() == dict.fromkeys(hub.partition_ids(), "A-0"), TIMEOUT, "A owns all")
        joined = len(samples)
        start("B")
        await processes.until(lambda: sorted(owners().values()) == ["A-0"] * 2 + ["B-0"] * 2, TIMEOUT, "a 2/2 split")
        moved = sorted(p for p, o in owners().items() if o == "B-0")
        got = root / "records"
        await processes.until(lambda: all((p, "B-0") in handled(got) for p in moved), TIMEOUT, "B's first events")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        processes.kill_all()
        await kit.close(store)
        hub.close()
    times = handled(root / "records")
    out = {}
    for pid in moved:
        released = min(t for t, seen in samples[joined:] if seen.get(pid) != "A-0")
        first_b = times[(pid, "B-0")][0]
        last_a = max(t for t in times[(pid, "A-0")] if t < first_b)
        out[pid] = (first_b - released, first_b - last_a)
    return out


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:7.0f} {max(values) * 1000:7.0f}"


STORES = ["postgresql", "redis", "blob"]


def blob_kit(url: str) -> Any:
    """The Blob store on an Azurite of its own, with a Redis of its own for the channel layer
    (``REDIS_URL``): the Blob store has no channel, so notices go through the layer."""
    from tests.chaos.stores import BlobKit
    from tests.support.redis_server import start_redis

    class BlobWithLayer(BlobKit):
        def __post_init__(self) -> None:
            super().__post_init__()
            self.layer = start_redis()

        def env(self) -> dict[str, str]:
            return {**super().env(), "REDIS_URL": self.layer.url}

        def finish(self) -> None:
            super().finish()
            self.layer.stop()

    return BlobWithLayer(url, container="handoff")


def make_kit(name: str, cluster: Any, url: str) -> Any:
    from tests.chaos.stores import RedisKit, SqlKit

    if name == "postgresql":
        return SqlKit(cluster, url)
    return RedisKit(url) if name == "redis" else blob_kit(url)


def run(stores: list[str], rounds: int, tmp: Path) -> None:
    from tests.chaos.stores import DASHBOARD_ALIAS, migrated_database, start_cluster
    from tests.support.databases import remove_django_database

    print(
        f"\nplanned move, real runworkers processes: A holds {PARTITIONS} partitions, B joins, A hands "
        f"{PARTITIONS // 2} over; interval {INTERVAL:g}s, expiry {EXPIRY:g}s, an event every "
        f"{SEND_EVERY * 1000:g} ms per partition; {rounds} round(s), median and max over moved partitions (ms)"
    )
    print(f"{'store':<11} {'notices':<8} {'release->1st event':>18} {'handler gap':>17}")
    print(f"{'':<11} {'':<8} {'median':>9} {'max':>7} {'median':>9} {'max':>7}")
    cluster = start_cluster()
    try:
        url = migrated_database(cluster)
        for name in stores:
            kit = make_kit(name, cluster, url)
            try:
                for notices in (True, False):
                    gaps: list[float] = []
                    releases: list[float] = []
                    for n in range(rounds):
                        root = tmp / f"{name}-{notices}-{n}"
                        root.mkdir()
                        try:
                            got = asyncio.run(asyncio.wait_for(one_move(kit, root, notices), 4 * TIMEOUT))
                        except Exception as exc:  # one case failing must not hide the others
                            print(f"{name:<11} {'on' if notices else 'off':<8} FAILED: {type(exc).__name__}: {exc}")
                            break
                        releases += [r for r, _ in got.values()]
                        gaps += [g for _, g in got.values()]
                    if releases:
                        on = "on" if notices else "off"
                        print(f"{name:<11} {on:<8} {_ms(releases):>18} {_ms(gaps):>17}", flush=True)
            finally:
                if kit.name == "redis":
                    kit.server.stop()
                elif kit.name == "blob":
                    kit.finish()
    finally:
        remove_django_database(DASHBOARD_ALIAS)
        cluster.stop()
    if "blob" in stores:
        print("blob: Azurite; its notices go through the channel layer (channels_redis, REDIS_URL set in both rows)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--store", choices=STORES, action="append", help="default: all three (blob: notices through the channel layer)"
    )
    parser.add_argument("--rounds", type=int, default=size(2, 1), help="moves per case (default 2)")
    options = parser.parse_args(sys.argv[1:] if argv is None else argv)
    with temporary_django("bench-handoff-") as tmp:
        run(options.store or STORES, options.rounds, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
