"""Microsoft's blob checkpoint store (``azure-eventhub-checkpointstoreblob-aio``) and Leaseboard's
``BlobStore`` on one container in Azurite: each reads what the other wrote, an ETag made stale by
either loses to the other, a checkpoint written by either is where the other resumes, and
Microsoft's load balancer and Leaseboard's coordinator share one consumer group."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from azure.eventhub._eventprocessor._eventprocessor_mixin import EventProcessorMixin
from azure.eventhub._eventprocessor.common import LoadBalancingStrategy
from azure.eventhub.aio._eventprocessor._ownership_manager import OwnershipManager
from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore
from azure.storage.blob.aio import ContainerClient

from balancer.errors import OwnershipLost
from balancer.lease import Coordinator
from balancer.model import Checkpoint, Control, ControlKind, Member, OwnershipRecord, partition_ids
from balancer.stores.blob.store import BlobStore
from balancer.strategies import get_strategy
from tests.support.azurite import Azurite
from workers.sources.base import Position

from .conftest import REF


@pytest.fixture
async def microsoft(azurite: Azurite, container_name: str, store: BlobStore) -> AsyncIterator[BlobCheckpointStore]:
    """Microsoft's store on the container ``store`` created."""
    async with BlobCheckpointStore.from_connection_string(azurite.connection_string, container_name) as theirs:
        yield theirs


def ms_ownership(partition_id: str, owner_id: str, etag: str | None = None) -> dict[str, Any]:
    """An ownership request as Microsoft's processor builds it."""
    request: dict[str, Any] = {
        "fully_qualified_namespace": REF.namespace,
        "eventhub_name": REF.hub,
        "consumer_group": REF.consumer_group,
        "partition_id": partition_id,
        "owner_id": owner_id,
    }
    if etag is not None:
        request["etag"] = etag
    return request


def ms_checkpoint(partition_id: str, sequence_number: int, offset: str) -> dict[str, Any]:
    return {
        "fully_qualified_namespace": REF.namespace,
        "eventhub_name": REF.hub,
        "consumer_group": REF.consumer_group,
        "partition_id": partition_id,
        "sequence_number": sequence_number,
        "offset": offset,
    }


async def ms_list(theirs: BlobCheckpointStore) -> dict[str, dict[str, Any]]:
    listed = await theirs.list_ownership(REF.namespace, REF.hub, REF.consumer_group)
    return {o["partition_id"]: o for o in listed}


def unquoted(etag: str) -> str:
    return etag.strip('"')


async def test_both_stores_use_the_same_blob_names_and_metadata(
    store: BlobStore, microsoft: BlobCheckpointStore, raw: ContainerClient
) -> None:
    await microsoft.claim_ownership([ms_ownership("0", "ms-1")])
    await microsoft.update_checkpoint(ms_checkpoint("0", 5, "500"))
    await store.claim_ownership([OwnershipRecord(REF, "1", "lb-1")])
    await store.update_checkpoint(Checkpoint(REF, "1", 7, "700"), "lb-1")
    blobs = {b.name: dict(b.metadata) async for b in raw.list_blobs(include=["metadata"])}
    prefix = "leaseboard-test.servicebus.windows.net/sensors/$default/"
    assert blobs == {
        prefix + "ownership/0": {"ownerid": "ms-1"},
        prefix + "ownership/1": {"ownerid": "lb-1"},
        prefix + "checkpoint/0": {"offset": "500", "sequencenumber": "5"},
        prefix + "checkpoint/1": {"offset": "700", "sequencenumber": "7"},
    }


