"""A cycle over half the interval is warned once, with its cause; an expiry under three intervals at start."""

from __future__ import annotations

import logging

import pytest
from django.core.management import CommandError, call_command

from balancer.protocol import CycleReport
from workers.runtime.slowcycles import CycleWatch


def report(seconds: float) -> CycleReport:
    return CycleReport(owned=frozenset({"0", "1"}), requests=4, seconds=seconds)


def test_a_slow_cycle_is_warned_once_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    watch = CycleWatch("w-0", interval=2.0)
    with caplog.at_level(logging.WARNING, "workers.runtime.processor"):
        watch.judge(report(0.1))
        watch.waited(0.0)
        for _ in range(3):
            watch.judge(report(1.4))
        watch.judge(report(0.05))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "a cycle took 1.40s, more than half the 2s interval (4 store requests, 2 partitions" in lines[0]
    assert "the store answers slowly" in lines[0]
    assert "cycles are quick again" in lines[1]


def test_a_late_event_loop_names_cpu_starvation(caplog: pytest.LogCaptureFixture) -> None:
    watch = CycleWatch("w-0", interval=2.0)
    watch.waited(1.2)
    with caplog.at_level(logging.WARNING, "workers.runtime.processor"):
        watch.judge(report(1.5))
    assert "woke this worker 1.20s late: the process is starved of CPU" in caplog.text


def test_an_expiry_under_three_intervals_is_warned_at_start(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING), pytest.raises(CommandError):
        # a bad --checkpoint-events stops the command right after the interval and expiry checks
        call_command("runworkers", "--store", "memory", "--interval", "8", "--expiry", "10", "--checkpoint-events", "0")
    assert "--expiry (10s) is under three --interval (8s)" in caplog.text
