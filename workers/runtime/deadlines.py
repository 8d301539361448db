"""One timer for the lease deadlines of all a worker's pumps (``Pumps.watch_deadlines``).

Tell the running pumps whose lease deadline passed unrenewed (an idle pump then pauses, as a busy one
does at its next event), and arm one timer at the earliest deadline still ahead to do the same there.
A renewal moves the deadlines on before they pass, so in steady state the timer is re-armed at each
renewal and never fires: one timer per worker, where each idle pump used to wake at its lease's old
deadline after every renewal.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping

from balancer.protocol import Balancer
from workers.runtime.config import PumpStats
from workers.runtime.pump import PartitionPump, Sleep
from workers.runtime.timer import OneTimer


class DeadlineWatch:
    """``running`` is the worker's (partition -> pump and task); ``sleep`` the worker's; ``stopped``
    says whether the worker is stopping (no timer then)."""

    def __init__(
        self,
        coordinator: Balancer,
        running: Mapping[str, tuple[PartitionPump, asyncio.Task[PumpStats]]],
        sleep: Sleep,
        stopped: Callable[[], bool],
    ) -> None:
        self._coordinator = coordinator
        self._running = running
        # The next deadline ahead: it tells the pumps whose deadline passed and arms the next one.
        self._timer = OneTimer(coordinator.monotonic, sleep, stopped, self.watch, f"deadlines {coordinator.owner_id}")

    def watch(self) -> None:
        deadline, now = self._coordinator.deadline, self._coordinator.monotonic()
        ahead = []
        for pid, (pump, task) in self._running.items():
            if task.done() or pump.stopping:
                continue
            at = deadline(pid)
            if not math.isfinite(at):
                continue  # not held: the processor stops this pump
            if at > now:
                ahead.append(at)
            elif not pump.paused:
                pump.deadline_passed()
        self._timer.arm(min(ahead, default=None))

    def cancel(self) -> None:
        self._timer.cancel()
