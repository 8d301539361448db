"""How many workers the consumer group needs, from the enqueue rate, the processing rate and the lag.

``estimate`` is pure (no Django, no clock): it takes a history of observations of one hub (store
time; per partition the last enqueued and the checkpointed sequence numbers, the same figures the
lag samples hold) and returns a ``Capacity``:

- ``enqueue_rate``: events enqueued per second over the history (first to last observation);
- ``processing_rate``: events checkpointed per second over the same span, and per worker, divided
  by the workers that own partitions now;
- ``backlog``: the lag now (events after the checkpoints, every partition);
- ``desired_workers`` = ceil((enqueue_rate + backlog / target_catchup_seconds) / per-worker rate),
  never fewer than 1 nor more than the partitions (a partition has one reader per consumer group);
- ``keda_desired_workers``: KEDA's Event Hubs scaler for comparison, lag only:
  ceil(backlog / unprocessedEventThreshold (64)), at most the partitions (0 when there is no lag).

A worker's rate is its capacity only while it has more to do than it can do: when the fleet is
behind (the backlog is more than ``BEHIND_SECONDS`` of processing) the measured per-worker rate is
what a worker can do, and it is remembered (``History.capacity``). While the fleet keeps up, the
measured rate is only a lower bound of that capacity: the estimate then uses the remembered
capacity if there is one at or above it, and otherwise never asks for more workers than are working
(a fleet that keeps up needs no more; without this a lower bound would ask for one more worker
forever, and so would a remembered capacity measured short, below what the workers now do).

Without a history of at least ``MIN_SPAN_SECONDS``, or with no worker processing anything while
events wait, the rates are unknown: ``desired_workers`` is 1 and ``reason`` says why.

``History`` keeps the last ``WINDOW_SECONDS`` of observations of one hub; ``record`` adds one to the
process's history of a hub and estimates (``console.ConsoleState.with_figures`` calls it on every
state it builds: the monitor's, once a second).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from balancer.model import HubRef

DEFAULT_TARGET_SECONDS = 300.0
KEDA_THRESHOLD = 64  # KEDA's Event Hubs scaler: unprocessedEventThreshold, default 64
WINDOW_SECONDS = 60.0  # rates are measured over (up to) the last minute
MIN_SPAN_SECONDS = 5.0  # fewer seconds of history than this: no rates
BEHIND_SECONDS = 10.0  # a backlog of more than this many seconds of processing: the workers are saturated


@dataclass(frozen=True, slots=True)
class Observation:
    """One hub as one read saw it (store clock)."""

    at: float
    enqueued: Mapping[str, int]  # last enqueued sequence number per partition (known ones only)
    checkpointed: Mapping[str, int]  # checkpointed sequence number per partition (-1: no checkpoint yet)
    backlog: int | None  # the sum of the known lags; None when no lag is known
    workers: int  # workers that own at least one partition


@dataclass(frozen=True, slots=True)
class Capacity:
    desired_workers: int
    keda_desired_workers: int | None  # None when the lag is unknown
    partitions: int
    target_catchup_seconds: float
    backlog: int | None
    workers: int  # owning partitions now
    enqueue_rate: float | None = None  # events per second; None: not measured
    processing_rate: float | None = None
    per_worker_rate: float | None = None  # the rate the estimate divides by
    measured_capacity: bool = False  # per_worker_rate was measured while the fleet was behind (or remembered)
    span_seconds: float | None = None  # the history the rates cover
    reason: str | None = None  # why desired_workers is a default (1) or bounded, in words

    def as_json(self) -> dict[str, Any]:
        rnd = _round
        return {
            "desired_workers": self.desired_workers,
            "keda_desired_workers": self.keda_desired_workers,
            "keda_threshold": KEDA_THRESHOLD,
            "partitions": self.partitions,
            "target_catchup_seconds": self.target_catchup_seconds,
            "backlog": self.backlog,
            "workers": self.workers,
            "enqueue_rate": rnd(self.enqueue_rate),
            "processing_rate": rnd(self.processing_rate),
            "per_worker_rate": rnd(self.per_worker_rate),
            "measured_capacity": self.measured_capacity,
            "span_seconds": rnd(self.span_seconds),
            "reason": self.reason,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def keda_workers(backlog: int | None, partitions: int, threshold: int = KEDA_THRESHOLD) -> int | None:
    """KEDA's Event Hubs scaler: ceil(unprocessed events / threshold), capped at the partition count."""
    if backlog is None:
        return None
    return min(max(partitions, 1), math.ceil(backlog / threshold))


def _rates(first: Observation, last: Observation) -> tuple[float, float]:
    """Enqueued and checkpointed events per second between two observations, over the partitions both know
    (a partition whose numbers went down, a recreated hub or a reset checkpoint, counts nothing)."""
    span = last.at - first.at
    enqueued = sum(
        last.enqueued[p] - first.enqueued[p]
        for p in last.enqueued.keys() & first.enqueued.keys()
        if last.enqueued[p] >= first.enqueued[p]
    )
    checkpointed = sum(
        last.checkpointed[p] - first.checkpointed[p]
        for p in last.checkpointed.keys() & first.checkpointed.keys()
        if last.checkpointed[p] >= first.checkpointed[p]
    )
    return enqueued / span, checkpointed / span


