"""The events on the simulated partitions: how fast each comes, and where a checkpoint is.

Outside the hot-partition scenario each checkpoint is one event past the last; in it events come at
``base_rate`` a second on every partition, ``hot_factor`` times that on the hot one from the
disturbance on, and a checkpoint lags behind them by up to ``checkpoint_lag`` seconds' worth.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from balancer.sim.scenarios import Settings


@dataclass
class Events:
    """The events of one run (see the module docstring). Times are the simulated loop's."""

    settings: Settings
    flowing: bool  # hot-partition: events come at their rates
    lag: random.Random  # how far behind its events each checkpoint is
    hot: str | None = None  # the partition whose rate rises at ``since``
    since: float = float("inf")
    checkpoints: dict[str, int] = field(default_factory=dict)  # pid -> the last checkpoint's sequence number

    def rate(self, pid: str, now: float) -> float:
        """Events per second on ``pid`` at ``now``."""
        hot = pid == self.hot and now >= self.since
        return self.settings.base_rate * (self.settings.hot_factor if hot else 1.0)

    def sequence(self, pid: str, now: float) -> int:
        """The sequence number to checkpoint ``pid`` at ``now`` (recorded in ``checkpoints``)."""
        s = self.settings
        last = self.checkpoints.get(pid, 0)
        position = last + 1
        if self.flowing:
            position = int(s.base_rate * now)
            if pid == self.hot and now > self.since:
                position += int(s.base_rate * (s.hot_factor - 1) * (now - self.since))
            position -= int(self.rate(pid, now) * self.lag.uniform(0, s.checkpoint_lag))
        self.checkpoints[pid] = max(last, position)
        return self.checkpoints[pid]
