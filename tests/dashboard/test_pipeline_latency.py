"""The pipeline's live latency (``dashboard/web/pipeline_latency.py``): exact quantiles of the alerts'
latencies, and the aggregates' estimate from the batches (a mixture of uniform distributions)."""

from __future__ import annotations

import random
import statistics
from datetime import UTC, datetime, timedelta

import pytest

from dashboard.web.pipeline_latency import (
    Spread,
    aggregate_figures,
    alert_figures,
    exact_quantile,
    latency,
    mixture_quantile,
    mixture_share,
    spread_of,
)
from workers.models import Alert, PipelineBatch

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def test_the_exact_quantiles_are_those_of_statistics_inclusive() -> None:
    values = [0.8, 0.1, 2.5, 0.4, 0.3, 1.2, 0.9]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    ordered = sorted(values)
    assert exact_quantile(ordered, 0.5) == pytest.approx(statistics.median(values))
    assert exact_quantile(ordered, 0.95) == pytest.approx(cuts[94])
    assert exact_quantile([3.0], 0.95) == 3.0
    assert exact_quantile([], 0.5) is None


def test_alert_figures_count_and_round_to_the_millisecond() -> None:
    assert alert_figures([1.0, 2.0, 3.0, 4.0]) == {"count": 4, "p50": 2.5, "p95": 3.85}
    assert alert_figures([0.12345]) == {"count": 1, "p50": 0.123, "p95": 0.123}
    assert alert_figures([]) == {"count": 0, "p50": None, "p95": None}


def test_one_batch_is_uniform_between_its_newest_and_oldest_event() -> None:
    spreads: list[Spread] = [(10, 1.0, 3.0)]
    assert mixture_quantile(spreads, 0.5) == pytest.approx(2.0)
    assert mixture_quantile(spreads, 0.95) == pytest.approx(2.9)
    assert mixture_share(spreads, 0.5) == 0.0 and mixture_share(spreads, 3.5) == 1.0


def test_batches_weigh_by_their_events() -> None:
    spreads: list[Spread] = [(9, 0.0, 1.0), (1, 10.0, 20.0)]  # 90 % of the events within a second
    assert mixture_quantile(spreads, 0.5) == pytest.approx(5 / 9)
    assert mixture_quantile(spreads, 0.95) == pytest.approx(15.0)


def test_a_batch_of_one_instant_is_a_step() -> None:
    spreads: list[Spread] = [(1, 1.0, 1.0), (1, 2.0, 4.0)]
    assert mixture_quantile(spreads, 0.5) == pytest.approx(1.0)  # the least latency reaching half
    assert mixture_quantile(spreads, 0.95) == pytest.approx(3.8)
    assert mixture_quantile([(5, 2.0, 2.0)], 0.95) == 2.0


def test_empty_batches_and_no_batches_give_no_figure() -> None:
    assert mixture_quantile([], 0.5) is None
    assert mixture_quantile([(0, 1.0, 2.0)], 0.5) is None
    assert aggregate_figures([]) == {"events": 0, "batches": 0, "p50": None, "p95": None, "estimated": True}


@pytest.mark.parametrize("seed", range(5))
def test_the_estimate_matches_the_events_spread_evenly(seed: int) -> None:
    """Each batch's events laid out evenly between its bounds, counted one by one: the same quantiles."""
    rng = random.Random(seed)
    spreads: list[Spread] = []
    for _ in range(rng.randint(1, 8)):
        low = rng.uniform(0.0, 5.0)
        spreads.append((rng.randint(1, 50), low, low + rng.choice([0.0, rng.uniform(0.0, 4.0)])))
    per_batch = 400  # points per event of a batch's spread
    laid_out = sorted(
        low + (high - low) * (i + 0.5) / (events * per_batch)
        for events, low, high in spreads
        for i in range(events * per_batch)
    )
    for q in (0.5, 0.95):
        exact = laid_out[min(int(q * len(laid_out)), len(laid_out) - 1)]
        assert mixture_quantile(spreads, q) == pytest.approx(exact, abs=0.02), (spreads, q)


def test_a_batch_missing_an_enqueued_time_counts_at_the_other() -> None:
    finished = NOW
    assert spread_of(5, finished, NOW - timedelta(seconds=1), NOW - timedelta(seconds=3)) == (5, 1.0, 3.0)
    assert spread_of(5, finished, None, NOW - timedelta(seconds=3)) == (5, 3.0, 3.0)
    assert spread_of(5, finished, NOW - timedelta(seconds=2), None) == (5, 2.0, 2.0)
    assert spread_of(5, finished, None, None) is None


def alert(hub: str, sequence: int, raised: datetime, latency_seconds: float) -> Alert:
    return Alert.objects.create(
        hub=hub,
        partition_id="0",
        sequence_number=sequence,
        home="home-1",
        kind="smoke",
        sensor="smoke",
        sensor_id="smoke-1",
        event="detected",
        event_time=raised - timedelta(seconds=latency_seconds),
        enqueued_time=raised - timedelta(seconds=latency_seconds),
        raised_at=raised,
        raised_by="landing",
    )


def batch(hub: str, batch_id: int, finished: datetime, events: int, newest: float, oldest: float) -> None:
    PipelineBatch.objects.create(
        hub=hub,
        query_id=f"q-{hub}",
        batch_id=batch_id,
        finished_at=finished,
        events=events,
        alerts=0,
        newest_enqueued=finished - timedelta(seconds=newest),
        oldest_enqueued=finished - timedelta(seconds=oldest),
        write_seconds=0.1,
    )


@pytest.mark.django_db
def test_latency_reads_the_last_minute_of_one_hub() -> None:
    for i, seconds in enumerate([0.2, 0.4, 0.6, 0.8, 1.0]):
        alert("sensors", i, NOW - timedelta(seconds=10 + i), seconds)
    alert("sensors", 99, NOW - timedelta(seconds=61), 30.0)  # raised before the window
    alert("other", 0, NOW - timedelta(seconds=1), 50.0)
    batch("sensors", 1, NOW - timedelta(seconds=5), 100, 2.0, 4.0)
    batch("sensors", 2, NOW - timedelta(seconds=70), 100, 40.0, 50.0)  # before the window
    batch("other", 1, NOW - timedelta(seconds=5), 100, 40.0, 50.0)

    figures = latency("sensors", now=NOW)

    assert figures == {
        "window_seconds": 60,
        "alerts": {"count": 5, "p50": 0.6, "p95": 0.96},
        "aggregates": {"events": 100, "batches": 1, "p50": 3.0, "p95": 3.9, "estimated": True},
    }
    empty = latency("nothing-here", now=NOW)
    assert empty["alerts"] == {"count": 0, "p50": None, "p95": None}
    assert empty["aggregates"]["p50"] is None and empty["aggregates"]["events"] == 0
