"""Leases cheaper than Microsoft's (issue 15, item 2): a lease is renewed once half the expiry has
passed (or sooner, when one more late cycle and a failed renewal could let it lapse), not every cycle;
a worker holding partitions sends no heartbeat (its renewals show it alive); crash detection stays
within the expiry plus one interval."""

from __future__ import annotations

from balancer.model import Member, OwnershipRecord, alive_workers, signs_of_life
from balancer.strategies import get_strategy

from .cluster import REF, Cluster


async def test_at_a_2s_interval_and_10s_expiry_a_lease_is_renewed_every_third_cycle() -> None:
    cluster = Cluster(4, strategy="cooperative", interval=2.0, expiry=10.0)
    a = cluster.add("a")
    a.controls = cluster.store
    await cluster.settle()
    written = {r.partition_id: r.last_modified for r in await cluster.store.list_ownership(REF)}
    renewals, heartbeats = [], []
    for _ in range(12):
        members = {m.owner_id: m.last_seen for m in await cluster.store.list_members(REF)}
        requests = cluster.store.requests
        await cluster.cycle()
        spent = cluster.store.requests - requests
        records = {r.partition_id: r.last_modified for r in await cluster.store.list_ownership(REF)}
        renewals.append(records != written)
        heartbeats.append({m.owner_id: m.last_seen for m in await cluster.store.list_members(REF)} != members)
        written = records
        assert spent == (2 if renewals[-1] else 1)  # a snapshot, and the renewals' one claim when due
        assert all(cluster.now - at < 10.0 for at in records.values())  # never near expiring
    assert renewals.count(True) == 4, renewals  # at 6 s of age each time: 12 cycles, 4 renewals
    assert not any(heartbeats)  # it holds partitions: its renewals are its heartbeat


async def test_at_the_defaults_every_cycle_still_renews_two_cycles_ahead_of_expiry() -> None:
    cluster = Cluster(2, strategy="cooperative", interval=10.0, expiry=30.0)
    a = cluster.add("a")
    a.controls = cluster.store
    await cluster.settle()
    for _ in range(3):
        before = {r.partition_id: r.last_modified for r in await cluster.store.list_ownership(REF)}
        await cluster.cycle()
        after = {r.partition_id: r.last_modified for r in await cluster.store.list_ownership(REF)}
        assert all(after[p] != before[p] for p in after)


def test_a_worker_holding_leases_is_alive_by_them_and_a_phantom_is_not() -> None:
    members = [Member(REF, "w1", 100.0, {"expiry": "10"}), Member(REF, "w2", 100.0, {"expiry": "10"})]
    records = [OwnershipRecord(REF, "0", "w1", "e", 125.0), OwnershipRecord(REF, "1", "ghost", "e", 129.0)]
    assert signs_of_life(members, records) == {"w1": 125.0, "w2": 100.0}
    assert alive_workers(members, records, 130.0, 30.0) == {"w1"}  # w2: heartbeat 30 s old, expiry 10 s


async def test_a_crashed_holder_is_replaced_within_the_expiry_and_one_interval() -> None:
    cluster = Cluster(4, strategy="cooperative", interval=2.0, expiry=10.0)
    for name in ("a", "b"):
        cluster.add(name).controls = cluster.store
    await cluster.settle()
    await cluster.cycle(5)
    crashed_at = cluster.now
    cluster.crash("a")
    while sorted((await cluster.owners()).values()) != ["b"] * 4:
        await cluster.cycle()
        assert cluster.now - crashed_at <= 10.0 + 2.0 + 2.0, "slower than expiry + one interval (+ the cycle step)"
    assert get_strategy("cooperative").uses_members
