"""The pipeline's live latency over the last minute: of its alerts, exactly, and of its aggregates,
estimated. One function (``latency``) for ``/api/pipeline`` and the ``/ws/pipeline/`` feed.

- **Alerts**: each alert raised in the window, ``raised_at - enqueued_time`` (from the event's
  enqueueing in the hub to its alert's commit, by whichever path raised it first); p50 and p95 are
  exact, interpolated between the two nearest alerts as ``statistics.quantiles(method="inclusive")``.
- **Aggregates**: a batch row keeps only its oldest and newest enqueued times, not each event's. The
  estimate takes a batch's events as spread evenly between them, so the latency of one of its events
  (``finished_at - enqueued``) is uniform between ``finished_at - newest_enqueued`` and
  ``finished_at - oldest_enqueued``; over the batches finished in the window, weighted by their
  events, that is a mixture of uniform distributions, whose quantiles are found by bisection on its
  distribution function (``mixture_quantile``). A batch with one of the two times missing counts as
  all its events at the other.

Figures are seconds rounded to the millisecond, null when the window holds nothing to measure.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from workers.models import Alert, PipelineBatch

WINDOW_SECONDS = 60
QUANTILES = {"p50": 0.5, "p95": 0.95}
BISECTIONS = 60  # halvings of the search interval: far below a millisecond for any span a batch has

# (events, lowest latency, highest latency) of one batch, in seconds
Spread = tuple[int, float, float]


def exact_quantile(ordered: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of ``ordered`` (sorted ascending), interpolated linearly; None when empty."""
    if not ordered:
        return None
    position = q * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def mixture_share(spreads: Sequence[Spread], x: float) -> float:
    """The share of the events whose latency is at most ``x`` (the mixture's distribution function)."""
    total = sum(events for events, _, _ in spreads)
    below = 0.0
    for events, low, high in spreads:
        if x >= high:
            below += events
        elif x > low:
            below += events * (x - low) / (high - low)
    return below / total


def mixture_quantile(spreads: Sequence[Spread], q: float) -> float | None:
    """The least latency at or below which a share ``q`` of the events lie; None without events."""
    spreads = [(events, min(low, high), max(low, high)) for events, low, high in spreads if events > 0]
    if not spreads:
        return None
    low = min(s[1] for s in spreads)
    high = max(s[2] for s in spreads)
    if mixture_share(spreads, low) >= q:
        return low
    for _ in range(BISECTIONS):  # invariant: share(low) < q <= share(high)
        middle = (low + high) / 2
        if middle in (low, high):
            break
        if mixture_share(spreads, middle) >= q:
            high = middle
        else:
            low = middle
    return high


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def alert_figures(latencies: Sequence[float]) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {"count": len(ordered), **{k: _rounded(exact_quantile(ordered, q)) for k, q in QUANTILES.items()}}


def aggregate_figures(spreads: Sequence[Spread]) -> dict[str, Any]:
    counted = [s for s in spreads if s[0] > 0]
    return {
        "events": sum(s[0] for s in counted),
        "batches": len(counted),
        **{k: _rounded(mixture_quantile(counted, q)) for k, q in QUANTILES.items()},
        "estimated": True,
    }


def spread_of(events: int, finished: datetime, newest: datetime | None, oldest: datetime | None) -> Spread | None:
    """A batch's events and the range of their latencies; None when it has neither enqueued time."""
    newest = newest or oldest
    oldest = oldest or newest
    if newest is None or oldest is None:
        return None
    return events, (finished - newest).total_seconds(), (finished - oldest).total_seconds()


def latency(hub: str, now: datetime | None = None) -> dict[str, Any]:
    """The ``latency`` object of ``/api/pipeline`` and of the feed, over the WINDOW_SECONDS before ``now``."""
    since = (now or timezone.now()) - timedelta(seconds=WINDOW_SECONDS)
    raised = Alert.objects.filter(hub=hub, raised_at__gte=since).values_list("raised_at", "enqueued_time")
    batches = PipelineBatch.objects.filter(hub=hub, finished_at__gte=since).values_list(
        "events", "finished_at", "newest_enqueued", "oldest_enqueued"
    )
    spreads = [s for s in (spread_of(*row) for row in batches) if s is not None]
    return {
        "window_seconds": WINDOW_SECONDS,
        "alerts": alert_figures([(at - enqueued).total_seconds() for at, enqueued in raised]),
        "aggregates": aggregate_figures(spreads),
    }