async def test_each_store_reads_the_ownership_the_other_wrote(store: BlobStore, microsoft: BlobCheckpointStore) -> None:
    [theirs] = await microsoft.claim_ownership([ms_ownership("0", "ms-1")])
    [ours] = await store.claim_ownership([OwnershipRecord(REF, "1", "lb-1")])
    # Leaseboard's own records share the prefix; Microsoft's listing must not trip over them.
    await store.heartbeat(Member(REF, "lb-1", 0.0, {"host": "h"}))
    await store.put_control(Control(REF, ControlKind.PIN, "1", "lb-1"))

    listed = {r.partition_id: r for r in await store.list_ownership(REF)}
    assert listed["0"] == OwnershipRecord(REF, "0", "ms-1", unquoted(theirs["etag"]), theirs["last_modified_time"])
    assert listed["1"] == ours

    seen = await ms_list(microsoft)
    assert set(seen) == {"0", "1"}
    assert seen["1"]["owner_id"] == "lb-1"
    assert unquoted(seen["1"]["etag"]) == ours.etag
    assert seen["1"]["last_modified_time"] == ours.last_modified
    assert seen["0"]["etag"] == listed["0"].etag and seen["0"]["owner_id"] == "ms-1"


async def test_a_claim_with_an_etag_made_stale_by_leaseboard_loses_for_microsoft(
    store: BlobStore, microsoft: BlobCheckpointStore
) -> None:
    [theirs] = await microsoft.claim_ownership([ms_ownership("0", "ms-1")])
    [listed] = await store.list_ownership(REF)
    stolen = await store.claim_ownership([listed.claimed_by("lb-1")])  # the ETag Microsoft holds moves
    assert [r.owner_id for r in stolen] == ["lb-1"]
    assert await microsoft.claim_ownership([ms_ownership("0", "ms-1", theirs["etag"])]) == []
    # (Not tested: Microsoft's ETag-less claim of an existing record. Its store sends Set Blob
    # Metadata with If-None-Match: *, which Azure refuses with 412 but Azurite 3.35 lets through.
    # Leaseboard creates with Put Blob + If-None-Match: *, which Azurite does enforce.)
    assert (await ms_list(microsoft))["0"]["owner_id"] == "lb-1"
    assert await store.list_ownership(REF) == stolen


async def test_a_claim_with_an_etag_made_stale_by_microsoft_loses_for_leaseboard(
    store: BlobStore, microsoft: BlobCheckpointStore
) -> None:
    [ours] = await store.claim_ownership([OwnershipRecord(REF, "0", "lb-1")])
    seen = (await ms_list(microsoft))["0"]
    [theirs] = await microsoft.claim_ownership([ms_ownership("0", "ms-1", seen["etag"])])
    assert theirs["owner_id"] == "ms-1"
    assert await store.claim_ownership([ours]) == []  # the renewal with the old ETag
    assert await store.claim_ownership([OwnershipRecord(REF, "0", "lb-2")]) == []  # create-if-absent
    [listed] = await store.list_ownership(REF)
    assert (listed.owner_id, listed.etag) == ("ms-1", unquoted(theirs["etag"]))
    with pytest.raises(OwnershipLost) as lost:
        await store.update_checkpoint(Checkpoint(REF, "0", 1, "100"), "lb-1")
    assert lost.value.current_owner == "ms-1"
    # and Leaseboard takes it back with the ETag it now sees
    [back] = await store.claim_ownership([listed.claimed_by("lb-1")])
    assert (await ms_list(microsoft))["0"]["owner_id"] == "lb-1" and back.owner_id == "lb-1"


async def test_a_release_by_either_store_is_a_free_partition_for_the_other(
    store: BlobStore, microsoft: BlobCheckpointStore
) -> None:
    [theirs] = await microsoft.claim_ownership([ms_ownership("0", "ms-1")])
    await microsoft.claim_ownership([ms_ownership("0", "", theirs["etag"])])  # Microsoft's release
    [released] = await store.list_ownership(REF)
    assert released.owner_id == "" and released.expired(await store.now(), expiry=3600)
    [ours] = await store.claim_ownership([released.claimed_by("lb-1")])
    await store.claim_ownership([ours.claimed_by("")])  # Leaseboard's release
    seen = (await ms_list(microsoft))["0"]
    assert not seen["owner_id"]  # Microsoft's load balancer treats a falsy owner as unowned
    [again] = await microsoft.claim_ownership([ms_ownership("0", "ms-2", seen["etag"])])
    assert again["owner_id"] == "ms-2"


