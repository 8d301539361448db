"""The monitor: lag in seconds from enqueued times, statuses over sampled windows, rates, handoff times.

Rounds are driven one by one (``Monitor.round``) against the SQL store and a real embedded hub whose
clock the test sets, so enqueued times are known exactly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.conf import LazySettings
from prometheus_client import REGISTRY

from balancer.model import BalancerEvent, Checkpoint, EventKind, HubRef, Member, OwnershipRecord
from dashboard.live.broadcast import apublish
from dashboard.live.console import ConsoleState
from dashboard.live.host import Host
from dashboard.live.monitor import Monitor
from dashboard.models import LagSample
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

from .conftest import timed_events

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def host(settings: LazySettings, stores: Stores) -> AsyncIterator[Host]:
    settings.LEASEBOARD_LAG_SAMPLE_SECONDS = 0.001  # a sample every round
    settings.LEASEBOARD_LAG_WINDOW = 3
    settings.LEASEBOARD_LAG_STOP_SECONDS = 3600.0
    made = Host()
    yield made
    await asyncio.to_thread(made.stop)


def partition(state: ConsoleState, pid: str) -> dict[str, Any]:
    row = state.partition(pid)
    assert row is not None
    return row.as_json()


async def own(stores: Stores, ref: HubRef, worker: str, *partitions: str) -> None:
    await stores.controls.heartbeat(Member(ref, worker, 0.0))
    await stores.ownership.claim_ownership([OwnershipRecord(ref, p, worker) for p in partitions])


async def test_lag_in_seconds_is_the_newest_event_minus_the_checkpointed_one(
    host: Host, stores: Stores, hub: EmbeddedHub, ref: HubRef, settings: LazySettings
) -> None:
    timed_events(settings, ref, "0", [1000.0 + i for i in range(10)])  # sequence numbers 0..9
    timed_events(settings, ref, "1", [2000.0, 2004.5])
    await own(stores, ref, "w1", "0")
    await stores.checkpoints.update_checkpoint(Checkpoint(ref, "0", 3, None), "w1")
    monitor = Monitor(ref, host.db)

    await monitor.round(stores)

    assert monitor.state is not None
    p0, p1, p2 = (partition(monitor.state, p) for p in "012")
    assert (p0["lag"], p0["lag_seconds"]) == (6, 6.0)  # enqueued 1009 against 1003
    assert (p1["lag"], p1["lag_seconds"]) == (2, 4.5)  # no checkpoint: against the first retained event
    assert (p2["lag"], p2["lag_seconds"]) == (0, 0.0)


async def test_a_frozen_checkpoint_becomes_stall_and_a_new_monitor_remembers_it(
    host: Host, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    hub.send_batch([b"{}"] * 5, partition_id="2")
    await own(stores, ref, "w1", "2")
    await stores.checkpoints.update_checkpoint(Checkpoint(ref, "2", 1, None), "w1")
    monitor = Monitor(ref, host.db)

    statuses = []
    for _ in range(3):  # a full window of samples, the checkpoint never moving
        await monitor.round(stores)
        assert monitor.state is not None
        statuses.append(partition(monitor.state, "2")["lag_status"])
    assert statuses == ["OK", "OK", "STALL"]
    assert monitor.state is not None and partition(monitor.state, "0")["lag_status"] == "OK"

    rows = await database_sync_to_async(lambda: list(LagSample.objects.filter(partition_id="2").order_by("at")))()
    assert [(r.sequence_number, r.lag, r.status, r.owner_id) for r in rows] == [(1, 3, "OK", "w1")] * 2 + [
        (1, 3, "STALL", "w1")
    ]

    restarted = Monitor(ref, host.db)
    await restarted.round(stores)
    assert restarted.state is not None and partition(restarted.state, "2")["lag_status"] == "STALL"


async def test_no_checkpoint_for_the_stop_period_is_stop(
    host: Host, stores: Stores, hub: EmbeddedHub, ref: HubRef, settings: LazySettings
) -> None:
    settings.LEASEBOARD_LAG_STOP_SECONDS = 0.001  # the checkpoint below is older than that by the first sample
    hub.send_batch([b"{}"] * 4, partition_id="3")
    await own(stores, ref, "w1", "3")
    await stores.checkpoints.update_checkpoint(Checkpoint(ref, "3", 0, None), "w1")
    monitor = Monitor(ref, host.db)

    await monitor.round(stores)

    assert monitor.state is not None and partition(monitor.state, "3")["lag_status"] == "STOP"


async def test_checkpointed_rates_add_up_per_worker(host: Host, stores: Stores, hub: EmbeddedHub, ref: HubRef) -> None:
    hub.send_batch([b"{}"] * 100, partition_id="0")
    hub.send_batch([b"{}"] * 100, partition_id="1")
    await own(stores, ref, "w1", "0", "1")
    monitor = Monitor(ref, host.db)
    for sequence in (9, 49):
        for pid in "01":
            await stores.checkpoints.update_checkpoint(Checkpoint(ref, pid, sequence, None), "w1")
        await monitor.round(stores)

    assert monitor.state is not None
    rates = [partition(monitor.state, p)["events_per_second"] for p in "01"]
    (w1,) = monitor.state.workers
    assert rates[0] > 0 and rates[0] == rates[1]
    assert w1.events_per_second == pytest.approx(sum(rates), abs=0.2)


async def test_a_handoff_is_timed_from_the_release_to_the_next_claim(
    host: Host, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    def count() -> float:
        return REGISTRY.get_sample_value("leaseboard_handoff_duration_seconds_count") or 0.0

    def total() -> float:
        return REGISTRY.get_sample_value("leaseboard_handoff_duration_seconds_sum") or 0.0

    monitor = Monitor(ref, host.db)
    await monitor.round(stores)  # the tail starts at the end of the log
    before, summed = count(), total()
    now = time.time()
    await apublish(BalancerEvent(EventKind.RELEASE, ref, "1", None, "w1", "w1", "handed off", now, handoff=True))
    await apublish(BalancerEvent(EventKind.CLAIM, ref, "1", "w2", None, "w2", "released", now + 1.25))
    await monitor.round(stores)

    assert count() == before + 1
    assert total() - summed == pytest.approx(1.25)


async def test_samples_older_than_the_retention_are_pruned(
    host: Host, stores: Stores, hub: EmbeddedHub, ref: HubRef, settings: LazySettings
) -> None:
    settings.LEASEBOARD_LAG_RETENTION_SECONDS = 600.0
    old = LagSample(**LagSample.scope(ref), partition_id="0", at=time.time() - 3600, lag=1)
    await database_sync_to_async(old.save)()
    monitor = Monitor(ref, host.db)

    await monitor.round(stores)

    def ages() -> list[float]:
        return [time.time() - at for at in LagSample.objects.values_list("at", flat=True)]

    kept = await database_sync_to_async(ages)()
    assert kept and max(kept) < 600  # the hour-old row is gone, this round's are there


async def test_a_running_monitor_wakes_its_subscribers_and_serves_a_fresh_state(
    host: Host, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    woken = asyncio.Event()
    loop = asyncio.get_running_loop()
    monitor = host.monitor(ref)

    def wake() -> None:
        loop.call_soon_threadsafe(woken.set)

    monitor.subscribe(wake)

    await asyncio.wait_for(woken.wait(), 10)

    state = monitor.fresh(max_age=5.0)
    assert state is not None and len(state.partitions) == 4
    assert host.monitor(ref) is monitor  # one per hub and consumer group
