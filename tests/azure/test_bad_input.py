"""Bad input to the blob store: blobs whose metadata is missing or malformed are reported by name
and skipped (and an unreadable ownership record can still be claimed over), and a wrong
connection string fails once, clearly, without printing the key."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from azure.storage.blob.aio import ContainerClient

from balancer.errors import StoreError, StoreUnavailable
from balancer.lease import Coordinator
from balancer.model import Checkpoint, Control, ControlKind, Member, OwnershipRecord, partition_ids
from balancer.stores.blob.store import BlobStore
from balancer.strategies import get_strategy
from tests.support.azurite import KEY, Azurite, connection_string
from tests.support.servers import free_port
from workers.wiring import build_stores

from .conftest import REF

PREFIX = "leaseboard-test.servicebus.windows.net/sensors/$default/"
# What a hand edit, a truncated write or an older layout could leave under the shared prefix.
BAD = {
    PREFIX + "ownership/1": {"owner": "w-old"},  # an older layout's key
    PREFIX + "ownership/2": {"ownerid": "w1", "ownerlevel": "high"},
    PREFIX + "ownership/abc": {"ownerid": "w1"},  # not a partition id
    PREFIX + "ownership/3/extra": {"ownerid": "w1"},
    PREFIX + "checkpoint/1": {"offset": "100", "sequencenumber": "ten"},
    PREFIX + "checkpoint/2": {},
    PREFIX + "checkpoint/4": {"offset": "1", "sequencenumber": "-5"},
    PREFIX + "leaseboard/members/w9": {"info": "{not json"},
    PREFIX + "leaseboard/members/w8": {"info": '{"pid": 8}'},
    PREFIX + "leaseboard/controls/explode/1": {"value": "w1"},
    PREFIX + "leaseboard/controls/pin/5": {},
}


async def write_bad_blobs(raw: ContainerClient) -> None:
    for name, metadata in BAD.items():
        await raw.upload_blob(name, b"", metadata=metadata, overwrite=True)


async def seed_good_records(store: BlobStore) -> None:
    await store.claim_ownership([OwnershipRecord(REF, "0", "w1")])
    await store.update_checkpoint(Checkpoint(REF, "0", 3, "300"), "w1")
    await store.heartbeat(Member(REF, "w1", 0.0))
    await store.put_control(Control(REF, ControlKind.PIN, "0", "w1"))


async def test_unreadable_blobs_are_reported_by_name_and_skipped(
    store: BlobStore, raw: ContainerClient, caplog: pytest.LogCaptureFixture
) -> None:
    await seed_good_records(store)
    await write_bad_blobs(raw)
    with caplog.at_level(logging.WARNING, logger="balancer.stores.azure_blob"):
        assert [r.partition_id for r in await store.list_ownership(REF)] == ["0"]
        assert [c.partition_id for c in await store.list_checkpoints(REF)] == ["0"]
        assert [m.owner_id for m in await store.list_members(REF)] == ["w1"]
        assert [(c.kind, c.target) for c in await store.list_controls(REF)] == [(ControlKind.PIN, "0")]
    warned = [r.getMessage() for r in caplog.records if r.name == "balancer.stores.azure_blob"]
    assert len(warned) == len(BAD)
    for name in BAD:
        assert sum(repr(name) in w for w in warned) == 1, (name, warned)
    assert any("no 'ownerid' metadata (keys found: owner)" in w for w in warned)
    assert any("sequencenumber 'ten' is not an integer" in w for w in warned)
    assert any("unknown control kind 'explode'" in w for w in warned)
    assert len(store.corrupt) == len(BAD)
    assert all(any(repr(name) in p.where for p in store.corrupt) for name in BAD)

    # listed again: still skipped and still inspectable, but not logged again as a warning
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="balancer.stores.azure_blob"):
        assert len(await store.list_ownership(REF)) == 1
    assert [r for r in caplog.records if r.name == "balancer.stores.azure_blob"] == []
    assert len(store.corrupt) == len(BAD)

    # repaired by hand: it is read again and leaves the list of corrupt blobs
    await raw.get_blob_client(PREFIX + "checkpoint/1").set_blob_metadata({"offset": "100", "sequencenumber": "10"})
    assert sorted(c.partition_id for c in await store.list_checkpoints(REF)) == ["0", "1"]
    assert len(store.corrupt) == len(BAD) - 1
    assert not any(repr(PREFIX + "checkpoint/1") in p.where for p in store.corrupt)


async def test_an_unreadable_ownership_record_does_not_block_its_partition(
    store: BlobStore, raw: ContainerClient
) -> None:
    await write_bad_blobs(raw)
    assert await store.list_ownership(REF) == []
    # The caller sees partition 1 as never owned and claims it so: the store overwrites the
    # unreadable blob it saw (If-Match on its ETag) instead of failing create-if-absent forever.
    [won] = await store.claim_ownership([OwnershipRecord(REF, "1", "w2")])
    assert won.owner_id == "w2"
    assert [r.partition_id for r in await store.list_ownership(REF)] == ["1"]  # 2 stays unreadable: nobody claimed it
    blob = await raw.get_blob_client(PREFIX + "ownership/1").get_blob_properties()
    assert dict(blob.metadata) == {"ownerid": "w2"}


async def test_a_coordinator_cycle_goes_on_over_unreadable_blobs(store: BlobStore, raw: ContainerClient) -> None:
    await write_bad_blobs(raw)

    async def partitions() -> tuple[str, ...]:
        return partition_ids(6)

    worker = Coordinator(REF, "w1", store, partitions, get_strategy("cooperative"), expiry=60)
    await worker.cycle()  # announces itself
    report = await worker.cycle()
    # all six are claimed, "1" and "2" over their unreadable blobs; pin 5 was unreadable, so ignored
    assert report.owned == frozenset(partition_ids(6))
    assert {r.partition_id: r.owner_id for r in await store.list_ownership(REF)} == {p: "w1" for p in "012345"}


async def test_an_owner_id_that_cannot_be_metadata_is_refused_before_any_request(store: BlobStore) -> None:
    before = store.requests
    with pytest.raises(ValueError, match="printable ASCII"):
        await store.claim_ownership([OwnershipRecord(REF, "0", "wörker")])
    assert store.requests == before


# connection strings ----------------------------------------------------------------------------


def test_a_missing_connection_string_is_one_clear_error(settings: Any) -> None:
    settings.AZURE_STORAGE_CONNECTION_STRING = ""
    with pytest.raises(StoreError, match="no Blob Storage connection string: set AZURE_STORAGE_CONNECTION_STRING"):
        BlobStore()
    with pytest.raises(StoreError, match="no Blob Storage connection string: set AZURE_STORAGE_CONNECTION_STRING"):
        build_stores("blob")


@pytest.mark.parametrize(
    ("connection", "problem"),
    [
        ("garbage", "is not a storage connection string"),
        ("AccountName=devstoreaccount1;BlobEndpoint=http://127.0.0.1:1/devstoreaccount1", "neither AccountKey nor"),
        (f"AccountName=a;AccountKey={KEY[:-3]}!!;BlobEndpoint=http://127.0.0.1:1/a", "is not valid base64"),
    ],
)
def test_a_malformed_connection_string_fails_at_construction_without_the_key(connection: str, problem: str) -> None:
    with pytest.raises(StoreError, match=problem) as failed:
        BlobStore(connection, "leaseboard")
    assert KEY[:20] not in str(failed.value)


def test_an_invalid_container_name_fails_at_construction(azurite: Azurite) -> None:
    with pytest.raises(StoreError, match="container name 'Leaseboard_Prod' is invalid"):
        BlobStore(azurite.connection_string, "Leaseboard_Prod")


async def test_the_environment_configures_the_store(azurite: Azurite, settings: Any) -> None:
    # The settings read AZURE_STORAGE_CONNECTION_STRING and LEASEBOARD_BLOB_CONTAINER; the wiring passes them in.
    settings.AZURE_STORAGE_CONNECTION_STRING = azurite.connection_string
    settings.LEASEBOARD_BLOB_CONTAINER = "from-the-environment"
    built = build_stores("blob").ownership
    assert isinstance(built, BlobStore)
    async with built as store:
        assert store.container == "from-the-environment"
        assert await store.claim_ownership([OwnershipRecord(REF, "0", "w1")]) != []
        assert KEY not in repr(store) and f"127.0.0.1:{azurite.port}/devstoreaccount1" in repr(store)


async def test_a_wrong_account_key_fails_the_first_call_clearly_and_never_shows_a_key(azurite: Azurite) -> None:
    wrong = "A" * 86 + "=="
    conn = azurite.connection_string.replace(KEY, wrong)
    async with BlobStore(conn, "leaseboard") as store:
        for call in (store.now(), store.list_ownership(REF), store.claim_ownership([OwnershipRecord(REF, "0", "a")])):
            with pytest.raises(StoreError) as refused:
                await call
            assert not isinstance(refused.value, StoreUnavailable)  # retrying will not help
            message = str(refused.value)
            assert "refused the credentials of AZURE_STORAGE_CONNECTION_STRING (403)" in message
            assert f"127.0.0.1:{azurite.port}/devstoreaccount1" in message
            assert wrong[:20] not in message and refused.value.__cause__ is None


async def test_nobody_listening_is_store_unavailable_within_seconds() -> None:
    conn = connection_string(free_port())
    async with BlobStore(conn, "leaseboard") as store:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="cannot reach the service") as down:
            await store.list_ownership(REF)
        assert time.monotonic() - started < 5
        assert KEY[:20] not in str(down.value)
        assert store.requests == 2  # the attempt and one retry
