"""The five scenarios of 000_4f2f35b66d29b415.txt, with the document's own worked numbers."""

from __future__ import annotations

import random

from balancer.model import EventKind, OwnershipRecord, partition_ids
from balancer.strategies import View, get_strategy

from .cluster import REF, Cluster

plan = get_strategy("balanced").plan


def view(owner: str, partitions: int, held: dict[str, str], *, now: float = 100.0) -> View:
    records = {p: OwnershipRecord(REF, p, o, f"e{p}", now - 1.0) for p, o in held.items()}
    return View(owner, partition_ids(partitions), records, now, expiry=30.0)


async def test_cold_start_single_instance_claims_one_random_partition_per_cycle() -> None:
    # Scenario 1: P = 5, N = 1, empty store -> one random partition, then the rest one by one.
    cluster = Cluster(5)
    cluster.add("a")
    await cluster.cycle()
    assert len(await cluster.owners()) == 1
    await cluster.cycle(4)
    assert await cluster.counts() == [5]
    assert [e.kind for e in cluster.events] == [EventKind.CLAIM] * 5


def test_first_claim_is_random_not_always_partition_zero() -> None:
    picks = {plan(view("a", 5, {}), random.Random(seed)).claims[0].partition_id for seed in range(40)}
    assert len(picks) > 1


async def test_sixth_instance_on_five_partitions_stays_inactive() -> None:
    # Scenario 2: P = 5, N = 5 each owning one; a 6th joins: 5 / 6 = 0, 5 % 6 = 5 -> nothing to steal.
    cluster = Cluster(5)
    for w in "abcde":
        cluster.add(w)
    await cluster.settle()
    before = await cluster.owners()
    cluster.add("f")
    await cluster.cycle(20)
    assert await cluster.owners() == before
    assert sorted(await cluster.counts()) == [0, 1, 1, 1, 1, 1]


async def test_fourth_instance_on_eighteen_partitions_steals_one_per_cycle_to_4_4_5_5() -> None:
    # Scenario 3: P = 18, N = 3 owning 6 each; a 4th joins -> 18 / 4 = 4, 18 % 4 = 2 -> 4, 4, 5, 5.
    cluster = Cluster(18, seed=3)
    for w in "abc":
        cluster.add(w)
    await cluster.settle()
    assert await cluster.counts() == [6, 6, 6]
    cluster.events.clear()
    cluster.add("d")
    for expected_steals in range(1, 5):
        await cluster.cycle()
        steals = [e for e in cluster.events if e.kind is EventKind.STEAL]
        assert len(steals) == expected_steals  # at most one new partition per cycle
    await cluster.cycle(10)
    assert await cluster.counts() == [4, 4, 5, 5]
    steals = [e for e in cluster.events if e.kind is EventKind.STEAL]
    assert len(steals) == 4 and all(e.owner_id == "d" for e in steals)


async def test_crashed_instance_partitions_are_reclaimed_after_expiry_to_6_7_7() -> None:
    # Scenario 4: P = 20, N = 4 owning 5 each; one goes down -> 20 / 3 = 6, 20 % 3 = 2 -> 6, 7, 7.
    cluster = Cluster(20, expiry=30.0, interval=10.0, seed=4)
    for w in "abcd":
        cluster.add(w)
    await cluster.settle()
    assert await cluster.counts() == [5, 5, 5, 5]
    cluster.events.clear()
    cluster.crash("d")
    await cluster.cycle(3)  # 30 s: not yet expired
    assert not cluster.events
    await cluster.cycle(10)
    assert await cluster.counts() == [6, 7, 7]
    taken = [e for e in cluster.events if e.kind is EventKind.EXPIRE]
    assert len(taken) == 5 and {e.previous_owner for e in taken} == {"d"}
    assert not [e for e in cluster.events if e.kind is EventKind.STEAL]


async def test_partitions_added_to_the_hub_are_claimed_to_6_6_6_7() -> None:
    # Scenario 5: P = 20, N = 4 owning 5 each; the hub grows to 25 -> 25 / 4 = 6, 25 % 4 = 1.
    cluster = Cluster(20, seed=5)
    for w in "abcd":
        cluster.add(w)
    await cluster.settle()
    cluster.events.clear()
    cluster.partitions = 25
    await cluster.cycle(10)
    assert await cluster.counts() == [6, 6, 6, 7]
    new = [e for e in cluster.events if e.kind is EventKind.CLAIM]
    assert sorted(int(e.partition_id) for e in new) == [20, 21, 22, 23, 24]
    assert all(e.reason == "never owned" for e in new)


async def test_steady_state_moves_nothing() -> None:
    cluster = Cluster(18, seed=6)
    for w in "abcd":
        cluster.add(w)
    await cluster.settle()
    before = await cluster.owners()
    cluster.events.clear()
    await cluster.cycle(50)
    assert await cluster.owners() == before
    assert cluster.events == []


def test_unclaimed_partition_is_taken_only_within_the_share() -> None:
    # P = 5, N = 2: shares are 2 and 3, only one worker may own 3.
    held = {"0": "a", "1": "a", "2": "a", "3": "b"}
    assert plan(view("a", 5, held), random.Random(0)).claims == ()  # a owns 3 = floor + 1 already
    claims = plan(view("b", 5, held), random.Random(0)).claims
    assert [c.partition_id for c in claims] == ["4"]


def test_no_steal_from_owners_within_the_share() -> None:
    # P = 7, N = 3 as 3, 2, 2: balanced; nobody steals.
    held = {"0": "a", "1": "a", "2": "a", "3": "b", "4": "b", "5": "c", "6": "c"}
    for me in "abc":
        assert plan(view(me, 7, held), random.Random(0)).claims == ()


def test_below_floor_steals_from_too_many_at_the_ceiling() -> None:
    # P = 7, N = 3 as 3, 3, 1: nobody is above floor + 1 = 3, yet c is below the floor of 2.
    held = {"0": "a", "1": "a", "2": "a", "3": "b", "4": "b", "5": "b", "6": "c"}
    (claim,) = plan(view("c", 7, held), random.Random(0)).claims
    assert claim.kind is EventKind.STEAL and claim.previous_owner in {"a", "b"}


def test_expired_records_are_ignored_when_counting() -> None:
    now = 1000.0
    stale = OwnershipRecord(REF, "0", "ghost", "e0", now - 31.0)
    fresh = OwnershipRecord(REF, "1", "b", "e1", now - 1.0)
    v = View("a", ("0", "1"), {"0": stale, "1": fresh}, now, expiry=30.0)
    (claim,) = plan(v, random.Random(0)).claims
    assert claim.partition_id == "0" and claim.kind is EventKind.EXPIRE and claim.previous_owner == "ghost"


def test_a_worker_with_a_clock_ahead_thinks_everyone_expired() -> None:
    # "Clock skews" in 000: balanced judges expiry by the worker's own clock, so a worker whose clock
    # runs 3 minutes ahead sees every lease as expired. The project's default fixes this (store clock).
    assert get_strategy("balanced").store_clock is False
    held = {str(p): "b" for p in range(4)}
    v = view("a", 4, held, now=100.0)
    skewed = View("a", v.partition_ids, v.ownership, v.now + 180.0, v.expiry)
    (claim,) = plan(skewed, random.Random(0)).claims
    assert claim.kind is EventKind.EXPIRE
