"""The groups page stays cheap: with 100 hubs and consumer groups, one refresh of ``/api/groups`` costs
a fixed number of store requests, counted by each store's own counter: the SQL store (SQLite and
PostgreSQL) 1, Redis 2 (one ``SCAN``, one pipeline), Blob Storage on Azurite 1 (one List Blobs)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from pathlib import Path

import pytest
from django.conf import LazySettings
from django.test import AsyncClient

from balancer.model import Checkpoint, HubRef, Member, OwnershipRecord
from balancer.stores.blob.store import BlobStore
from balancer.stores.redis.store import RedisStore
from dashboard.live import state
from dashboard.live.console import Lease
from dashboard.live.groups.blob import container_for
from dashboard.live.groups.everything import read_everything
from dashboard.live.groups.overview import read_groups
from dashboard.live.host import host
from dashboard.sql.store import SqlStore
from dashboard.web.common import db
from tests.support.azurite import Azurite, start_azurite
from tests.support.redis_server import RedisServer, start_redis
from workers.wiring import Stores

# Each starts a store's server (PostgreSQL, Redis, Azurite): `make test` runs them, `make check` leaves them out.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NAMESPACE = "dash.example"
HUBS, GROUPS_PER_HUB, PARTITIONS = 10, 10, 4  # 100 groups of 4 partitions


def refs() -> list[HubRef]:
    return [HubRef(NAMESPACE, f"hub-{h}", f"group-{g}") for h in range(HUBS) for g in range(GROUPS_PER_HUB)]


async def seed(stores: Stores) -> None:
    """Every group of ``refs()``: each partition owned by one of two workers (both heartbeating),
    partition 0 checkpointed. The groups are written eight at a time (a store's requests of one group
    in order): all 100 at once made Redis's client open 100 connections in one burst, and on a busy
    machine (two cores, ``ci-under-load``) one of them missed redis-py's 2 s connect timeout, which a
    worker would retry at its next cycle but a seed cannot."""
    slots = asyncio.Semaphore(8)

    async def one(ref: HubRef) -> None:
        owned = [OwnershipRecord(ref, str(p), f"w{p % 2}", None) for p in range(PARTITIONS)]
        async with slots:
            assert len(await stores.ownership.claim_ownership(owned)) == PARTITIONS
            await stores.checkpoints.update_checkpoint(Checkpoint(ref, "0", 41, "4100"), "w0")
            for worker in ("w0", "w1"):
                await stores.controls.heartbeat(Member(ref, worker, 0.0, {}))

    await asyncio.gather(*map(one, refs()))


async def refresh(expected: int) -> None:
    """One refresh of every group: each has its partitions owned by its two workers, and the refresh
    says it took ``expected`` store requests."""
    groups = await read_groups(db)
    assert groups.store_requests == expected
    assert [row.ref for row in groups.rows] == refs()
    for row in groups.rows:
        summary = row.summary
        assert (summary.by_status[Lease.OWNED], summary.partitions, summary.workers_alive) == (
            PARTITIONS,
            PARTITIONS,
            2,
        )


@pytest.fixture
def namespace(settings: LazySettings) -> None:
    settings.LEASEBOARD_NAMESPACE = NAMESPACE
    settings.LEASEBOARD_EXPIRY = 60.0
    settings.LEASEBOARD_SOURCE = "embedded"  # no hub on disk: partitions are the store's


@pytest.fixture
async def configured(namespace: None) -> AsyncIterator[None]:
    await state.forget_stores()
    try:
        yield
    finally:
        await asyncio.to_thread(host.stop)
        await state.forget_stores()


async def test_one_sql_request_reads_100_groups_on_sqlite(
    settings: LazySettings, configured: None, async_client: AsyncClient, tmp_path: Path
) -> None:
    settings.LEASEBOARD_STORE = "sql"
    settings.LEASEBOARD_HUB_DIR = tmp_path
    stores = state.configured_stores()
    store = stores.ownership
    assert isinstance(store, SqlStore)
    await seed(stores)

    for _ in range(2):
        requests, statements = store.requests, store.statements
        await refresh(expected=1)
        assert (store.requests - requests, store.statements - statements) == (1, 4)  # four SELECTs, one call

    requests = store.requests
    response = await async_client.get("/api/groups")
    assert response.status_code == 200 and store.requests - requests == 1
    assert len(response.json()["groups"]) == 100 and response.json()["store_requests"] == 1


@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
async def test_one_sql_request_and_one_round_trip_read_100_groups_on_postgresql(namespace: None) -> None:
    async with aclosing(SqlStore("postgres")) as store:
        stores = Stores(store, store, store)
        await seed(stores)
        requests, statements = store.requests, store.statements
        read = await read_everything(stores, NAMESPACE)

        # The five SELECTs (the clock among them) go to the server in one message.
        assert (store.requests - requests, store.statements - statements, read.requests) == (1, 1, 1)
        assert list(read.groups()) == refs()
        assert len(read.ownership) == 100 * PARTITIONS and len(read.checkpoints) == 100 and len(read.members) == 200


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


async def test_a_scan_and_one_pipeline_read_100_groups_on_redis(
    settings: LazySettings, configured: None, redis_server: RedisServer, tmp_path: Path
) -> None:
    settings.LEASEBOARD_STORE = "redis"
    settings.REDIS_URL = redis_server.url
    settings.LEASEBOARD_HUB_DIR = tmp_path
    stores = state.configured_stores()
    store = stores.ownership
    assert isinstance(store, RedisStore)
    await seed(stores)
    await stores.controls.heartbeat(Member(HubRef("other.example", "hub-0", "group-0"), "w9", 0.0, {}))

    for _ in range(2):
        requests = store.requests
        await refresh(expected=2)
        assert store.requests - requests == 2


@pytest.fixture(scope="module")
def azurite() -> Iterator[Azurite]:
    server = start_azurite()
    yield server
    server.stop()


async def test_one_listing_reads_100_groups_on_blob_storage(
    settings: LazySettings, configured: None, azurite: Azurite, tmp_path: Path
) -> None:
    settings.LEASEBOARD_STORE = "blob"
    settings.AZURE_STORAGE_CONNECTION_STRING = azurite.connection_string
    settings.LEASEBOARD_BLOB_CONTAINER = f"groups-{uuid.uuid4().hex[:12]}"
    settings.LEASEBOARD_HUB_DIR = tmp_path
    stores = state.configured_stores()
    assert isinstance(stores.ownership, BlobStore)
    await seed(stores)
    container = container_for(stores.ownership)
    await refresh(expected=2)  # the first look asks whether the container exists, once

    for _ in range(2):
        requests = container.requests
        await refresh(expected=1)
        assert container.requests - requests == 1
