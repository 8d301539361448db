"""The lead's coordinator on the blob store: two cooperative workers on Azurite reach balance, and
what a steady cycle costs in blob requests per worker."""

from __future__ import annotations

from collections import Counter

from balancer.lease import Coordinator
from balancer.model import partition_ids
from balancer.stores.blob.store import BlobStore
from balancer.strategies import get_strategy

from .conftest import REF

PARTITIONS = 16


async def partitions() -> tuple[str, ...]:
    return partition_ids(PARTITIONS)


def worker(store: BlobStore, owner_id: str) -> Coordinator:
    return Coordinator(REF, owner_id, store, partitions, get_strategy("cooperative"), expiry=60)


async def test_two_cooperative_workers_balance_and_a_steady_cycle_costs_one_request_plus_one_per_partition(
    store: BlobStore,
) -> None:
    # Each worker has its own store (its own connection and request count), as in two processes.
    other = store.clone()
    async with other:
        w0, w1 = worker(store, "w0"), worker(other, "w1")
        for _ in range(2):  # w0 alone: announces itself, then takes every partition
            await w0.cycle()
        assert len(w0.owned) == PARTITIONS

        # w1 joins; w0 hands half over (released in its cycle), w1 claims them in its next
        rounds = 0
        while not (len(w0.owned) == len(w1.owned) == PARTITIONS // 2):
            rounds += 1
            assert rounds <= 5, f"no balance after {rounds} rounds: {sorted(w0.owned)} / {sorted(w1.owned)}"
            await w1.cycle()
            await w0.cycle()
        assert w0.owned.isdisjoint(w1.owned)
        held = {r.partition_id: r.owner_id for r in await store.list_ownership(REF)}
        assert Counter(held.values()) == {"w0": 8, "w1": 8}
        assert {p for p, o in held.items() if o == "w1"} == w1.owned

        # steady state: nothing moves; count HTTP requests per worker per cycle
        per_cycle = []
        for _ in range(3):
            for coordinator, blob_store in ((w0, store), (w1, other)):
                before = blob_store.requests
                report = await coordinator.cycle()
                assert not report.gained and not report.lost
                per_cycle.append((blob_store.requests - before, report.requests))
    # Two store calls (snapshot, claim) make one listing of the whole scope and one renewal per owned
    # partition in HTTP requests (no heartbeat: a worker holding partitions is alive by its renewals;
    # with no interval given, every cycle renews): the snapshot's clock is the service's, read from
    # the listing response's Date header at no cost.
    assert set(per_cycle) == {(1 + PARTITIONS // 2, 2)}
    print(f"\nblob requests per worker per steady cycle holding {PARTITIONS // 2}: {per_cycle[0][0]}")
