"""Reading only what changed (issue 15, item 6): a coordinator on a store with a change feed keeps a
copy of the ownership table, plans on exactly what a full listing would show, reads whole again when
it cannot trust the copy, and still sees a crashed worker's leases expire on time."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from balancer.changes import Changes
from balancer.errors import StoreUnavailable
from balancer.model import OwnershipRecord
from balancer.stores.memory import MemoryStore
from balancer.strategies import Plan, View, get_strategy

from .cluster import REF, Cluster


def cooperative(partitions: int, **options: Any) -> Cluster:
    cluster = Cluster(partitions, strategy="cooperative", interval=2.0, expiry=10.0, **options)
    return cluster


def add(cluster: Cluster, *names: str) -> None:
    for name in names:
        cluster.add(name).controls = cluster.store


class Spy:
    """Wraps a store's ``snapshot_since``: records the cursor of every read and whether it was full."""

    def __init__(self, store: MemoryStore) -> None:
        self.reads: list[tuple[str | None, bool, int]] = []
        inner = store.snapshot_since

        async def snapshot_since(ref: Any, cursor: str | None, stale_after: float | None = None) -> Changes:
            changes = await inner(ref, cursor, stale_after)
            self.reads.append((cursor, changes.full, len(changes.ownership)))
            return changes

        store.snapshot_since = snapshot_since  # type: ignore[method-assign]


async def test_every_plan_judges_ownership_as_a_full_listing_would() -> None:
    # The copy leaves other workers' renewals out (their ETags and times are those last read), so it
    # is not the listing record for record; but every partition has the listing's owner, every record
    # the delta brought is the listing's own, and the same records are alive.
    cluster = cooperative(24, seed=3)
    seen: list[bool] = []
    quiet: list[bool] = []
    strategy = get_strategy("cooperative")

    def plan(view: View, rng: random.Random) -> Plan:
        listed = {r.partition_id: r for r in cluster.store._listed(REF)}
        whole = replace(view, ownership=listed, fresh_after=None, exact=frozenset())
        seen.append(
            list(view.ownership) == list(listed)
            and all(r.owner_id == listed[p].owner_id for p, r in view.ownership.items())
            and all(view.ownership[p] == listed[p] for p in view.exact)
            and view.active().keys() == whole.active().keys()
        )
        quiet.append(any(view.ownership[p] != listed[p] for p in listed))
        return strategy.plan(view, rng)

    cluster.strategy = replace(strategy, plan=plan)
    spy = Spy(cluster.store)
    add(cluster, "a", "b", "c")
    await cluster.settle()
    add(cluster, "d")  # a join: steals and handoffs
    await cluster.cycle(8)
    cluster.crash("b")  # a crash: its leases expire, others take them
    await cluster.cycle(10)
    assert seen and all(seen)
    assert any(quiet), "no copy ever missed a renewal: the test proves nothing"
    assert sum(1 for _, full, _ in spy.reads if not full) > len(spy.reads) / 2  # mostly deltas


async def test_a_steady_cycle_reads_no_renewal_of_another_worker() -> None:
    # Renewals are left out of a delta (``stale_after``): once balanced, a worker reads the records
    # whose owner changed since its last read, and those nobody wrote for most of an expiry: none.
    cluster = cooperative(64)
    add(cluster, "a", "b", "c", "d")
    await cluster.settle()
    await cluster.cycle(6)
    spy = Spy(cluster.store)
    start = cluster.store._serial[REF]
    for _ in range(10):
        for worker in list(cluster.workers.values()):
            await worker.cycle()
        cluster.now += cluster.interval
    renewed = cluster.store._serial[REF] - start  # every write meanwhile was a renewal
    deltas = [rows for _, full, rows in spy.reads if not full]  # (and a safety-net full read once a minute)
    assert renewed >= 64 * 2 and len(deltas) >= 30 and sum(deltas) == 0, (renewed, spy.reads)


async def test_a_crashed_workers_leases_expire_in_the_copy_on_time_and_no_sooner() -> None:
    cluster = cooperative(8)
    add(cluster, "a", "b")
    await cluster.settle()
    await cluster.cycle(5)
    spy = Spy(cluster.store)
    last_renewal = max(r.last_modified or 0 for r in await cluster.store.list_ownership(REF) if r.owner_id == "a")
    cluster.crash("a")
    while sorted((await cluster.owners()).values()) != ["b"] * 8:
        await cluster.cycle()
        assert cluster.now - last_renewal <= 10.0 + 2.0 + 2.0, "slower than expiry + one interval (+ the step)"
    taken = [e for e in cluster.events if e.previous_owner == "a" and e.owner_id == "b"]
    assert len(taken) == 4 and all(e.at - last_renewal > 10.0 for e in taken)  # expired, not sooner
    assert any(not full for _, full, _ in spy.reads)  # judged on a copy kept from deltas


async def test_after_a_failed_cycle_and_once_an_expiry_the_read_is_whole() -> None:
    cluster = cooperative(8)
    add(cluster, "a")
    await cluster.settle()
    spy = Spy(cluster.store)
    await cluster.cycle(2)
    assert [full for _, full, _ in spy.reads] == [False, False]
    cluster.store.down = True
    worker = cluster.workers["a"]
    with pytest.raises(StoreUnavailable):
        await worker.cycle()
    cluster.store.down = False
    spy.reads.clear()
    await cluster.cycle(1)
    assert spy.reads == [(None, True, 8)]  # after the failure: no cursor, everything read
    await cluster.cycle(12)  # 24 s at a 10 s expiry: two safety-net full reads, the rest deltas
    fulls = [cursor for cursor, full, _ in spy.reads if full]
    assert fulls == [None] * 3 and len(spy.reads) == 13  # the other 10 reads: deltas


async def test_a_store_without_a_change_feed_is_read_in_full_every_cycle() -> None:
    class Plain(MemoryStore):
        snapshot_since = None  # type: ignore[assignment]

    store = Plain()
    await store.claim_ownership([OwnershipRecord(REF, "0", "a")])
    cluster = cooperative(4)
    cluster.store = store
    cluster.store._clock = lambda: cluster.now
    add(cluster, "a")
    await cluster.settle()
    worker = cluster.workers["a"]
    report = await worker.cycle()
    assert report.rows == 4


async def test_a_write_lost_to_a_hand_edit_the_feed_missed_makes_the_next_read_whole() -> None:
    cluster = Cluster(4, strategy="cooperative", interval=2.0, expiry=30.0)  # a full read every 15 cycles
    add(cluster, "a")
    await cluster.settle()
    worker = cluster.workers["a"]
    worker._table.forget()
    while (await worker.cycle()).requests != 1:  # a full read, then until a cycle that wrote nothing
        cluster.now += cluster.interval
    cluster.now += cluster.interval
    spy = Spy(cluster.store)
    key = (REF, "0")
    stored = cluster.store._ownership[key]
    cluster.store._ownership[key] = replace(stored, owner_id="ghost", etag="by-hand")  # no change number
    for _ in range(9):  # the lease's renewal is due within 8 cycles: it fails on the edited ETag
        lost = [e.partition_id for e in (await worker.cycle()).lost]
        cluster.now += cluster.interval
        if lost:
            break
    assert lost == ["0"] and all(not full for _, full, _ in spy.reads)  # the deltas did not show it
    await worker.cycle()
    assert spy.reads[-1][:2] == (None, True), spy.reads  # read whole at once, not at the safety-net read
