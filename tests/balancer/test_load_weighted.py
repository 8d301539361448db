"""The default strategy with ``--load-weighted``: rates from checkpoints, published by their owners,
and shares by events per second (``balancer.load``, ``balancer.strategies.weights``)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balancer.load import RateMeter, format_rates, held_and_published, parse_rates, published
from balancer.model import Checkpoint, Member, OwnershipRecord, partition_ids
from balancer.sim.run import simulate
from balancer.strategies import RACE, get_strategy, load_weighted
from balancer.strategies.base import View
from balancer.strategies.weights import STRATEGY as WEIGHTED
from balancer.strategies.weights import assign, weights

from .cluster import REF, Cluster

T0 = 1_700_000_000.0


def held(assignment: dict[str, str], now: float = T0) -> dict[str, OwnershipRecord]:
    return {p: OwnershipRecord(REF, p, w, "e", now) for p, w in assignment.items()}


def view(
    owner: str, workers: list[str], pids: tuple[str, ...], records: dict[str, OwnershipRecord], loads: dict[str, float]
) -> View:
    return View(
        owner, pids, records, T0, 30.0, members=frozenset(workers), heartbeats=dict.fromkeys(workers, T0), loads=loads
    )


def load_of(assignment: dict[str, str], rates: dict[str, float]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for p, w in assignment.items():
        totals[w] = totals.get(w, 0.0) + rates[p]
    return totals


# measuring and publishing ----------------------------------------------------------------------


def checkpoint(pid: str, seq: int, at: float) -> Checkpoint:
    return Checkpoint(REF, pid, seq, last_modified=at)


def test_a_rate_is_the_slope_of_the_checkpoints_over_the_store_clock() -> None:
    meter = RateMeter(window=30.0)
    meter.observe([checkpoint("0", 100, T0)])
    assert meter.rate("0", T0 + 1) is None  # one version: nothing to measure yet
    meter.observe([checkpoint("0", 150, T0 + 10)])
    meter.observe([checkpoint("0", 150, T0 + 10)])  # read again: the same version counts once
    meter.observe([checkpoint("0", 400, T0 + 20)])
    assert meter.rate("0", T0 + 21) == pytest.approx(15.0)


def test_a_partition_that_stopped_checkpointing_for_a_window_measures_by_the_quiet_time_too() -> None:
    meter = RateMeter(window=30.0)
    meter.observe([checkpoint("3", 0, T0), checkpoint("3", 300, T0 + 30)])
    assert meter.rate("3", T0 + 40) == pytest.approx(10.0)
    assert meter.rate("3", T0 + 90) == pytest.approx(300 / 90)
    meter.observe([checkpoint("3", 5, T0 + 95)])  # moved back (a reset): history starts again
    assert meter.rate("3", T0 + 96) is None


def test_an_owner_keeps_the_published_rate_while_its_measurement_stays_within_a_fifth() -> None:
    meter = RateMeter(window=20.0)
    meter.observe([checkpoint("0", 0, T0), checkpoint("1", 0, T0), checkpoint("2", 0, T0)])
    meter.observe([checkpoint("0", 110, T0 + 10), checkpoint("1", 300, T0 + 10), checkpoint("2", 10, T0 + 10)])
    rates = meter.to_publish(["0", "1", "2", "9"], {"0": 10.0, "1": 10.0, "9": 4.0}, T0 + 11)
    assert rates == {"0": 10.0, "1": 30.0, "2": 1.0, "9": 4.0}  # 11/s kept as 10; 9 not measured: kept


def test_a_rate_that_stays_off_its_published_value_for_a_window_is_published_again() -> None:
    meter = RateMeter(window=20.0)
    seq = 0
    for t in range(0, 70, 10):
        meter.observe([checkpoint("0", seq, T0 + t)])
        seq += 1180  # 118/s against the 100/s published: within a fifth, but not within a tenth
    assert meter.to_publish(["0"], {"0": 100.0}, T0 + 60) == {"0": 100.0}  # off since now: kept
    assert meter.to_publish(["0"], {"0": 100.0}, T0 + 70) == {"0": 100.0}
    assert meter.to_publish(["0"], {"0": 100.0}, T0 + 80) == {"0": 118.0}  # off for a whole window


def test_rates_survive_their_text_form_and_a_bad_entry_costs_only_its_partition() -> None:
    rates = {"0": 12.5, "10": 0.0, "2": 1234.5}
    assert parse_rates(format_rates(rates)) == {"0": 12.5, "10": 0.0, "2": 1230.0}
    assert parse_rates("0=1.5,x=2,3=-1,4=nan,5=,6=7") == {"0": 1.5, "6": 7.0}


def test_the_fleet_plans_with_the_holders_rate_else_the_latest_one_published() -> None:
    members = [
        Member(REF, "a", T0 + 5, {"load": "0=50,1=9"}),  # released 1 to b, which has not published it yet
        Member(REF, "b", T0 + 1, {"load": "0=70,2=3"}),  # held 0 before a did
        Member(REF, "c", T0 + 9, {"load": "2=4"}),
    ]
    records = [OwnershipRecord(REF, "0", "a", "e", T0), OwnershipRecord(REF, "1", "b", "e", T0)]
    assert published(members, records) == {"0": 50.0, "1": 9.0, "2": 4.0}
    assert published(list(reversed(members)), list(reversed(records))) == published(members, records)


def test_a_partitions_rate_counts_as_its_holders_once_the_holder_published_it() -> None:
    members = [Member(REF, "a", T0, {"load": "0=50,1=9"}), Member(REF, "b", T0, {"load": "2=3"})]
    records = [OwnershipRecord(REF, p, w, "e", T0) for p, w in (("0", "a"), ("1", "b"), ("2", "b"), ("3", "a"))]
    assert held_and_published(members, records) == {"0", "2"}  # a still speaks for 1 until b does


# the assignment -----------------------------------------------------------------------------------


def test_load_weighted_is_the_defaults_variant_and_race_weighs_by_itself() -> None:
    assert load_weighted(get_strategy(None)) is WEIGHTED and WEIGHTED.uses_load and WEIGHTED.name == "cooperative"
    assert load_weighted(RACE) is RACE
    with pytest.raises(ValueError, match="--load-weighted works with cooperative"):
        load_weighted(get_strategy("greedy"))


def test_a_hot_partition_ends_on_a_worker_with_fewer_others() -> None:
    pids = partition_ids(32)
    workers = ["a", "b", "c", "d"]
    start = {p: workers[int(p) % 4] for p in pids}  # 8 each, the count-based balance
    rates = {p: 10.0 for p in pids} | {"5": 100.0}
    plan = assign(view("a", workers, pids, held(start), rates), held(start))
    loads = load_of(plan, rates)
    assert plan["5"] == "b"  # the hot partition stays where it is
    assert Counter(plan.values())["b"] < 8
    assert max(loads.values()) / (sum(loads.values()) / 4) <= 1.25
    assert max(load_of(start, rates).values()) / (sum(rates.values()) / 4) > 1.6
    moved = [p for p in pids if plan[p] != start[p]]
    assert all(start[p] == "b" for p in moved)  # only the hot worker gives partitions up


def test_with_no_rates_known_the_shares_are_the_count_based_ones() -> None:
    pids = partition_ids(10)
    plan = assign(view("a", ["a", "b", "c"], pids, {}, {}), {})
    assert sorted(Counter(plan.values()).values()) == [3, 3, 4]
    assert weights(pids, {"0": 0.0}) == dict.fromkeys(pids, 1.0)


def test_a_pinned_partition_goes_to_its_worker_and_counts_toward_its_load() -> None:
    pids = partition_ids(8)
    rates = dict.fromkeys(pids, 1.0) | {"0": 6.0}
    v = View("a", pids, {}, T0, 30.0, members=frozenset("ab"), pins={"0": "b"}, loads=rates)
    plan = assign(v, {})
    assert plan["0"] == "b" and Counter(plan.values()) == {"a": 7, "b": 1}


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[str], tuple[str, ...], dict[str, str], dict[str, float]]:
    workers = [f"w{i}" for i in range(draw(st.integers(1, 6)))]
    pids = partition_ids(draw(st.integers(1, 40)))
    holders = draw(st.lists(st.sampled_from([*workers, None]), min_size=len(pids), max_size=len(pids)))
    start = {p: w for p, w in zip(pids, holders, strict=True) if w is not None}
    rate = st.one_of(st.just(0.0), st.floats(0.1, 1000.0))
    rates = draw(st.dictionaries(st.sampled_from(pids), rate, max_size=len(pids)))
    return workers, pids, start, rates


@given(fleets())
@settings(max_examples=300, deadline=None)
def test_every_worker_plans_the_same_and_the_plan_is_where_it_stays(
    fleet: tuple[list[str], tuple[str, ...], dict[str, str], dict[str, float]],
) -> None:
    workers, pids, start, rates = fleet
    plans = [assign(view(w, workers, pids, held(start), rates), held(start)) for w in workers]
    assert all(p == plans[0] for p in plans)
    plan = plans[0]
    assert set(plan) == set(pids) and set(plan.values()) <= set(workers)
    again = assign(view(workers[0], workers, pids, held(plan), rates), held(plan))
    assert again == plan  # once the round has landed nobody moves anything


@given(st.integers(1, 6), st.integers(1, 60), st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_equal_rates_share_within_one_partition_from_any_start(
    workers: int, partitions: int, rng: random.Random
) -> None:
    names = [f"w{i}" for i in range(workers)]
    pids = partition_ids(partitions)
    start = {p: rng.choice(names) for p in pids if rng.random() < 0.8}
    plan = assign(view("w0", names, pids, held(start), dict.fromkeys(pids, 5.0)), held(start))
    counts = Counter(plan.values())
    assert max(counts[w] for w in names) - min(counts[w] for w in names) <= 1


@given(fleets(), st.randoms(use_true_random=False))
@settings(max_examples=500, deadline=None)
def test_partitions_freed_in_the_middle_of_a_round_go_on_to_another_worker(
    fleet: tuple[list[str], tuple[str, ...], dict[str, str], dict[str, float]], rng: random.Random
) -> None:
    workers, pids, start, rates = fleet
    plan = assign(view(workers[0], workers, pids, held(start), rates), held(start))
    moving = [p for p in start if plan[p] != start[p]]
    freed = {p for p in moving if rng.random() < 0.5}  # released by their holders, not claimed yet
    records = {p: OwnershipRecord(REF, p, "" if p in freed else w, "e", T0 - 1) for p, w in start.items()}
    active = {p: r for p, r in records.items() if r.owner_id}
    landed = {p: plan[p] for p in moving if p not in freed and rng.random() < 0.5}  # claimed already
    records.update({p: OwnershipRecord(REF, p, w, "e", T0) for p, w in landed.items()})
    active = {p: r for p, r in records.items() if r.owner_id}
    # every worker saw the releasers hold them (View.previous), so every worker plans alike
    plans = [assign(replace(view(w, workers, pids, records, rates), previous=start), active) for w in workers]
    assert all(p == plans[0] for p in plans)
    assert all(plans[0][p] != start[p] for p in freed)  # nothing freed is planned back onto its releaser


# real coordinators and the simulator -------------------------------------------------------


async def test_coordinators_measure_publish_and_move_load_off_the_hot_worker() -> None:
    cluster = Cluster(16, strategy="cooperative")
    cluster.strategy = WEIGHTED
    for w in "abcd":
        cluster.add(w)
    await cluster.settle()
    owners = await cluster.owners()
    hot = next(p for p, w in owners.items() if w == "a")
    seq: Counter[str] = Counter()
    for _ in range(12):  # events flow; each owner checkpoints what it holds once a cycle
        for p, w in (await cluster.owners()).items():
            seq[p] += 10 * int(cluster.interval) * (10 if p == hot else 1)
            await cluster.store.update_checkpoint(Checkpoint(REF, p, seq[p]), w)
        await cluster.cycle()
    members = {m.owner_id: parse_rates(m.info.get("load", "")) for m in await cluster.store.list_members(REF)}
    owners = await cluster.owners()
    assert members[owners[hot]][hot] == pytest.approx(100.0, rel=0.1)
    # every partition's rate is published by its holder, and the moves changed none of them
    assert all(p in members[w] for p, w in owners.items())
    assert {members[w][p] for p, w in owners.items() if p != hot} == {10.0}
    # 100/s is more than a quarter of the fleet's 250/s: the hot partition ends alone on its worker
    assert sorted(Counter(owners.values()).values()) == [1, 5, 5, 5] and Counter(owners.values())[owners[hot]] == 1


def test_the_simulated_hot_partition_spreads_within_a_quarter_with_weights_and_not_without() -> None:
    by_count = simulate(None, "hot-partition", 32, 4, seeds=3)
    weighted = simulate(None, "hot-partition", 32, 4, seeds=3, weighted=True)
    assert by_count["load_weighted"] is False and weighted["load_weighted"] is True
    assert by_count["load_spread"]["median"] > 1.5  # type: ignore[index]
    assert weighted["load_spread"]["max"] <= 1.25  # type: ignore[index]
    unowned = weighted["max_unowned_seconds"]
    assert isinstance(unowned, int | float) and unowned <= 0.5
    assert weighted["balanced_runs"] == 3
    assert weighted["overlap_seconds"] == {"median": 0, "max": 0}


def test_a_partition_moved_by_load_waits_at_most_a_soon_read_for_its_new_owner() -> None:
    # Two workers' weights can differ for a moment (a rate published between their reads): the one the
    # releaser meant may not take the partition when its notice wakes it. Every worker whose view has a
    # free partition another is to claim reads again "soon" (``cooperative.unclaimed_recheck``); before,
    # the partition waited for someone's next read: 9.7 s unowned on 16/4 at 10 s / 30 s (seed 11).
    result = simulate(None, "hot-partition", 16, 4, seeds=20, weighted=True)
    assert result["balanced_runs"] == 20
    assert result["max_unowned_seconds"] <= 1.0 + 0.2, result  # type: ignore[operator]
