"""The metrics wrapper ``runworkers`` puts around every store keeps the store's protocols.

Since Python 3.12 ``isinstance(x, SomeProtocol)`` looks attributes up statically: a wrapper that
forwarded calls through ``__getattr__`` passed no protocol check there, and the default strategy
fell back from one snapshot request a cycle to four separate reads. These tests run in the fast
suite, so on every supported Python.
"""

from __future__ import annotations

import random
import sys

import pytest
from prometheus_client import REGISTRY

from balancer.changes import ChangeFeed
from balancer.lease import Coordinator
from balancer.model import HubRef, OwnershipRecord
from balancer.protocol import CheckpointStore, ControlStore, OwnershipStore, SnapshotStore
from balancer.stores.memory import MemoryStore
from balancer.strategies import DEFAULT, get_strategy
from workers import store_metrics as metrics
from workers.wiring import Stores, instrument

REF = HubRef("instrumented.example", "sensors", "$Default")
PARTITIONS = tuple(str(p) for p in range(4))
READS = ("snapshot_since", "snapshot", "list_ownership", "list_members", "list_controls", "now")


def requests(operation: str) -> float:
    labels = {"operation": operation, "outcome": "ok"}
    return REGISTRY.get_sample_value("leaseboard_store_requests_total", labels) or 0.0


def reads() -> dict[str, float]:
    return {operation: requests(operation) for operation in READS}


async def partitions() -> tuple[str, ...]:
    return PARTITIONS


class OwnershipOnly:
    """A store of ownership and nothing else (ownership and checkpoints may live in different stores)."""

    def __init__(self) -> None:
        self._memory = MemoryStore()

    async def list_ownership(self, ref: HubRef) -> list[OwnershipRecord]:
        return await self._memory.list_ownership(ref)

    async def claim_ownership(self, records: list[OwnershipRecord]) -> list[OwnershipRecord]:
        return await self._memory.claim_ownership(records)

    async def now(self) -> float:
        return await self._memory.now()


def test_each_wrapper_class_counts_every_method_of_its_protocol_under_a_known_operation() -> None:
    for protocol, wrapper in metrics.COUNTED:
        methods = {name for name in vars(protocol) if not name.startswith("_")}
        assert methods == {name for name in vars(wrapper) if not name.startswith("_")}, wrapper.__name__
        assert methods <= set(metrics.OPERATIONS)


def test_an_instrumented_store_implements_every_protocol_its_store_implements() -> None:
    memory = MemoryStore()
    stores = instrument(Stores(memory, memory, memory))

    for protocol in (OwnershipStore, SnapshotStore, ChangeFeed, CheckpointStore, ControlStore):
        assert isinstance(memory, protocol)
        assert isinstance(stores.ownership, protocol), f"{protocol.__name__} on Python {sys.version_info[:2]}"
    # One wrapper for the one store (by id: the fields are typed by three different protocols).
    assert id(stores.ownership) == id(stores.checkpoints) == id(stores.controls)


def test_an_instrumented_store_implements_no_protocol_its_store_lacks() -> None:
    ownership, memory = OwnershipOnly(), MemoryStore()
    stores = instrument(Stores(ownership, memory, memory))  # type: ignore[arg-type]

    assert isinstance(stores.ownership, OwnershipStore)
    assert not isinstance(stores.ownership, SnapshotStore | ChangeFeed | CheckpointStore | ControlStore)
    assert id(stores.checkpoints) == id(stores.controls) != id(stores.ownership)  # (by id: see above)
    with pytest.raises(TypeError, match="not a ControlStore"):
        instrument(Stores(memory, memory, ownership))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="implements no store protocol"):
        metrics.instrumented(object())


async def test_the_default_strategy_reads_one_snapshot_of_changes_a_cycle_through_the_metrics_wrapper() -> None:
    memory = MemoryStore()
    stores = instrument(Stores(memory, memory, memory))
    strategy = get_strategy(None)
    assert strategy.name == DEFAULT and strategy.uses_members  # else it reads no snapshot at all
    coordinator = Coordinator(
        ref=REF,
        owner_id="w0",
        store=stores.ownership,
        partitions=partitions,
        strategy=strategy,
        controls=stores.controls,
        rng=random.Random(7),
    )

    for cycle in range(5):
        before, round_trips = reads(), memory.requests
        holding = bool(coordinator.owned)
        report = await coordinator.cycle()

        counted = {operation: requests(operation) - before[operation] for operation in READS}
        expected_reads = {operation: 1 if operation == "snapshot_since" else 0 for operation in READS}
        assert counted == expected_reads, f"cycle {cycle} on Python {sys.version_info[:2]}"
        # One snapshot; a heartbeat while it holds nothing (a worker holding partitions is alive by its
        # renewals); one claim-and-renew when it has something to write (its first cycle only announces
        # it): in the store's own count and the coordinator's.
        expected = 2 if cycle == 0 else (2 if holding else 3)
        assert memory.requests - round_trips == report.requests == expected, cycle
    assert coordinator.owned == frozenset(PARTITIONS)


async def test_the_coordinator_finds_the_control_store_in_an_instrumented_store() -> None:
    memory = MemoryStore()
    stores = instrument(Stores(memory, memory, memory))
    coordinator = Coordinator(REF, "w0", stores.ownership, partitions, get_strategy(None), rng=random.Random(7))

    assert id(coordinator.controls) == id(stores.ownership)  # (by id: a ControlStore, an OwnershipStore)
    before = reads()
    await coordinator.cycle()
    assert requests("snapshot_since") - before["snapshot_since"] == 1
    assert requests("snapshot") == before["snapshot"]
    assert requests("list_ownership") == before["list_ownership"]
