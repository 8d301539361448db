"""001's wait formula and time spans, as pure functions: which reading of the formula, and why."""

from __future__ import annotations

import itertools

import pytest

from balancer.race.times import GrabTimers, LoadWeights, RaceTimes, race_wait

TIMES = RaceTimes()
D = TIMES.leases_held_delay


def challenger_wins(owner_holds: int, challenger_holds: int, owner_offset: float, other_offset: float) -> bool | None:
    """Who wins a race under a reading of the formula: True/False, None for a tie."""
    owner = (owner_holds - owner_offset) * D
    other = (challenger_holds + other_offset) * D
    return None if owner == other else other < owner


def test_the_reading_used_moves_a_partition_exactly_when_that_evens_the_load() -> None:
    for owner, other in itertools.product(range(1, 12), range(0, 12)):
        should_move = owner - other >= 2  # after a move the two differ by less than before
        assert (race_wait(other, None, TIMES) < race_wait(owner, 1, TIMES)) == should_move, (owner, other)
        assert race_wait(other, None, TIMES) != race_wait(owner, 1, TIMES)  # never a tie


def test_the_other_readings_tie_either_in_the_balanced_state_or_where_a_move_is_due() -> None:
    # (n - 1/2, n + 1/2): 4 against 3 (7 partitions on two nodes, balanced) is a coin toss at every
    # challenge: the partition jumps between the nodes for ever.
    assert challenger_wins(4, 3, 0.5, 0.5) is None
    # (n - 1, n + 1): 4 against 2 should move, but is a coin toss.
    assert challenger_wins(4, 2, 1, 1) is None
    # the two mixed readings never tie and agree with each other
    for owner, other in itertools.product(range(1, 10), range(0, 10)):
        assert challenger_wins(owner, other, 1, 0.5) == challenger_wins(owner, other, 0.5, 1) == (owner - other >= 2)


def test_a_single_partition_stays_on_its_node_by_half_a_delay() -> None:
    assert race_wait(1, 1, TIMES) == 0.0
    assert race_wait(0, None, TIMES) == D / 2


def test_waits_are_capped_below_the_minimum_lease_grab_time_and_the_owner_still_wins_at_the_cap() -> None:
    owner, other = race_wait(1000, 1, TIMES), race_wait(999, None, TIMES)
    assert other == TIMES.wait_cap < TIMES.minimum_lease_grab
    assert owner == TIMES.wait_cap - D < other


def test_load_weighted_the_owner_subtracts_the_challenged_partitions_measured_weight() -> None:
    # A holds a hot partition (weight 10) and an idle one (0.1); B holds two idle ones (0.2).
    assert race_wait(0.2, None, TIMES) < race_wait(10.1, 0.1, TIMES)  # B takes A's idle partition
    assert race_wait(0.2, None, TIMES) > race_wait(10.1, 10.0, TIMES)  # A keeps the hot one


def test_measured_rates_follow_the_event_counters_and_survive_a_pump_restart() -> None:
    counters = {"0": 0, "1": 0}
    weights = LoadWeights(counters.__getitem__, unit=100.0, floor=0.1, smoothing=1e-9)  # no smoothing
    weights.sample(["0", "1"], 0.0)
    counters["0"] = 1000
    weights.sample(["0", "1"], 1.0)
    assert weights.weight("0") == pytest.approx(10.0) and weights.weight("1") == 0.1
    counters["0"] = 50  # the pump restarted: its counter began again
    weights.sample(["0", "1"], 2.0)
    assert weights.weight("0") == pytest.approx(0.5)
    weights.sample(["1"], 3.0)
    assert "0" not in weights.rates


def test_spans_that_cannot_work_are_refused_naming_the_rule() -> None:
    with pytest.raises(ValueError, match="less than the normal lease time"):
        RaceTimes(normal_lease=60, minimum_lease_grab=60)
    with pytest.raises(ValueError, match="maximum lease time"):
        RaceTimes(maximum_lease=61)
    with pytest.raises(ValueError, match="fewer than 4 partitions"):
        RaceTimes(leases_held_delay=10)
    scaled = RaceTimes.scaled(6.0, leases_held_delay=0.05)
    assert (scaled.normal_lease, scaled.maximum_lease, scaled.maximum_shutdown) == (6.0, 9.0, 2.0)


def test_grab_timers_fire_in_order_and_a_moved_timer_fires_once_at_its_new_time() -> None:
    timers = GrabTimers()
    timers.set("0", 5.0)
    timers.set("1", 3.0)
    timers.set("0", 9.0)  # reset on receipt
    assert timers.next_at() == 3.0
    assert timers.pop_due(6.0) == ["1"]
    assert timers.next_at() == 9.0
    assert timers.pop_due(10.0) == ["0"] and timers.pop_due(100.0) == []
