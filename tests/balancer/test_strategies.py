"""``greedy`` and ``eph``: their rules on hand-made views, then on real coordinators."""

from __future__ import annotations

import random
from collections import Counter

from balancer.model import EventKind, OwnershipRecord, partition_ids
from balancer.strategies import STRATEGIES, View, get_strategy

from .cluster import REF, Cluster

greedy = get_strategy("greedy").plan
eph = get_strategy("eph").plan
NOW = 1000.0


def view(me: str, partitions: int, held: dict[str, str], *, expired: dict[str, str] | None = None) -> View:
    """``held``: partition -> live owner; ``expired``: partition -> owner whose lease ran out."""
    records = {p: OwnershipRecord(REF, p, o, f"e{p}", NOW - 1.0) for p, o in held.items()}
    records |= {p: OwnershipRecord(REF, p, o, f"x{p}", NOW - 31.0) for p, o in (expired or {}).items()}
    return View(me, partition_ids(partitions), records, NOW, expiry=30.0)


def deal(**counts: int) -> dict[str, str]:
    """Partitions 0.. dealt out: ``deal(a=3, b=1)`` gives a 0-2 and b 3."""
    owners = [owner for owner, n in counts.items() for _ in range(n)]
    return {str(i): owner for i, owner in enumerate(owners)}


def test_both_are_registered_and_judge_expiry_by_the_worker_clock() -> None:
    assert {"greedy", "eph"} <= set(STRATEGIES)
    assert not STRATEGIES["greedy"].store_clock and not STRATEGIES["eph"].store_clock


# greedy -------------------------------------------------------------------------------------


def test_greedy_alone_claims_every_partition_in_one_cycle() -> None:
    plan = greedy(view("a", 12, {}), random.Random(0))
    assert sorted(int(c.partition_id) for c in plan.claims) == list(range(12))
    assert {c.kind for c in plan.claims} == {EventKind.CLAIM}


def test_greedy_takes_unclaimed_and_expired_up_to_the_ceiling_and_then_does_not_steal() -> None:
    # P = 8, N = 2 (a, b): the ceiling is 4; b holds 5, 3 are free (one of them expired): a takes
    # the 3 free ones and steals nothing this cycle, as Microsoft's greedy does.
    held = deal(b=5)
    v = view("a", 8, held, expired={"5": "ghost"})
    plan = greedy(v, random.Random(1))
    assert Counter(c.kind for c in plan.claims) == {EventKind.CLAIM: 2, EventKind.EXPIRE: 1}


def test_greedy_stops_at_the_ceiling_even_with_more_free() -> None:
    # P = 12, N = 2: the ceiling is 6; a holds 2, b 2, 8 are free: a claims 4.
    plan = greedy(view("a", 12, deal(a=2, b=2)), random.Random(5))
    assert len(plan.claims) == 4 and {c.kind for c in plan.claims} == {EventKind.CLAIM}


def test_greedy_newcomer_steals_one_partition_a_cycle_from_the_fullest_owner() -> None:
    # 18 on 3 -> 4: 6, 6, 6 and a newcomer below its share of 4: one steal, from the first fullest.
    held = deal(a=6, b=6, c=6)
    for seed in range(10):
        (claim,) = greedy(view("d", 18, held), random.Random(seed)).claims
        assert claim.kind is EventKind.STEAL and claim.previous_owner == "a"
    held = deal(a=5, b=7, c=6)
    (claim,) = greedy(view("d", 18, held), random.Random(0)).claims
    assert claim.previous_owner == "b"


def test_greedy_does_not_move_anything_once_balanced() -> None:
    held = deal(a=5, b=5, c=4, d=4)
    for me in "abcd":
        assert greedy(view(me, 18, held), random.Random(3)).claims == ()


def test_greedy_balances_where_microsofts_rule_would_stop() -> None:
    # 5 on 3 held 3, 1, 1: Microsoft's code steals only below P // N = 1, so it never moves again;
    # here a worker below its target steals one from an owner above its allowance.
    (claim,) = greedy(view("b", 5, deal(a=3, b=1, c=1)), random.Random(0)).claims
    assert claim.kind is EventKind.STEAL and claim.previous_owner == "a"
    (claim,) = greedy(view("c", 18, deal(a=6, b=4, c=4, d=4)), random.Random(3)).claims
    assert claim.previous_owner == "a"


