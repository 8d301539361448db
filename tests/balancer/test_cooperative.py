"""The default strategy against the targets of the balancer issue, on real coordinators."""

from __future__ import annotations

import random

from balancer.model import Control, ControlKind, EventKind, OwnershipRecord, partition_ids
from balancer.strategies import DEFAULT, View, get_strategy
from balancer.strategies.cooperative import target_counts

from .cluster import REF, Cluster


def cooperative(partitions: int, **kwargs: float) -> Cluster:
    return Cluster(partitions, strategy="cooperative", **kwargs)  # type: ignore[arg-type]


def moves(cluster: Cluster) -> list[tuple[str, str | None, str | None]]:
    """Ownership changes from one worker to another (claims of free partitions excluded)."""
    return [
        (e.partition_id, e.previous_owner, e.owner_id)
        for e in cluster.events
        if e.kind in (EventKind.STEAL, EventKind.EXPIRE) or (e.kind is EventKind.CLAIM and e.reason == "released")
    ]


def test_cooperative_is_the_default() -> None:
    assert DEFAULT == "cooperative" and get_strategy(None).name == "cooperative"
    assert get_strategy(None).store_clock


async def test_cold_start_32_on_4_balances_in_two_cycles_with_only_first_claims() -> None:
    cluster = cooperative(32)
    for w in "abcd":
        cluster.add(w)
    await cluster.cycle()
    assert await cluster.owners() == {}  # the first cycle only announces
    await cluster.cycle()
    assert await cluster.counts() == [8, 8, 8, 8]
    assert len(cluster.events) == 32 and {e.kind for e in cluster.events} == {EventKind.CLAIM}


async def test_scale_out_moves_the_minimum_by_handoff_never_by_steal() -> None:
    cluster = cooperative(32)
    for w in "abcd":
        cluster.add(w)
    await cluster.settle()
    cluster.events.clear()
    cluster.add("e")
    await cluster.cycle(3)  # e announces itself, shows itself ready, and is handed its share
    assert await cluster.counts() == [6, 6, 6, 7, 7]
    releases = [e for e in cluster.events if e.kind is EventKind.RELEASE]
    taken = [e for e in cluster.events if e.kind is EventKind.CLAIM]
    assert len(releases) == len(taken) == 6  # the minimum: 32 = 7+7+6+6+6 from 8+8+8+8
    assert all(e.handoff for e in releases)  # planned: in the cycle's request, no hook
    assert all(e.owner_id == "e" and e.reason == "released" for e in taken)
    assert not [e for e in cluster.events if e.kind in (EventKind.STEAL, EventKind.LOST)]


async def test_crash_orphans_are_owned_within_expiry_plus_one_cycle() -> None:
    cluster = cooperative(32, expiry=30.0, interval=10.0)
    for w in "abcd":
        cluster.add(w)
    await cluster.settle()
    cluster.crash("d")
    crashed_at = cluster.now
    while len(await cluster.owners()) < 32 or sorted(await cluster.counts()) != [10, 11, 11]:
        await cluster.cycle()
        assert cluster.now - crashed_at <= 30.0 + 2 * 10.0
    assert not [e for e in cluster.events if e.kind is EventKind.STEAL]


async def test_added_partitions_are_claimed_in_one_cycle() -> None:
    cluster = cooperative(16)
    for w in "abcd":
        cluster.add(w)
    await cluster.settle()
    cluster.partitions = 24
    await cluster.cycle()
    assert await cluster.counts() == [6, 6, 6, 6]


async def test_single_partition_never_moves() -> None:
    cluster = cooperative(1)
    for w in "abc":
        cluster.add(w)
    await cluster.settle()
    cluster.events.clear()
    await cluster.cycle(1000)
    assert cluster.events == []


async def test_a_clock_three_minutes_ahead_moves_nothing() -> None:
    cluster = cooperative(32)
    for w in "abcd":
        cluster.add(w)
    await cluster.settle()
    cluster.events.clear()
    cluster.skew["b"] = 180.0
    await cluster.cycle(100)
    assert cluster.events == []


async def test_drained_worker_hands_everything_off_and_claims_nothing() -> None:
    cluster = cooperative(32)
    for w in "abcd":
        cluster.add(w)
    await cluster.settle()
    cluster.events.clear()
    await cluster.store.put_control(Control(REF, ControlKind.DRAIN, "d"))
    await cluster.cycle(3)
    owners = await cluster.owners()
    assert "d" not in owners.values() and len(owners) == 32
    assert sorted(await cluster.counts()) == [0, 10, 11, 11]
    assert not [e for e in cluster.events if e.kind in (EventKind.STEAL, EventKind.LOST, EventKind.EXPIRE)]


async def test_pinned_partition_moves_to_its_worker_by_handoff_and_counts_toward_its_load() -> None:
    cluster = cooperative(8)
    for w in "ab":
        cluster.add(w)
    await cluster.settle()
    owners = await cluster.owners()
    victim = next(p for p, o in owners.items() if o == "a")
    await cluster.store.put_control(Control(REF, ControlKind.PIN, victim, "b"))
    await cluster.cycle(3)
    owners = await cluster.owners()
    assert owners[victim] == "b"
    assert sorted(await cluster.counts()) == [4, 4]
    assert not [e for e in cluster.events if e.kind is EventKind.STEAL]


def test_targets_give_the_extra_to_the_biggest_holders() -> None:
    assert target_counts(32, ["a", "b", "c", "d", "e"], {}, {"a": 8, "b": 8, "c": 8, "d": 8}) == {
        "a": 7,
        "b": 7,
        "c": 6,
        "d": 6,
        "e": 6,
    }
    # a worker pinned beyond its share keeps its pins; the others share the rest
    assert target_counts(10, ["a", "b", "c"], {"a": 6}, {}) == {"a": 6, "b": 2, "c": 2}


def test_a_live_holder_is_waited_for_then_overtaken_after_the_handoff_timeout() -> None:
    plan = get_strategy("cooperative").plan
    held = {p: OwnershipRecord(REF, p, "a", f"e{p}", 99.0) for p in partition_ids(4)}
    base = dict(
        owner_id="b",
        partition_ids=partition_ids(4),
        ownership=held,
        now=100.0,
        expiry=30.0,
        members=frozenset({"a", "b"}),
    )
    first = plan(View(**base), random.Random(0))  # type: ignore[arg-type]
    assert first.claims == () and len(first.waiting) == 2
    later = plan(View(**base, waiting={p: 60.0 for p in first.waiting}), random.Random(0))  # type: ignore[arg-type]
    assert {c.kind for c in later.claims} == {EventKind.STEAL} and len(later.claims) == 2


async def test_a_new_rebalance_token_is_reported_once_and_an_old_one_is_not() -> None:
    cluster = cooperative(4)
    await cluster.store.put_control(Control(REF, ControlKind.REBALANCE, "*", "before-start"))
    a = cluster.add("a")
    assert not (await a.cycle()).rebalance  # first cycle: a token from before start is old news
    assert not (await a.cycle()).rebalance
    await cluster.store.put_control(Control(REF, ControlKind.REBALANCE, "*", "operator-1"))
    assert (await a.cycle()).rebalance
    assert not (await a.cycle()).rebalance
