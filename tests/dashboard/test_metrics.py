"""``/metrics``: store-derived ``leaseboard_…`` series computed at scrape time, plus the default registry."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.conf import LazySettings
from django.test import AsyncClient
from prometheus_client.parser import text_string_to_metric_families

import workers.metrics  # registers the runtime's series on the default registry, as a serving process does
from balancer.model import Checkpoint, HubRef
from dashboard.live.broadcast import apublish
from dashboard.models import LagSample
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

from .conftest import coordinator, event, timed_events

pytestmark = pytest.mark.django_db(transaction=True)

FOREIGN_PREFIXES = ("python_", "process_")  # prometheus_client's own collectors


async def scrape(client: AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics`` as {(name, sorted labels): value}."""
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def labelled(samples: dict[Any, float], name: str, label: str) -> dict[str, float]:
    return {dict(labels)[label]: value for (n, labels), value in samples.items() if n == name}


async def test_metrics_has_owned_partitions_per_worker_and_lag_per_partition(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    w1 = coordinator(stores, ref, "w1", partitions=1)
    await w1.cycle()
    await coordinator(stores, ref, "w2").cycle()
    hub.send_batch([b"{}"] * 8, partition_id="0")
    await stores.checkpoints.update_checkpoint(Checkpoint(ref, "0", 4, "0"), "w1")

    samples = await scrape(async_client)

    assert labelled(samples, "leaseboard_partitions_owned", "worker") == {"w1": 1.0, "w2": 1.0}
    lag = labelled(samples, "leaseboard_checkpoint_lag_events", "partition")
    assert lag == {"0": 3.0, "1": 0.0, "2": 0.0, "3": 0.0}
    assert labelled(samples, "leaseboard_partitions", "status") == {"owned": 2.0, "unowned": 2.0, "expired": 0.0}
    assert labelled(samples, "leaseboard_worker_up", "worker") == {"w1": 1.0, "w2": 1.0}
    assert samples[("leaseboard_store_up", ())] == 1.0
    assert samples[("leaseboard_event_source_up", ())] == 1.0


async def test_metrics_has_lag_in_seconds_and_one_status_series_per_partition_and_status(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef, settings: LazySettings
) -> None:
    settings.LEASEBOARD_LAG_WINDOW = 3
    settings.LEASEBOARD_LAG_SAMPLE_SECONDS = 0.001  # the monitor samples on every round
    timed_events(settings, ref, "1", [2000.0, 2002.5])  # lag 2, no checkpoint: 2.5 s behind its first event
    # Two earlier sampling rounds saw the same lag, read back by the monitor /metrics starts: its first
    # round fills the window of 3, the checkpoint never moved, so partition 1 stalls.
    now = time.time()
    rows = [LagSample(**LagSample.scope(ref), partition_id="1", at=now - age, lag=2, status="OK") for age in (2, 1)]
    await database_sync_to_async(LagSample.objects.bulk_create)(rows)

    samples = await scrape(async_client)  # the first scrape waits for the monitor's first round

    seconds = labelled(samples, "leaseboard_checkpoint_lag_seconds", "partition")
    assert seconds == {"0": 0.0, "1": 2.5, "2": 0.0, "3": 0.0}
    status = {
        (dict(k)["partition"], dict(k)["status"]): v
        for (n, k), v in samples.items()
        if n == "leaseboard_partition_status"
    }
    assert status == {("0", "OK"): 1.0, ("1", "STALL"): 1.0, ("2", "OK"): 1.0, ("3", "OK"): 1.0}  # 0, 2, 3: no lag
    assert labelled(samples, "leaseboard_partitions_by_lag_status", "status")["STALL"] == 1.0


async def test_the_runtime_series_of_the_default_registry_are_included(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    workers.metrics.OWNERSHIP_CHANGES.labels(kind="steal").inc()
    await apublish(event(ref, "1"))

    samples = await scrape(async_client)

    assert samples[("leaseboard_ownership_changes_total", (("kind", "steal"),))] >= 1
    assert ("leaseboard_cycle_duration_seconds_count", ()) in samples
    assert labelled(samples, "leaseboard_balancer_events_logged_total", "kind") == {"claim": 1.0}


async def test_every_series_of_ours_is_named_leaseboard(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    await coordinator(stores, ref, "w1").cycle()

    names = {name for name, _ in await scrape(async_client)}

    ours = {n for n in names if not n.startswith(FOREIGN_PREFIXES)}
    assert ours and all(n.startswith("leaseboard_") for n in ours), sorted(ours)


async def test_the_labels_of_a_worker_that_went_away_vanish(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    w1 = coordinator(stores, ref, "w1")
    await w1.cycle()
    assert "w1" in labelled(await scrape(async_client), "leaseboard_partitions_owned", "worker")

    await w1.release_all()

    # /metrics serves the monitor's state, at most a round (a second) old: w1 is gone within a few.
    deadline = time.monotonic() + 5
    while [key for key in await scrape(async_client) if ("worker", "w1") in key[1]]:
        assert time.monotonic() < deadline, "w1's series are still there"
        await asyncio.sleep(0.1)


async def test_a_store_outage_still_answers_with_store_up_zero(async_client: AsyncClient, settings: Any) -> None:
    settings.LEASEBOARD_STORE = "memory"
    from dashboard.live.state import configured_stores

    memory = configured_stores().ownership
    memory.down = True  # type: ignore[attr-defined]
    try:
        samples = await scrape(async_client)
    finally:
        memory.down = False  # type: ignore[attr-defined]

    assert samples[("leaseboard_store_up", ())] == 0.0
    assert not labelled(samples, "leaseboard_partitions_owned", "worker")
