"""The schedule (``balancer.schedule.next_due``) with plain numbers: when the next read, renewal step and
wake-up are due, as the runtime's processor and the simulator both drive their coordinators."""

from __future__ import annotations

from dataclasses import replace

import pytest

from balancer.protocol import CycleReport, soon
from balancer.schedule import Inputs, Last, next_due

STEADY = Last(steady=True)


def test_after_a_cycle_the_next_read_is_one_interval_away_spread_by_the_jitter() -> None:
    assert next_due(Inputs(now=100.0, interval=10.0, last=Last())).read_at == 110.0
    assert next_due(Inputs(now=100.0, interval=10.0, jitter=0.1, draws=(0.0, 0.5), last=Last())).read_at == 109.0
    assert next_due(Inputs(now=100.0, interval=10.0, jitter=0.1, draws=(1.0, 0.5), last=Last())).read_at == 111.0


def test_a_failed_first_cycle_backs_off_doubling_up_to_the_most() -> None:
    waits = [next_due(Inputs(now=0.0, interval=2.0, start_failures=n, backoff_max=30.0)).read_at for n in range(1, 7)]
    assert waits == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    # Once a cycle worked, a failed one waits one interval.
    assert next_due(Inputs(now=0.0, interval=2.0, cycles=3, start_failures=5)).read_at == 2.0


def test_the_announcing_first_cycle_and_a_polled_handoff_read_again_soon() -> None:
    assert next_due(Inputs(now=0.0, interval=10.0, last=Last(announced=True))).read_at == 1.0  # at most 1 s
    assert next_due(Inputs(now=0.0, interval=2.0, last=Last(announced=True))).read_at == 0.5  # a quarter
    assert next_due(Inputs(now=0.0, interval=10.0, last=Last(waiting=True))).read_at == 1.0
    # With release notices the receiver waits for the notice, not a poll.
    assert next_due(Inputs(now=0.0, interval=10.0, last=Last(waiting=True), poll_waiting=False)).read_at == 10.0


def test_a_steady_worker_hearing_notices_waits_until_quiet_until_less_up_to_the_jitter() -> None:
    quiet = Inputs(0.0, 2.0, jitter=0.1, draws=(0.5, 0.0), last=STEADY, poll_waiting=False, quiet_until=3.5)
    due = next_due(quiet)
    assert (due.read_at, due.quiet) == (3.5, True)
    assert next_due(replace(quiet, draws=(0.5, 1.0))).read_at == pytest.approx(3.15)
    # Not when polling, after news, after a cycle that changed something, or for no longer than one interval.
    changes = [
        replace(quiet, poll_waiting=True),
        replace(quiet, news=True),
        replace(quiet, last=Last()),
        replace(quiet, quiet_until=1.5),
        replace(quiet, quiet_until=None),
    ]
    for changed in changes:
        due = next_due(changed)
        assert (due.read_at, due.quiet) == (2.0, False), changed


def test_a_partition_left_free_for_now_is_read_for_when_its_hold_ends_quiet_wait_or_not() -> None:
    # A partition released by a worker that left is left free a while (``cooperative.vacated_for``); the
    # cycle's report says until when, and the next read comes then, not at the next interval or quiet read.
    held = Last.of(CycleReport(owned=frozenset({"0"}), planned=False, recheck_at=1.2))
    assert held == Last(recheck_at=1.2) and not held.steady  # a hold to see to is no steady cycle
    due = next_due(Inputs(0.0, 2.0, last=held, poll_waiting=False, quiet_until=3.5))
    assert (due.read_at, due.quiet) == (1.2, False)
    assert next_due(Inputs(0.0, 2.0, last=Last(recheck_at=2.5))).read_at == 2.0  # the read comes first anyway
    assert next_due(Inputs(5.0, 2.0, last=Last(recheck_at=4.0))).read_at == 5.0  # already over: now


def test_a_renewal_step_due_before_the_read_comes_first() -> None:
    due = next_due(Inputs(now=0.0, interval=8.0, last=Last(), next_renewal=6.5))
    assert (due.renews, due.wake_at, due.read_at) == (True, 6.5, 8.0)
    # Between cycles the read stays where it was decided; a renewal after it is the cycle's.
    due = next_due(Inputs(now=6.5, interval=8.0, next_renewal=13.0, read_at=8.0))
    assert (due.renews, due.wake_at, due.read_at) == (False, 8.0, 8.0)


def test_stopping_leaves_nothing_due() -> None:
    due = next_due(Inputs(now=5.0, interval=8.0, last=Last(), next_renewal=6.0, stopping=True))
    assert due.stop and due.wake_at == 5.0 and not due.renews


def test_last_reads_a_cycle_report_and_soon_is_the_same_rule() -> None:
    steady = CycleReport(owned=frozenset({"0"}), planned=False)
    assert Last.of(steady) == STEADY
    assert Last.of(CycleReport(owned=frozenset(), waiting=("1",))) == Last(waiting=True)
    assert soon(CycleReport(owned=frozenset(), announced=True), 10.0) == 1.0
    assert soon(steady, 10.0) is None


def test_a_quiet_wait_looks_at_the_partitions_once_an_interval_before_its_read() -> None:
    quiet = Inputs(0.0, 30.0, last=STEADY, poll_waiting=False, quiet_until=57.0)
    due = next_due(quiet)
    assert (due.quiet, due.looks, due.wake_at, due.read_at) == (True, True, 30.0, 57.0)
    # Between cycles: one interval after the last wake-up, not past the read; a renewal first if sooner.
    assert next_due(Inputs(30.0, 30.0, read_at=57.0, quiet=True)).look_at is None
    due = next_due(Inputs(10.0, 30.0, read_at=57.0, quiet=True, next_renewal=20.0))
    assert (due.renews, due.looks, due.wake_at, due.look_at) == (True, False, 20.0, 40.0)
    # A wait of one interval does not look: its read does.
    assert next_due(Inputs(0.0, 30.0, last=Last())).look_at is None
