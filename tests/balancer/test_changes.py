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

        async def snapshot_since(ref: Any, cursor: str | None) -> Changes:
            changes = await inner(ref, cursor)
            self.reads.append((cursor, changes.full, len(changes.ownership)))
            return changes

        store.snapshot_since = snapshot_since  # type: ignore[method-assign]


async def test_every_plan_is_made_on_the_table_a_full_listing_gives() -> None:
    cluster = cooperative(24, seed=3)
    seen: list[bool] = []
    strategy = get_strategy("cooperative")

    def plan(view: View, rng: random.Random) -> Plan:
        listed = {r.partition_id: r for r in cluster.store._listed(REF)}
        seen.append(dict(view.ownership) == listed and list(view.ownership) == list(listed))
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
    assert sum(1 for _, full, _ in spy.reads if not full) > len(spy.reads) / 2  # mostly deltas


async def test_a_steady_cycle_reads_only_the_records_written_since_the_workers_last_read() -> None:
    cluster = cooperative(64)
    add(cluster, "a", "b", "c", "d")
    await cluster.settle()
    await cluster.cycle(6)
    spy = Spy(cluster.store)
    written: dict[str, int] = {}  # worker -> the store's change count at its last read
    rows, deltas = [], 0
    for _ in range(10):
        for name, worker in list(cluster.workers.items()):
            before = cluster.store._serial[REF]
            report = await worker.cycle()
            _, full, read = spy.reads[-1]
            if not full and name in written:
                # A delta: exactly the records written (renewed, here) since this worker's last read.
                assert read == len({p for (_, p), n in cluster.store._changed.items() if written[name] < n <= before})
                deltas += 1
            written[name] = before
            rows.append(report.rows)
        cluster.now += cluster.interval
    # Each worker renews its 16 leases every third cycle (2 s interval, 10 s expiry), and reads in full
    # once an expiry: on average far fewer than the 64 records a full listing reads every cycle.
    assert deltas >= 24 and sum(rows) / len(rows) < 64 * 0.6, rows


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
