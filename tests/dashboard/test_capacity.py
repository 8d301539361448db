"""``dashboard/live/capacity.py``: desired workers from scripted histories of rates and lags (pure, no database),
its series on ``/metrics``, its keys in the console state, and its setting."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from balancer.model import HubRef
from dashboard.live import capacity
from dashboard.live.capacity import Capacity, History, Observation, estimate, keda_workers
from dashboard.live.console import ConsoleState, Figures, LagRules, Lease, PartitionRow, SourceStatus
from dashboard.live.metrics import render

PARTITIONS = 16
REF = HubRef("cap.example", "capacity-tests", "$Default")


@dataclass
class Fleet:
    """A scripted hub: ``enqueue`` events a second spread over the partitions, ``workers`` each able to
    checkpoint ``per_worker`` events a second; one observation every ``step`` seconds."""

    workers: int
    per_worker: float
    enqueue: float
    step: float = 1.0
    at: float = 1_000_000.0
    enqueued: float = 0.0
    processed: float = 0.0
    seen: list[Observation] = field(default_factory=list)

    def run(self, seconds: float) -> list[Observation]:
        for _ in range(int(seconds / self.step)):
            self.at += self.step
            self.enqueued += self.enqueue * self.step
            self.processed = min(self.enqueued, self.processed + self.workers * self.per_worker * self.step)
            self.seen.append(self.observe())
        return self.seen

    def observe(self) -> Observation:
        # One partition carries the totals (the estimate sums over partitions; spreading changes nothing).
        enqueued, processed = int(self.enqueued), int(self.processed)
        return Observation(
            self.at, {"0": enqueued - 1, "1": -1}, {"0": processed - 1, "1": -1}, enqueued - processed, self.workers
        )


def window(history: list[Observation], seconds: float = capacity.WINDOW_SECONDS) -> list[Observation]:
    return [o for o in history if o.at >= history[-1].at - seconds]


def test_a_fleet_that_keeps_up_needs_the_workers_it_has_and_no_more() -> None:
    fleet = Fleet(workers=2, per_worker=80, enqueue=100)

    found = estimate(window(fleet.run(120)), PARTITIONS)

    assert found.enqueue_rate == pytest.approx(100) and found.processing_rate == pytest.approx(100)
    assert found.backlog == 0 and found.keda_desired_workers == 0
    assert found.desired_workers == 2 and not found.measured_capacity
    assert found.reason is not None and "keeping up" in found.reason


def test_a_fleet_falling_behind_asks_for_enough_workers_to_keep_up_and_drain_within_the_target() -> None:
    fleet = Fleet(workers=1, per_worker=100, enqueue=300)

    found = estimate(window(fleet.run(60)), PARTITIONS, target=300)

    # 200 events a second pile up: 12000 after a minute; (300 + 12000 / 300) / 100 = 3.4
    assert found.backlog == 12_000 and found.enqueue_rate == pytest.approx(300)
    assert found.per_worker_rate == pytest.approx(100) and found.measured_capacity
    assert found.desired_workers == 4
    assert found.keda_desired_workers == PARTITIONS  # ceil(12000 / 64) = 188, capped at the partitions
    assert estimate(window(fleet.run(60)), PARTITIONS, target=60).desired_workers == 7  # (300 + 24000 / 60) / 100


def test_the_estimate_rises_while_the_backlog_grows_and_a_shorter_target_asks_for_more() -> None:
    fleet = Fleet(workers=1, per_worker=100, enqueue=150)
    desired = []
    for _ in range(10):
        desired.append(estimate(window(fleet.run(60)), PARTITIONS, target=120).desired_workers)

    assert desired == sorted(desired) and desired[0] >= 2 and desired[-1] > desired[0]
    history = window(fleet.seen)
    assert estimate(history, PARTITIONS, target=30).desired_workers > estimate(history, PARTITIONS).desired_workers


def test_catching_up_then_keeping_up_with_a_remembered_capacity_lets_the_fleet_shrink() -> None:
    fleet = Fleet(workers=1, per_worker=100, enqueue=300)
    history = History()
    for o in fleet.run(60):
        history.add(o)
    assert history.estimate(PARTITIONS, 300).desired_workers == 4
    assert history.capacity == pytest.approx(100)

    fleet.workers = 4  # scaled out: 400 a second against 300, the backlog of 12000 drains in two minutes
    for o in fleet.run(60):
        history.add(o)
    catching_up = history.estimate(PARTITIONS, 300)
    assert catching_up.backlog is not None and 0 < catching_up.backlog < 12_000
    assert catching_up.desired_workers == 4 and catching_up.measured_capacity

    for o in fleet.run(180):
        history.add(o)
    caught_up = history.estimate(PARTITIONS, 300)
    assert caught_up.backlog == 0 and caught_up.keda_desired_workers == 0
    assert caught_up.desired_workers == 3  # 300 a second at the 100 a worker measured while behind
    assert caught_up.measured_capacity and caught_up.reason is None


def test_a_remembered_capacity_below_what_a_worker_now_does_asks_for_no_more_workers() -> None:
    # As on a busy machine: the worker started late, fell behind, and its capacity was measured over a
    # window it spent partly starting (30 a second); it now keeps up with 36 a second, its checkpoints a
    # few events behind. 36.3 / 30 would ask for a second worker for ever.
    history, fleet = History(), Fleet(workers=1, per_worker=200, enqueue=36)
    history.capacity = 30.0
    for o in fleet.run(60):
        history.add(replace(o, backlog=13))
    found = history.estimate(PARTITIONS, 60)
    assert found.desired_workers == 1 and found.reason is not None and "keeping up" in found.reason
    history.capacity = 50.0  # a capacity measured above today's rate is used, and asks for one
    found = history.estimate(PARTITIONS, 60)
    assert found.desired_workers == 1 and found.measured_capacity and found.per_worker_rate == 50.0
    # A worker at the capacity remembered (100 a second) and the rate past it (120), the backlog not
    # yet behind: two, before the backlog says so.
    history.capacity, fleet.per_worker, fleet.enqueue = 100.0, 100, 120
    for o in fleet.run(60):
        history.add(replace(o, backlog=13))
    assert history.estimate(PARTITIONS, 60).desired_workers == 2


def test_never_more_than_the_partitions_nor_fewer_than_one() -> None:
    flood = Fleet(workers=1, per_worker=10, enqueue=10_000)
    assert estimate(window(flood.run(30)), PARTITIONS).desired_workers == PARTITIONS
    assert estimate(window(flood.seen), 4).desired_workers == 4

    idle = Fleet(workers=3, per_worker=10, enqueue=0)
    found = estimate(window(idle.run(30)), PARTITIONS)
    assert found.desired_workers == 1 and found.reason == "idle: nothing enqueued and no backlog"


def test_without_data_the_estimate_is_one_worker_and_says_why() -> None:
    assert estimate([], PARTITIONS) == Capacity(1, None, PARTITIONS, 300.0, None, 0, reason="no observation yet")

    one = Fleet(workers=1, per_worker=10, enqueue=5).run(1)
    found = estimate(one, PARTITIONS)
    assert found.desired_workers == 1 and found.enqueue_rate is None
    assert found.reason is not None and found.reason.startswith("not enough history")

    nobody = Fleet(workers=0, per_worker=10, enqueue=50)
    found = estimate(window(nobody.run(30)), PARTITIONS)
    assert found.desired_workers == 1 and found.backlog == 1500 and found.keda_desired_workers == 16
    assert found.reason is not None and found.reason.startswith("no worker owns a partition")


def test_a_recreated_hub_starts_a_new_history() -> None:
    history = History()
    for o in Fleet(workers=1, per_worker=100, enqueue=300).run(60):
        history.add(o)
    assert history.capacity is None and history.estimate(PARTITIONS, 300).measured_capacity
    again = Fleet(workers=1, per_worker=100, enqueue=300, at=history.points[-1].at)
    history.add(again.run(1)[0])

    assert len(history.points) == 1 and history.capacity is None
    assert history.estimate(PARTITIONS, 300).reason is not None


def test_keda_counts_only_the_lag_against_its_threshold() -> None:
    assert keda_workers(None, 16) is None
    assert [keda_workers(n, 16) for n in (0, 1, 64, 65, 640, 10**6)] == [0, 1, 1, 2, 10, 16]


def test_the_target_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        estimate([], PARTITIONS, target=0)


def _state(cap: Capacity | None) -> ConsoleState:
    return ConsoleState(REF, 1_000.0, 10.0, 0, SourceStatus("embedded"), (), (), capacity=cap)


def test_metrics_export_desired_workers_and_the_figures_it_comes_from() -> None:
    found = estimate(window(Fleet(workers=1, per_worker=100, enqueue=300).run(60)), PARTITIONS)

    text = render(REF, _state(found), {}).decode()

    assert "leaseboard_desired_workers 4.0" in text
    assert "leaseboard_keda_desired_workers 16.0" in text
    assert "leaseboard_backlog_events 12000.0" in text
    assert "leaseboard_enqueue_rate_events_per_second 300.0" in text
    assert "leaseboard_processing_rate_events_per_second 100.0" in text
    assert "leaseboard_processing_rate_per_worker_events_per_second 100.0" in text
    assert "leaseboard_target_catchup_seconds 300.0" in text
    assert "leaseboard_processing_workers 1.0" in text


def test_metrics_without_rates_still_say_one_worker_and_leave_the_rates_out() -> None:
    text = render(REF, _state(estimate([], PARTITIONS)), {}).decode()

    assert "leaseboard_desired_workers 1.0" in text
    assert "leaseboard_enqueue_rate_events_per_second" not in text.replace("# HELP", "").replace("# TYPE", "")


def test_the_console_state_carries_desired_workers_in_its_summary() -> None:
    capacity.forget()
    rules = LagRules(10, 5.0, 300.0)
    fleet = Fleet(workers=1, per_worker=100, enqueue=300)
    shown = None
    for o in fleet.run(30):
        plain = _state(None)
        base = replace(plain, generated_at=o.at)
        row = PartitionRow(
            "0", "w1", Lease.OWNED, o.at, o.checkpointed["0"], o.enqueued["0"], None, None, o.backlog, None
        )
        shown = replace(base, partitions=(row,)).with_figures(Figures(rules))
    assert shown is not None
    summary = shown.as_json()["summary"]

    assert shown.capacity is not None and summary["capacity"]["desired_workers"] == shown.capacity.desired_workers
    assert summary["capacity"]["keda_desired_workers"] == 1  # 6000 events, one partition
    assert summary["capacity"]["enqueue_rate"] == pytest.approx(300)
    assert summary["workers_draining"] == 0


@pytest.mark.parametrize("value", ["0", "-5", "soon", "inf"])
def test_a_wrong_target_is_refused_with_what_to_fix(value: str) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "LEASEBOARD_TARGET_CATCHUP_SECONDS": value, "DJANGO_SETTINGS_MODULE": "dashboard.settings"}
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], cwd=root, env=env, capture_output=True, text=True
    )

    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and "LEASEBOARD_TARGET_CATCHUP_SECONDS must be" in done.stderr


def test_the_target_defaults_to_five_minutes() -> None:
    assert capacity.configured_target() == 300.0
