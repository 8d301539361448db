"""The blob store when Azurite goes away and comes back: StoreUnavailable saying what fails, then
the same store object works again, with everything written before the outage still there."""

from __future__ import annotations

import time

import pytest

from balancer.errors import StoreUnavailable
from balancer.model import Checkpoint, OwnershipRecord
from balancer.stores.blob.store import BlobStore
from tests.support.azurite import start_azurite

from .conftest import REF


async def test_a_stopped_service_is_store_unavailable_and_the_same_store_recovers_when_it_returns() -> None:
    server = start_azurite()  # its own: this test stops it
    try:
        async with BlobStore(server.connection_string, "outage") as store:
            [held] = await store.claim_ownership([OwnershipRecord(REF, "0", "w1")])
            await store.update_checkpoint(Checkpoint(REF, "0", 10, "1000"), "w1")
            clock = await store.now()

            server.kill()
            for call in (store.list_ownership(REF), store.claim_ownership([held])):
                started = time.monotonic()
                with pytest.raises(StoreUnavailable) as down:
                    await call
                assert time.monotonic() - started < 5  # fails fast: a renewal must not outlast its lease
                assert "cannot reach the service" in str(down.value)
                assert f"127.0.0.1:{server.port}" in str(down.value)
            assert await store.now() >= clock  # the clock goes on without the service, never back

            # A checkpoint is tried once, with no backoff: the pump waiting for it goes on handling
            # events through the outage, and tries again at its next checkpoint.
            sent, started = store.requests, time.monotonic()
            with pytest.raises(StoreUnavailable):
                await store.update_checkpoint(Checkpoint(REF, "0", 11, "1100"), "w1")
            assert store.requests - sent == 1 and time.monotonic() - started < 1

            server.start()  # same port, same data; pooled connections to the old process are dead
            [renewed] = await store.claim_ownership([held])
            assert renewed.etag != held.etag and renewed.owner_id == "w1"
            assert await store.list_ownership(REF) == [renewed]
            assert [(c.sequence_number, c.offset) for c in await store.list_checkpoints(REF)] == [(10, "1000")]
    finally:
        server.stop()
