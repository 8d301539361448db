"""End to end on a real Spark standalone cluster, exactly once through every kind of crash.

A master and two one-core workers run as separate JVM processes on loopback
(``tests.support.spark_cluster``). Two real ``runworkers`` processes land a known set of events (one
SIGKILLed midway, so part of its work lands twice); ``runpipeline --master spark://…`` runs on the
cluster beside them. In the middle of a batch one Spark worker is SIGKILLed with its executor (a
node dying), and later, in the middle of another batch, the driver itself. A restarted
``runpipeline --once`` finishes the landing; every produced event is counted exactly once and every
alert raised once, in the Parquet results and in the database. Waiting is polling with a deadline.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from tests.support.processes import manage, sql_site_fixtures
from tests.support.spark_cluster import Cluster, spark_cluster
from workers.pipeline import cluster as spark_view

from .helpers import alert_kind, assert_newest_alerts_kept, expected_aggregates, expected_minutes
from .test_end_to_end import PARTITIONS, REF, Producer, Site, read_aggregates, read_alerts, read_summary

# Five JVMs (master, two workers, driver, executor) beside the rest of the suite on two cores: 100 s on
# a quiet machine, and CI once cut it at pytest-timeout's 300 s in mid-run (which phase is now printed
# by ``site.until``). Each phase has its own deadline; the whole gets twice the usual bound.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with spark_cluster(tmp_path / "spark", wait=False) as cluster:  # starts while the landing workers do
        yield cluster


environment, site = sql_site_fixtures(Site, REF, partitions=PARTITIONS)


def in_flight(checkpoint: Path, after: int) -> int | None:
    """The id of a batch past ``after`` that Spark has planned (offsets written) but not committed."""
    offsets = {int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*")}
    commits = {int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")}
    running = [n for n in offsets - commits if n > after]
    return min(running) if running else None


def committed(checkpoint: Path, batch_id: int) -> bool:
    return (checkpoint / "commits" / str(batch_id)).exists()


async def kill_midway(site: Site, checkpoint: Path, after: int) -> int:
    """SIGKILL the driver (its process group) in the middle of a batch past ``after``; that batch's id.
    The driver is frozen (SIGSTOP) before it is judged: a batch seen in flight may commit before a
    kill lands on a busy machine, so one found committed once frozen is let go (SIGCONT) and the next
    batch is taken instead."""
    group = site.processes["pipeline"].pid
    for _ in range(5):
        cut: int = await site.until(partial(in_flight, checkpoint, after), 60, "another batch in flight")
        os.killpg(group, signal.SIGSTOP)
        if not committed(checkpoint, cut):
            os.killpg(group, signal.SIGKILL)
            site.processes["pipeline"].wait(10)
            assert not committed(checkpoint, cut), "the batch committed though its driver was frozen"
            return cut
        os.killpg(group, signal.SIGCONT)
        after = cut
    raise AssertionError("five batches in a row committed before their driver could be frozen")


async def test_on_a_cluster_a_lost_spark_worker_and_a_killed_driver_still_count_every_event_once(
    site: Site, cluster: Cluster
) -> None:
    checkpoint = site.root / "var" / "pipeline" / REF.hub / "checkpoint"
    driver_env = {**site.env, **cluster.env}
    pipeline = ("runpipeline", "--hub", REF.hub, "--master", cluster.url)
    site.start_worker("A")
    site.start_worker("B")
    await asyncio.to_thread(cluster.ready)
    site.spawn("pipeline", manage(*pipeline, "--trigger-seconds", "1"), driver_env, start_new_session=True)

    async def balanced() -> bool:
        owners = list((await site.owners()).values())
        return len(owners) == PARTITIONS and owners.count("A-0") == owners.count("B-0") == PARTITIONS // 2

    await site.until(balanced, 60, "A and B to share the partitions")
    a_partitions = {p for p, o in (await site.owners()).items() if o == "A-0"}
    producer = Producer(site.hub)
    producer.thread.start()
    await site.until(lambda: committed(checkpoint, 0), 240, "the pipeline's first batch on the cluster")

    async def a_has_landed_past_its_checkpoint() -> bool:
        points, ends = await site.checkpoints(), site.landed_ends()
        return any(p in points and ends.get(p, -1) > points[p] for p in a_partitions)

    await site.until(a_has_landed_past_its_checkpoint, 60, "A to checkpoint and land more after it")
    site.processes["A"].send_signal(signal.SIGKILL)

    # A node dies in the middle of a batch: its worker and executor, SIGKILLed as a group.
    lost = await site.until(lambda: in_flight(checkpoint, 0), 60, "a batch in flight on the cluster")
    cluster.workers[0].kill()
    await site.until(lambda: committed(checkpoint, lost), 120, f"batch {lost} to finish without the lost node")

    # The driver dies in the middle of a later batch (its JVM with it: the same process group).
    cut = await kill_midway(site, checkpoint, lost)

    producer.release.set()
    producer.thread.join(60)
    assert producer.done.is_set(), f"the producer is still sending after 60 s ({producer.sent} sent)"
    last = site.last()

    async def all_landed_and_checkpointed() -> bool:
        return await site.checkpoints() == last

    await site.until(all_landed_and_checkpointed, 60, "B to take over and land everything")
    cluster.workers[0].start()  # the node is back for the restarted driver
    site.spawn("pipeline-again", manage(*pipeline, "--once"), driver_env, start_new_session=True)
    await site.until(lambda: site.processes["pipeline-again"].poll() is not None, 150, "the restarted run to end")
    assert site.processes["pipeline-again"].returncode == 0, site.log("pipeline-again")[-3000:]
    assert committed(checkpoint, cut), "the restart did not replay the batch the kill cut short"
    view = spark_view.read(checkpoint.parent)  # what /pipeline/ shows: the master and its executors
    assert view is not None and view["master"] == cluster.url
    assert [e for e in view["executors"] if not e["driver"]], "no executor on the cluster"

    landed = site.landed_keys()
    assert list(site.archive.rglob("*.parquet")), "no landing file was archived: the landing is never cleaned"
    assert set(landed) == set(producer.readings), "landing differs from the well-formed events produced"
    assert len(landed) > len(set(landed)), "nothing landed twice: the worker's kill proved nothing"
    readings = list(producer.readings.values())
    assert read_aggregates(site.results) == expected_aggregates(readings)
    summary = await sync_to_async(read_summary)(site.alias)
    assert summary.minutes == expected_minutes(readings)
    assert sum(events for events, _ in summary.batches) == len(set(landed))

    expected = {key: kind for key, e in producer.readings.items() if (kind := alert_kind(e)) is not None}
    assert len(expected) > 50
    raised = read_alerts(site.results)
    assert len(raised) == len(set(raised)) and dict(raised) == expected
    assert_newest_alerts_kept(summary.alerts, producer.readings)
