"""The recovery check: how long ownership took to balance after a heal, judged by the cycles the
workers really ran (their logged cycles, read back on the monotonic clock)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from django.conf import settings

from balancer.protocol import CycleReport
from tests.chaos.cycles import Cycle, cycles
from tests.chaos.evidence import Evidence, Fault, Lease, OwnershipSample
from tests.netsplit.checks import bound, recovery, recovery_problems
from tests.netsplit.cluster import NetFleet
from workers.runtime.slowcycles import CycleWatch

FLEET = cast(
    NetFleet,
    SimpleNamespace(
        expiry=3.0,
        interval=0.5,
        workers={o: SimpleNamespace(owner=o, started=0.0, ended=None) for o in ("w1-0", "w2-0")},
    ),
)


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def logged_cycle(seconds: float, late: float, owner: str = "w1-0") -> str:
    """The line a worker writes for one cycle, through the real watch and the settings' log format."""
    handler = Kept()
    logger = logging.getLogger("workers.runtime.cycles")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        watch = CycleWatch(owner, interval=0.5)
        watch.waited(late)
        watch.judge(CycleReport(owned=frozenset({"0"}), requests=3, seconds=seconds))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
    (record,) = handler.records
    return logging.Formatter(cast(dict[str, Any], settings.LOGGING)["formatters"]["plain"]["format"]).format(record)


def test_the_cycles_a_worker_logs_are_read_back_on_the_monotonic_clock(tmp_path: Path) -> None:
    offset = time.time() - time.monotonic()
    before = time.monotonic()
    lines = [logged_cycle(0.8, 0.25), "2026-12-02 06:00:00,000 INFO workers.runtime.processor: worker w1-0 starts"]
    (tmp_path / "w1.log").write_text("\n".join(lines) + "\n")
    (found,) = cycles(tmp_path, offset)
    assert found.owner == "w1-0"
    assert found.seconds == pytest.approx(1.05)
    assert before - 0.01 <= found.ended <= time.monotonic() + 0.01  # to the log's millisecond


def samples(*balanced_at: float) -> list[OwnershipSample]:
    """Samples every 0.1 s from 0 to 20 s: both workers holding one partition each from the first of
    ``balanced_at`` on, only w1 holding both before it."""
    found = []
    for tenth in range(200):
        at = tenth / 10
        owners = ("w1-0", "w2-0") if at >= balanced_at[0] else ("w1-0", "w1-0")
        leases = {str(i): Lease(o, at) for i, o in enumerate(owners)}
        found.append(OwnershipSample(at=at, now=at, partitions=("0", "1"), leases=leases))
    return found


def healed(at: float, balanced: float) -> Evidence:
    return Evidence(
        expiry=3.0,
        produced={},
        handlings=[],
        dead_letters=set(),
        checkpoint_samples=[],
        ownership_samples=samples(balanced),
        faults=[Fault("cut-store", 1.0, at, frozenset({"w2-0"}))],
        phases=[],
        final_checkpoints={},
    )


def test_a_recovery_within_expiry_two_intervals_and_the_reconnection_passes() -> None:
    found = recovery(FLEET, healed(2.0, 2.0 + 6.0), {"cut-store"})
    (only,) = found
    assert only.seconds == pytest.approx(6.0) and only.slowest == 0.0
    assert bound(FLEET) == pytest.approx(3.0 + 2 * 0.55 + 2.0 + 0.2)
    assert recovery_problems(FLEET, found) == []


def test_a_slow_recovery_fails_unless_the_workers_cycles_were_that_slow() -> None:
    evidence = healed(2.0, 2.0 + 8.3)  # as a run under load once saw on Blob
    quick = [
        Cycle("w1-0", 3.0, 0.05),
        Cycle("w2-0", 6.0, 0.1),
        Cycle("w1-0", 2.5, 1.5),  # begun in the cut: its wait is the reconnection's
        Cycle("w1-0", 11.0, 3.0),  # after the recovery
    ]
    problems = recovery_problems(FLEET, recovery(FLEET, evidence, {"cut-store"}, quick))
    assert len(problems) == 1
    assert "cut-store: ownership balanced 8.3s after the heal" in problems[0]
    assert "the slowest meanwhile, 0.10s" in problems[0]
    slow = [*quick, Cycle("w2-0", 7.0, 1.3)]  # a cycle of 1.3 s (its loop's lateness included) meanwhile
    (found,) = recovery(FLEET, evidence, {"cut-store"}, slow)
    assert found.slowest == 1.3
    assert recovery_problems(FLEET, [found]) == []


def test_a_recovery_that_never_comes_fails_however_slow_the_cycles() -> None:
    evidence = healed(2.0, 99.0)
    found = recovery(FLEET, evidence, {"cut-store"}, [Cycle("w1-0", 5.0, 9.0)])
    assert found[0].seconds is None
    assert "cut-store: ownership balanced never after the heal" in recovery_problems(FLEET, found)[0]