def _clamp(n: int, partitions: int) -> int:
    return max(1, min(max(partitions, 1), n))


def estimate(
    history: Sequence[Observation],
    partitions: int,
    target: float = DEFAULT_TARGET_SECONDS,
    *,
    remembered: float | None = None,
    threshold: int = KEDA_THRESHOLD,
) -> Capacity:
    """The workers ``history`` (oldest first, store time increasing) says the group needs; ``remembered``
    is a per-worker capacity measured earlier while the fleet was behind (module docstring)."""
    if target <= 0:
        raise ValueError(f"the target catch-up time must be positive, got {target}")
    if not history:
        return Capacity(1, None, partitions, target, None, 0, reason="no observation yet")
    first, last = history[0], history[-1]
    backlog = last.backlog
    base = Capacity(1, keda_workers(backlog, partitions, threshold), partitions, target, backlog, last.workers)
    span = last.at - first.at
    if span < MIN_SPAN_SECONDS:
        return _with(base, reason=f"not enough history yet: rates need {MIN_SPAN_SECONDS:g} s of observations")
    enqueue_rate, processing_rate = _rates(first, last)
    base = _with(base, enqueue_rate=enqueue_rate, processing_rate=processing_rate, span_seconds=span)
    waiting = backlog or 0
    need = enqueue_rate + waiting / target
    if need <= 0:
        return _with(base, reason="idle: nothing enqueued and no backlog")
    per_worker = processing_rate / last.workers if last.workers and processing_rate > 0 else None
    behind = waiting > processing_rate * BEHIND_SECONDS
    if per_worker is not None and behind:
        rate, measured, reason = per_worker, True, None
    elif remembered is not None and remembered > 0 and (per_worker is None or remembered >= per_worker):
        rate, measured = remembered, True
        reason = None if per_worker is not None else "no worker processed events in the window: remembered capacity"
    elif per_worker is not None:
        # Keeping up: the measured rate is a lower bound of what a worker can do (and a remembered
        # capacity below it was measured short: over a window a worker spent partly starting, say).
        wanted = math.ceil(need / per_worker - 1e-9)
        desired = _clamp(min(wanted, last.workers), partitions)
        reason = "keeping up: a worker's capacity is not measured until the fleet falls behind; no more than working"
        return _with(base, desired_workers=desired, per_worker_rate=per_worker, reason=reason)
    else:
        why = "no worker owns a partition" if not last.workers else "no worker checkpointed anything in the window"
        return _with(base, reason=f"{why}: the per-worker rate is unknown, at least one worker is needed")
    desired = _clamp(math.ceil(need / rate - 1e-9), partitions)
    return _with(base, desired_workers=desired, per_worker_rate=rate, measured_capacity=measured, reason=reason)


def _with(capacity: Capacity, **changes: Any) -> Capacity:
    return replace(capacity, **changes)


@dataclass
class History:
    """The last ``window`` seconds of observations of one hub, and the last per-worker capacity measured."""

    window: float = WINDOW_SECONDS
    points: deque[Observation] = field(default_factory=deque)
    capacity: float | None = None

    def add(self, observation: Observation) -> None:
        """Keep ``observation`` (one not newer than the last is ignored; a hub whose numbers went down, a
        recreated one, starts a new history)."""
        if self.points:
            newest = self.points[-1]
            if observation.at <= newest.at:
                return
            if any(observation.enqueued.get(p, n) < n for p, n in newest.enqueued.items()):
                self.points.clear()
                self.capacity = None
        self.points.append(observation)
        while len(self.points) > 2 and observation.at - self.points[1].at >= self.window:
            self.points.popleft()

    def estimate(self, partitions: int, target: float) -> Capacity:
        found = estimate(list(self.points), partitions, target, remembered=self.capacity)
        if found.measured_capacity and found.per_worker_rate is not None and found.reason is None:
            self.capacity = found.per_worker_rate
        return found


_histories: dict[HubRef, History] = {}
_lock = threading.Lock()


def record(ref: HubRef, observation: Observation, partitions: int, target: float) -> Capacity:
    """Add ``observation`` to this process's history of ``ref`` and estimate from it."""
    with _lock:
        history = _histories.get(ref)
        if history is None:
            history = _histories[ref] = History()
        history.add(observation)
        return history.estimate(partitions, target)


def forget() -> None:
    """Drop every history (tests)."""
    with _lock:
        _histories.clear()


def configured_target() -> float:
    """``LEASEBOARD_TARGET_CATCHUP_SECONDS`` (the default without configured Django settings)."""
    from django.conf import settings

    if not settings.configured:
        return DEFAULT_TARGET_SECONDS
    return float(getattr(settings, "LEASEBOARD_TARGET_CATCHUP_SECONDS", DEFAULT_TARGET_SECONDS))
