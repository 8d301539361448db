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

from balancer.lease import EARLY
from balancer.protocol import Balancer
from workers.runtime.config import PumpStats
from workers.runtime.pump import PartitionPump, Sleep


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
        self._sleep = sleep
        self._stopped = stopped
        self._timer: tuple[float, asyncio.Task[None]] | None = None  # (the deadline, its task)

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
        first = min(ahead, default=None)
        timer = self._timer
        if timer is not None and timer[0] == first and not timer[1].done():
            return
        if timer is not None:
            timer[1].cancel()
        self._timer = None
        if first is not None and not self._stopped():
            name = f"deadlines {self._coordinator.owner_id}"
            self._timer = (first, asyncio.get_running_loop().create_task(self._at(first), name=name))

    async def _at(self, at: float) -> None:
        clock = self._coordinator.monotonic
        await self._sleep(max(0.0, at - clock()) + EARLY)  # EARLY: a timer may fire a hair early
        if clock() < at:
            return  # a test's sleep that only yields: the next cycle or renewal arms it again
        self._timer = None
        self.watch()  # tells the pumps whose deadline passed; arms the next one ahead

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer[1].cancel()
            self._timer = None