async def test_a_checkpoint_written_by_leaseboard_is_where_microsofts_processor_resumes(
    store: BlobStore, microsoft: BlobCheckpointStore
) -> None:
    await store.claim_ownership([OwnershipRecord(REF, p, "lb-1") for p in "01"])
    await store.update_checkpoint(Checkpoint(REF, "0", 41, "4100"), "lb-1")
    await store.update_checkpoint(Checkpoint(REF, "1", 7, None), "lb-1")
    listed = await microsoft.list_checkpoints(REF.namespace, REF.hub, REF.consumer_group)
    theirs = {c["partition_id"]: c for c in listed}
    assert (theirs["0"]["sequence_number"], theirs["0"]["offset"]) == (41, "4100")
    processor = EventProcessorMixin()
    # Microsoft's processor starts a partition's receiver after the checkpointed offset (exclusive)
    assert processor.get_init_event_position("0", theirs["0"]) == ("4100", False)
    # without an offset Leaseboard writes "-1": Microsoft's processor re-reads from the start of
    # the stream (at least once) rather than failing on a missing key
    assert processor.get_init_event_position("1", theirs["1"]) == ("-1", False)


async def test_a_checkpoint_written_by_microsoft_is_where_leaseboard_resumes(
    store: BlobStore, microsoft: BlobCheckpointStore
) -> None:
    await microsoft.update_checkpoint(ms_checkpoint("3", 88, "8800"))
    [checkpoint] = await store.list_checkpoints(REF)
    assert (checkpoint.partition_id, checkpoint.sequence_number, checkpoint.offset) == ("3", 88, "8800")
    assert checkpoint.last_modified is not None
    # the position Leaseboard's pump resumes at (workers/runtime/pump.py): after this event
    assert Position.after(checkpoint.sequence_number, checkpoint.offset) == Position(offset="8800", sequence_number=88)

    # and back: Leaseboard moves it on, Microsoft's processor would resume there
    await store.claim_ownership([OwnershipRecord(REF, "3", "lb-1")])
    await store.update_checkpoint(Checkpoint(REF, "3", 90, "9000"), "lb-1")
    [theirs] = await microsoft.list_checkpoints(REF.namespace, REF.hub, REF.consumer_group)
    assert (theirs["sequence_number"], theirs["offset"]) == (90, "9000")


class EventHubStub:
    """The three things Microsoft's ownership manager asks of its Event Hubs client (which cannot
    be reached from here): the namespace, the hub name and the partition ids."""

    def __init__(self, partitions: int) -> None:
        self._address = SimpleNamespace(hostname=REF.namespace)
        self.eventhub_name = REF.hub
        self._partitions = [str(p) for p in range(partitions)]

    async def get_partition_ids(self) -> list[str]:
        return list(self._partitions)


async def test_a_microsoft_processor_and_a_leaseboard_worker_share_one_consumer_group(
    store: BlobStore, microsoft: BlobCheckpointStore
) -> None:
    # Microsoft's real load balancer (balanced strategy, one claim or steal per cycle) against the
    # real cooperative coordinator, on one container: they split the hub and then stay put.
    hub = EventHubStub(8)
    theirs = OwnershipManager(
        hub,  # type: ignore[arg-type]
        REF.consumer_group,
        "ms",
        microsoft,
        60.0,
        LoadBalancingStrategy.BALANCED,
        None,
    )

    async def partitions() -> tuple[str, ...]:
        return partition_ids(8)

    ours = Coordinator(REF, "lb", store, partitions, get_strategy("cooperative"), expiry=60)
    held_by_ms: list[str] = []
    for _ in range(12):
        await ours.cycle()
        held_by_ms = await theirs.claim_ownership()
        if len(ours.owned) == len(held_by_ms) == 4:
            break
    assert len(ours.owned) == len(held_by_ms) == 4, (sorted(ours.owned), held_by_ms)
    assert ours.owned.isdisjoint(held_by_ms)
    for _ in range(3):  # balanced: nobody moves any more
        report = await ours.cycle()
        assert not report.gained and not report.lost
        assert sorted(await theirs.claim_ownership()) == sorted(held_by_ms)
    listed = {r.partition_id: r.owner_id for r in await store.list_ownership(REF)}
    assert listed == {p: ("ms" if p in held_by_ms else "lb") for p in partition_ids(8)}
