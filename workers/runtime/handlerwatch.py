"""Handler calls that run past ``LEASEBOARD_HANDLER_TIMEOUT`` (issue 35, the handler's part).

Each pump says what its handler call has in hand and since when (``PartitionPump.calling``: the
time is read where the lane reads its clock for the lease deadline anyway, one attribute per call).
``HandlerWatch.look`` runs with every cycle and renewal step: a call in hand for the timeout or more
is reported stuck (``stuck(partition, seconds)``: the worker abandons it and restarts the partition,
or gives the partition up if it sticks again on the same event), and one timer is armed at the
moment the oldest call still under the timeout would reach it. So a call is found when it passes the
bound, not at the next look after it (a quiet worker looks every few seconds: a 5 s call against a
4 s timeout used to slip between two looks, and a stuck one was found up to a look late).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol

from workers.runtime.pump import Sleep
from workers.runtime.timer import OneTimer


class Calling(Protocol):
    @property
    def stopping(self) -> bool: ...

    def calling(self) -> tuple[object, float] | None: ...


class HandlerWatch:
    """``running`` is the worker's (partition -> pump and task), ``clock`` and ``sleep`` the worker's;
    ``stopped`` says whether the worker is stopping (no timer then)."""

    def __init__(
        self,
        timeout: float,
        running: Mapping[str, tuple[Calling, asyncio.Task[object]]],
        clock: Callable[[], float],
        sleep: Sleep,
        stopped: Callable[[], bool],
        stuck: Callable[[str, float], None],
    ) -> None:
        self.timeout = timeout
        self._running = running
        self._clock = clock
        self._stuck = stuck
        self._timer = OneTimer(clock, sleep, stopped, self.look, "handler watch")

    def look(self) -> None:
        now, first = self._clock(), None
        for pid, (pump, task) in list(self._running.items()):
            call = None if task.done() or pump.stopping else pump.calling()
            if call is None:
                continue
            due = call[1] + self.timeout
            if now >= due:
                self._stuck(pid, now - call[1])
            elif first is None or due < first:
                first = due
        self._timer.arm(first)

    def cancel(self) -> None:
        self._timer.cancel()
