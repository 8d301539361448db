"""``/api/groups`` and the groups page: every hub and consumer group the store knows, at a glance,
against the SQL store and a real embedded hub (and a Redis nobody listens on, for the outage)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.conf import LazySettings
from django.contrib.auth.models import User
from django.test import AsyncClient

from balancer.model import Checkpoint, HubRef
from dashboard.live import state
from dashboard.live.health import health
from dashboard.live.host import host
from dashboard.models import LagSample
from tests.dashboard.api_document import conforms_response
from tests.support.servers import free_port
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores, hub_ref

from .conftest import PARTITIONS, coordinator

pytestmark = pytest.mark.django_db(transaction=True)

GROUP_KEYS = {
    "hub",
    "consumer_group",
    "partitions",
    "owned",
    "workers",
    "workers_alive",
    "workers_draining",
    "lag",
    "lag_status",
    "by_lag_status",
    "desired_workers",
    "desired_reason",
    "sampled_at",
    "source",
    "fleet_url",
}


async def get_groups(client: AsyncClient) -> dict[str, Any]:
    response = await client.get("/api/groups")
    assert response.status_code == 200, response.content
    conforms_response("GET", "/api/groups", response)
    data: dict[str, Any] = response.json()
    return data


def by_group(data: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(g["hub"], g["consumer_group"]): g for g in data["groups"]}


def stalled_round(ref: HubRef, at: float, statuses: dict[str, str]) -> None:
    """A stored sampling round of ``ref`` in which each partition has the status given."""
    LagSample.objects.bulk_create(
        LagSample(**LagSample.scope(ref), partition_id=pid, at=at, lag=5, status=status)
        for pid, status in statuses.items()
    )


async def test_every_group_the_store_knows_is_listed_with_its_figures_and_fleet_link(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    audit = HubRef(ref.namespace, ref.hub, "audit")
    other_namespace = HubRef("elsewhere.example", ref.hub, "$Default")
    for each in (ref, other_namespace):
        await coordinator(stores, each, "w1").cycle()  # balanced: one partition a cycle
    await coordinator(stores, audit, "w1", partitions=1).cycle()  # partition 0
    await coordinator(stores, audit, "w2").cycle()
    hub.send_batch([b"{}"] * 10, partition_id="0")  # sequence numbers 0..9
    hub.send_batch([b"{}"] * 2, partition_id="1")
    await stores.checkpoints.update_checkpoint(Checkpoint(audit, "0", 6, "0"), "w1")
    now = await stores.ownership.now()
    await database_sync_to_async(stalled_round)(audit, now, {"0": "STALL", "1": "WARN", "2": "OK", "3": "OK"})

    data = await get_groups(async_client)

    assert (data["namespace"], data["store"], data["store_requests"]) == (ref.namespace, "sql", 1)
    assert list(by_group(data)) == [(ref.hub, "$Default"), (ref.hub, "audit")]  # not the other namespace's
    mine, theirs = by_group(data)[(ref.hub, "$Default")], by_group(data)[(ref.hub, "audit")]
    assert set(mine) == GROUP_KEYS
    assert (mine["owned"], mine["partitions"], mine["workers_alive"]) == (1, PARTITIONS, 1)
    assert (theirs["owned"], theirs["partitions"], theirs["workers_alive"]) == (2, PARTITIONS, 2)
    assert mine["lag"] == 12 and theirs["lag"] == 5  # events behind: all 12 without a checkpoint; 6 checkpointed
    assert theirs["lag_status"] == "STALL" and theirs["by_lag_status"]["WARN"] == 1  # the worst of the round
    assert isinstance(mine["desired_workers"], int) and mine["source"]["available"] is True
    assert theirs["fleet_url"] == "/?hub=sensors&consumer_group=audit"
    assert mine["fleet_url"] == "/?hub=sensors&consumer_group=%24Default"
    page = await async_client.get(theirs["fleet_url"])
    assert page.status_code == 200 and b'data-consumer-group="audit"' in page.content


async def test_a_group_no_round_sampled_has_no_lag_status_and_one_with_no_lag_is_ok(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    quiet = HubRef(ref.namespace, ref.hub, "quiet")
    await coordinator(stores, quiet, "w1").cycle()
    hub.send_batch([b"{}"] * 2, partition_id="1")

    found = by_group(await get_groups(async_client))[(ref.hub, "quiet")]

    # Partitions without lag are OK between samples too; the one with lag has no status until sampled.
    assert found["by_lag_status"]["OK"] == PARTITIONS - 1 and found["lag_status"] == "OK"
    assert found["lag"] == 2 and found["sampled_at"] is None


async def test_readers_follow_the_read_rule_of_every_api(
    settings: LazySettings, async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    await coordinator(stores, ref, "w1").cycle()
    assert (await async_client.get("/api/groups")).status_code == 200  # anonymous reading is on by default

    settings.LEASEBOARD_ANONYMOUS_READ = False
    refused = await async_client.get("/api/groups")
    page = await async_client.get("/groups/")
    assert refused.status_code == 401 and "log in" in refused.json()["error"]
    conforms_response("GET", "/api/groups", refused)
    assert page.status_code == 302 and page["Location"].startswith("/login/?next=")

    viewer: User = await database_sync_to_async(User.objects.create_user)("viewer", password="pw")
    await async_client.aforce_login(viewer)  # logged in, not staff: may read
    assert [g["consumer_group"] for g in (await get_groups(async_client))["groups"]] == ["$Default"]
    assert (await async_client.get("/groups/")).status_code == 200
    assert (await async_client.post("/api/groups")).status_code == 405


async def test_the_groups_page_is_in_every_page_s_navigation(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    await coordinator(stores, ref, "w1").cycle()
    page = await async_client.get("/groups/")
    fleet = await async_client.get("/")

    assert page.status_code == 200 and b"dashboard/groups.js" in page.content
    assert b'data-groups-url="/api/groups"' in page.content and b'data-page="groups"' in page.content
    for shown in (page, fleet):
        assert b'href="/groups/?hub=sensors&amp;consumer_group=%24Default"' in shown.content


@pytest.fixture
async def unreachable_redis(settings: LazySettings, stores: Stores) -> AsyncIterator[None]:
    """The configured store is a Redis nobody listens on (the SQL store stays the database)."""
    settings.LEASEBOARD_STORE = "redis"
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    await state.forget_stores()
    try:
        yield
    finally:
        await asyncio.to_thread(host.stop)
        await state.forget_stores()
        health.reset()


async def test_a_store_that_cannot_be_reached_is_a_503_saying_so(
    async_client: AsyncClient, unreachable_redis: None
) -> None:
    response = await async_client.get("/api/groups")

    assert response.status_code == 503 and response["Retry-After"], response.content
    assert response.json()["error"].startswith("store unavailable: cannot reach Redis at 127.0.0.1:")
    conforms_response("GET", "/api/groups", response)
    assert health.is_down("store")


async def test_a_store_without_a_namespace_reader_is_read_group_by_group(
    settings: LazySettings, async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    """The in-memory store (one per process, so a namespace of this test's own): the groups in view,
    the configured one and those with a monitor, each read through the protocols."""
    settings.LEASEBOARD_STORE = "memory"
    settings.LEASEBOARD_NAMESPACE = f"memory-{uuid.uuid4().hex[:8]}.example"
    await state.forget_stores()
    memory = state.configured_stores()
    await coordinator(memory, hub_ref(), "w1").cycle()
    await coordinator(memory, HubRef(settings.LEASEBOARD_NAMESPACE, ref.hub, "unseen"), "w1").cycle()

    data = await get_groups(async_client)

    assert [g["consumer_group"] for g in data["groups"]] == ["$Default"]  # "unseen" is in no one's view
    assert data["store"] == "memory" and data["store_requests"] == 5  # the clock, then four listings
    assert data["groups"][0]["owned"] == 1
