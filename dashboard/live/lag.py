"""Burrow-style partition status, judged over a sliding window of lag samples. Pure: no Django, no clock.

The monitor samples every partition every ``LEASEBOARD_LAG_SAMPLE_SECONDS``; ``Window`` keeps the
last ``size`` samples of one partition and ``status()`` judges them. The first rule that matches
wins (docs/monitoring.md, "Lag and partition status"):

1. no lag figure (the event source could not be read): no status (None);
2. REWIND: the checkpointed sequence number went down between two samples of the window;
3. OK: no lag now;
4. STOP: lag, and no checkpoint written for ``stop_seconds`` (a partition that never had a
   checkpoint counts from the first sample that saw it with lag);
5. OK: the lag was zero in some sample of the window (it caught up recently);
6. STALL: a full window, lag in every sample, and the checkpoint never moved;
7. WARN: a full window in which the lag never went down and ended higher than it began;
8. OK.

Times are the store's clock (the snapshot's ``generated_at`` and the checkpoint's last write),
so a dashboard on a machine with a skewed clock judges alike.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    OK = "OK"
    WARN = "WARN"
    STALL = "STALL"
    STOP = "STOP"
    REWIND = "REWIND"


STATUSES: tuple[Status, ...] = tuple(Status)


@dataclass(frozen=True, slots=True)
class Sample:
    """One partition as one sampling round saw it."""

    at: float  # store clock
    sequence_number: int | None  # checkpointed; None without a checkpoint
    checkpoint_modified: float | None  # when the checkpoint was last written (store clock)
    lag: int | None  # events after the checkpoint; None when the source could not say


@dataclass(frozen=True, slots=True)
class Rules:
    size: int = 10  # samples in a full window
    stop_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.size < 2 or self.stop_seconds <= 0:
            raise ValueError(f"a window needs at least 2 samples and stop_seconds > 0, got {self}")


class Window:
    """The last ``rules.size`` samples of one partition, and since when it has had lag without a checkpoint."""

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.samples: deque[Sample] = deque(maxlen=rules.size)
        self.uncheckpointed_since: float | None = None

    def add(self, sample: Sample) -> Status | None:
        """Record ``sample`` (newer than every earlier one) and return the status it leads to."""
        self.samples.append(sample)
        if sample.sequence_number is None and sample.lag:
            if self.uncheckpointed_since is None:
                self.uncheckpointed_since = sample.at
        else:
            self.uncheckpointed_since = None
        return self.status()

    def status(self) -> Status | None:
        """The status of the window as it stands (the rules of the module docstring)."""
        if not self.samples:
            return None
        samples = list(self.samples)
        now = samples[-1]
        if now.lag is None:
            return None
        if _rewound(samples):
            return Status.REWIND
        if now.lag == 0:
            return Status.OK
        if self._stopped(now):
            return Status.STOP
        lags = [s.lag for s in samples]
        if any(lag == 0 for lag in lags):
            return Status.OK
        full = len(samples) >= self.rules.size and all(lag is not None for lag in lags)
        if not full:
            return Status.OK
        if len({s.sequence_number for s in samples}) == 1:
            return Status.STALL
        known = [lag for lag in lags if lag is not None]
        if all(b >= a for a, b in itertools.pairwise(known)) and known[-1] > known[0]:
            return Status.WARN
        return Status.OK

    def _stopped(self, now: Sample) -> bool:
        if now.sequence_number is None:
            since = self.uncheckpointed_since
            return since is not None and now.at - since >= self.rules.stop_seconds
        return now.checkpoint_modified is not None and now.at - now.checkpoint_modified >= self.rules.stop_seconds


def _rewound(samples: list[Sample]) -> bool:
    seen = [s.sequence_number for s in samples if s.sequence_number is not None]
    return any(b < a for a, b in itertools.pairwise(seen))


def lag_seconds(last_enqueued_time: float | None, checkpointed_time: float | None, lag: int | None) -> float | None:
    """Seconds between the newest event and the checkpointed one (0 without lag); None when unknown."""
    if lag == 0:
        return 0.0
    if lag is None or last_enqueued_time is None or checkpointed_time is None:
        return None
    return max(0.0, last_enqueued_time - checkpointed_time)
