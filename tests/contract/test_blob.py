"""The store contract on ``balancer.stores.blob.store.BlobStore`` against Azurite (a fresh container per
test), plus what only the blob store has: Microsoft's names and metadata, one request per listing,
and a clock that costs no request."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from email.utils import parsedate_to_datetime
from typing import Any

import pytest
from azure.storage.blob.aio import ContainerClient

from balancer.errors import StoreError
from balancer.model import Checkpoint, Control, ControlKind, Member, OwnershipRecord
from balancer.stores.blob.layout import checkpoint_blob, member_blob, ownership_blob
from balancer.stores.blob.store import BlobStore
from tests.support.azurite import Azurite, start_azurite

from .base import REF, StoreContract


@pytest.fixture(scope="module")
def azurite() -> Iterator[Azurite]:
    server = start_azurite()
    yield server
    server.stop()


class TestBlobStore(StoreContract):
    refuses_going_back = True

    @pytest.fixture
    async def store(self, azurite: Azurite) -> AsyncIterator[BlobStore]:
        async with BlobStore(azurite.connection_string, f"contract-{uuid.uuid4().hex[:16]}") as store:
            yield store

    def connect(self, store: BlobStore) -> BlobStore:
        return store.clone()  # its own HTTP session, in the thread's own event loop

    # Metadata only. Left out: every ownership time:* edit, ghost, etag:garbage, etag:missing and
    # future, the checkpoint's time and the member's time, as the service writes every blob's
    # Last-Modified (every time) and ETag itself: no hand edit can plant a value there.
    damages = frozenset(
        {
            ("ownership", "unreadable"),
            ("ownership", "partition"),
            ("checkpoint", "sequence"),
            ("member", "info"),
        }
    )

    async def corrupt(self, store: BlobStore, kind: str, key: str, edit: str) -> None:
        """What a hand edit of a blob's metadata (Storage Explorer, ``az storage blob metadata
        update``) could leave. The service writes Last-Modified (every time) and the ETag itself."""
        name, metadata = {
            ("ownership", "unreadable"): (ownership_blob(REF, key), {"owner": "a"}),  # an older layout's key
            ("ownership", "partition"): (f"{ownership_blob(REF, '0')[:-1]}{key}", {"ownerid": "x"}),
            ("checkpoint", "sequence"): (checkpoint_blob(REF, key), {"offset": "700", "sequencenumber": "ten"}),
            ("member", "info"): (member_blob(REF, key), {"info": "{not json"}),
        }[(kind, edit)]
        async with ContainerClient.from_connection_string(store._service.connection_string, store.container) as raw:
            await raw.upload_blob(name, b"", metadata=metadata, overwrite=True)

    # only the blob store --------------------------------------------------------------------

    async def test_every_listing_is_one_request_whatever_the_number_of_records(self, store: BlobStore) -> None:
        owned = await store.claim_ownership([OwnershipRecord(REF, str(p), "w1") for p in range(40)])
        for record in owned[:5]:
            await store.update_checkpoint(Checkpoint(REF, record.partition_id, 1, "100"), "w1")
        for w in range(5):
            await store.heartbeat(Member(REF, f"w{w}", 0.0))
        await store.put_control(Control(REF, ControlKind.DRAIN, "w3"))
        calls = (store.list_ownership, store.list_checkpoints, store.list_members, store.list_controls)
        sizes = []
        for listing in calls:
            before = store.requests
            sizes.append(len(await listing(REF)))
            assert store.requests - before == 1
        assert sizes == [40, 5, 5, 1]

    async def test_now_follows_the_services_date_header_at_no_cost(self, store: BlobStore, azurite: Azurite) -> None:
        dates: list[float] = []

        def seen(response: Any) -> None:
            dates.append(parsedate_to_datetime(response.http_response.headers["Date"]).timestamp())

        [held] = await store.claim_ownership([OwnershipRecord(REF, "0", "w1")])
        before = store.requests
        readings = [await store.now() for _ in range(50)]
        assert store.requests == before  # the clock is read from responses already received
        assert readings == sorted(readings) and held.last_modified is not None
        assert held.last_modified <= readings[0] <= held.last_modified + 2
        async with ContainerClient.from_connection_string(azurite.connection_string, store.container) as raw:
            await raw.exists(raw_response_hook=seen)
        assert readings[-1] <= dates[0]  # never ahead of the service

    async def test_a_checkpoint_written_by_another_since_this_stores_last_one_is_never_overwritten_by_an_older_one(
        self, store: BlobStore
    ) -> None:
        # The old owner's store checked ownership before the steal; the new owner checkpointed further
        # on meanwhile. The old owner's write carries the ETag it last wrote: refused, read again, and
        # the stored sequence gives the stale write away.
        [held] = await store.claim_ownership([OwnershipRecord(REF, "0", "old")])
        await store.update_checkpoint(Checkpoint(REF, "0", 100), "old")
        other = store.clone()
        async with other:
            [stolen] = await other.claim_ownership([held.claimed_by("new")])
            await other.update_checkpoint(Checkpoint(REF, "0", 180), "new")
            await other.claim_ownership([stolen.claimed_by("old")])  # and back, so only the ETag can tell
        with pytest.raises(StoreError, match="would go back from 180 to 150: refused"):
            await store.update_checkpoint(Checkpoint(REF, "0", 150), "old")
        assert [c.sequence_number for c in await store.list_checkpoints(REF)] == [180]
        written = await store.update_checkpoint(Checkpoint(REF, "0", 200), "old")
        assert [c.sequence_number for c in await store.list_checkpoints(REF)] == [written.sequence_number] == [200]

    async def test_a_checkpoint_costs_two_requests_once_its_blobs_etag_is_known(self, store: BlobStore) -> None:
        await store.claim_ownership([OwnershipRecord(REF, "0", "a")])
        costs = []
        for sequence in (5, 6, 7):
            before = store.requests
            await store.update_checkpoint(Checkpoint(REF, "0", sequence, str(sequence * 100)), "a")
            costs.append(store.requests - before)
        assert costs == [3, 2, 2]  # the first also reads the checkpoint blob's ETag, beside the ownership

    async def test_an_unreadable_checkpoint_blob_is_overwritten_by_the_owners_next_checkpoint(
        self, store: BlobStore
    ) -> None:
        await store.claim_ownership([OwnershipRecord(REF, "0", "a")])
        await store.update_checkpoint(Checkpoint(REF, "0", 7, "700"), "a")
        await self.corrupt(store, "checkpoint", "0", "sequence")  # behind this store's back: a new ETag
        before = store.requests
        written = await store.update_checkpoint(Checkpoint(REF, "0", 8, "800"), "a")
        assert store.requests - before == 5  # ownership, a refused write, both blobs read again, the write
        assert await store.list_checkpoints(REF) == [written]

    def test_one_store_serves_one_event_loop_after_another(self, azurite: Azurite) -> None:
        # e.g. management commands that each asyncio.run() on a store built once per process
        # (each closing the store's HTTP session before its loop ends)
        store = BlobStore(azurite.connection_string, f"loops-{uuid.uuid4().hex[:16]}")

        async def first_loop() -> list[OwnershipRecord]:
            async with store:
                return await store.claim_ownership([OwnershipRecord(REF, "0", "w1")])

        async def second_loop() -> list[OwnershipRecord]:
            async with store:
                return await store.list_ownership(REF)

        [held] = asyncio.run(first_loop())
        assert asyncio.run(second_loop()) == [held]