def test_greedy_at_its_share_steals_nothing_from_owners_at_the_ceiling() -> None:
    # P = 10, N = 4: 3, 3, 2, 2 is balanced; c has its floor and both extras are taken.
    held = deal(a=3, b=3, c=2, d=2)
    assert greedy(view("c", 10, held), random.Random(4)).claims == ()


def test_greedy_plans_as_azure_eventhubs_own_greedy_code() -> None:
    # The same decisions as the SDK's OwnershipManager on every view here: how many of each kind.
    from tests.benchmarks.microsoft_greedy import plan as microsoft

    cases = [
        view("a", 12, {}),
        view("a", 8, deal(b=5), expired={"5": "ghost"}),
        view("d", 18, deal(a=6, b=6, c=6)),
        view("c", 18, deal(a=5, b=5, c=4, d=4)),
        view("a", 12, deal(a=2, b=2)),
    ]
    for v in cases:
        ours, theirs = greedy(v, random.Random(7)), microsoft(v, random.Random(7))
        assert Counter(c.kind for c in ours.claims) == Counter(c.kind for c in theirs.claims)
        assert {c.previous_owner for c in ours.claims} == {c.previous_owner for c in theirs.claims}


async def test_greedy_cold_start_balances_one_steal_per_worker_per_round() -> None:
    # The first to cycle sees nobody and takes all 32; the others steal one a cycle until each holds 8.
    cluster = Cluster(32, strategy="greedy")
    for w in "abcd":
        cluster.add(w)
    await cluster.cycle()
    assert sorted(await cluster.counts()) == [1, 1, 1, 29]
    for _ in range(7):
        await cluster.cycle()
    assert await cluster.counts() == [8, 8, 8, 8]


# eph ----------------------------------------------------------------------------------------


def test_eph_does_not_steal_when_the_difference_is_one() -> None:
    # 004: "if the difference between this host and the biggest owner is 2 or more ... steal".
    held = deal(a=4, b=3)
    assert eph(view("b", 7, held), random.Random(0)).claims == ()
    held = deal(a=3, b=2, c=2)
    for seed in range(20):
        assert eph(view("c", 7, held), random.Random(seed)).claims == ()


def test_eph_steals_one_lease_from_the_biggest_owner_when_two_behind() -> None:
    held = deal(a=6, b=4, c=2)
    for seed in range(20):
        (claim,) = eph(view("c", 12, held), random.Random(seed)).claims
        assert claim.kind is EventKind.STEAL and claim.previous_owner == "a"


def test_eph_steals_at_most_one_lease_per_cycle_however_far_behind() -> None:
    held = deal(a=16)
    plan = eph(view("b", 16, held), random.Random(5))
    assert len(plan.claims) == 1 and plan.claims[0].kind is EventKind.STEAL


def test_eph_grabs_expired_and_new_leases_up_to_the_rounded_up_target() -> None:
    # 5 partitions, active hosts a and b: target = ceil(5 / 2) = 3; b holds 1, 3 are free.
    held = deal(a=1, b=1)
    plan = eph(view("b", 5, held, expired={"2": "ghost"}), random.Random(6))
    assert len(plan.claims) == 2
    assert {c.kind for c in plan.claims} <= {EventKind.CLAIM, EventKind.EXPIRE}


def test_eph_first_host_on_an_empty_store_grabs_everything() -> None:
    # Alone among the active hosts, its target is all of them (what EPH does at a cold start).
    plan = eph(view("a", 16, {}), random.Random(7))
    assert len(plan.claims) == 16


def test_eph_counts_only_hosts_with_live_leases() -> None:
    # ghost's leases expired: hosts are a and b, target ceil(8 / 2) = 4 for b.
    plan = eph(view("b", 8, deal(a=4), expired={"4": "ghost", "5": "ghost"}), random.Random(8))
    assert len(plan.claims) == 4


async def test_eph_newcomer_on_18_steals_one_per_cycle_to_4_4_5_5() -> None:
    cluster = Cluster(18, strategy="eph", seed=3)
    for w in "abc":
        cluster.add(w)
    await cluster.settle()
    assert await cluster.counts() == [6, 6, 6]
    cluster.events.clear()
    cluster.add("d")
    await cluster.cycle()
    assert [e.kind for e in cluster.events if e.owner_id == "d"] == [EventKind.STEAL]
    await cluster.cycle(10)
    assert await cluster.counts() == [4, 4, 5, 5]
