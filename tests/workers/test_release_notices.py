"""Release notices end to end (issue 15, item 1): real ``runworkers`` processes on PostgreSQL
(``LISTEN/NOTIFY``) and on Redis (pub/sub). Worker A holds every partition; B joins; A hands half
over, and B claims each one as soon as A releases it, not at B's next cycle.

The test samples the store every 10 ms. Per moved partition, the gap from the last sample showing A
to the first showing B bounds, from above, the time it went unowned (A's record names A until the
release). Without notices that gap is up to an interval (5 s here), uniform; with them it is a
store round trip or two: the bound asserted (1 s) is far from both, so it tells the two apart
without timing the machine. The figures are printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from balancer.model import HubRef
from tests.chaos.stores import RedisKit, SqlKit, migrated_cluster
from tests.support.postgres import Postgres
from tests.support.processes import Processes, manage, worker_env
from workers.hub.embedded import EmbeddedHub

pytestmark = pytest.mark.slow

PARTITIONS = 4
INTERVAL, EXPIRY = 5.0, 15.0
BOUND = 1.0  # seconds from A's last sample to B's first, per moved partition
REF = HubRef("localhost", "notices", "$Default")


@pytest.fixture
def database(django_db_blocker: Any) -> Iterator[tuple[Postgres, str]]:
    """A PostgreSQL server of the test's own, its database migrated (the SQL store, and the event log
    of the workers on Redis)."""
    with django_db_blocker.unblock(), migrated_cluster() as made:
        yield made


@pytest.mark.parametrize("store", ["postgresql", "redis"])
async def test_a_joining_worker_claims_each_handed_over_partition_as_soon_as_it_is_released(
    store: str,
    database: tuple[Postgres, str],
    tmp_path: Path,
    django_db_blocker: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster, url = database
    kit: Any = SqlKit(cluster, url) if store == "postgresql" else RedisKit(url)
    hub = EmbeddedHub(tmp_path / "hub", REF.hub, partitions=PARTITIONS)
    env = worker_env(tmp_path, **kit.env())
    processes = Processes(tmp_path)
    samples: list[tuple[float, dict[str, str]]] = []
    with django_db_blocker.unblock():
        observer = await kit.open()

        async def sample() -> None:
            while True:
                with contextlib.suppress(Exception):
                    records = await observer.list_ownership(REF)
                    samples.append((time.monotonic(), {r.partition_id: r.owner_id for r in records}))
                await asyncio.sleep(0.01)

        def owners() -> dict[str, str]:
            return samples[-1][1] if samples else {}

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
                    REF.hub,
                    "--interval",
                    str(INTERVAL),
                    "--expiry",
                    str(EXPIRY),
                    "--handler",
                    "tests.workers.recording.RecordingHandler",
                    "--shutdown-timeout",
                    "5",
                ),
                env,
            )

        sampler = asyncio.create_task(sample())
        try:
            start("A")
            await processes.until(lambda: owners() == dict.fromkeys(hub.partition_ids(), "A-0"), 30, "A to own all")
            joined = len(samples)
            start("B")
            await processes.until(lambda: sorted(owners().values()) == ["A-0"] * 2 + ["B-0"] * 2, 40, "a 2/2 split")
            moved = sorted(p for p, o in owners().items() if o == "B-0")
            gaps = {}
            for pid in moved:
                last_a = max(t for t, seen in samples[joined:] if seen.get(pid) == "A-0")
                first_b = min(t for t, seen in samples[joined:] if seen.get(pid) == "B-0")
                gaps[pid] = first_b - last_a
            released = [pid for pid in moved if any(seen.get(pid) == "" for _, seen in samples[joined:])]
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
            processes.kill_all()
            await kit.close(observer)
            hub.close()
            if store == "redis":
                kit.server.stop()
    with capsys.disabled():
        figures = ", ".join(f"partition {p} {g * 1000:.0f} ms" for p, g in gaps.items())
        print(f"\nrelease notices on {store}: A's last sample to B's first: {figures} (interval {INTERVAL:g}s)")
    assert all(g <= BOUND for g in gaps.values()), f"a handed-over partition waited for B's next cycle: {gaps}"
    assert released or all(g <= 0.1 for g in gaps.values())  # seen released between, or claimed at once
