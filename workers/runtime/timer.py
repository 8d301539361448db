"""One timer on the worker's clock, for a watch that must act at a moment rather than at the worker's
next look: the lease deadlines (``deadlines.py``), handler calls past their timeout
(``handlerwatch.py``) and reads that hang (``wedged.py``) each keep one. Its sleep is the worker's, so a
test's fake clock drives it: a sleep that only yields wakes it before its moment, and it then does
nothing (the next look arms it again)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from balancer.lease import EARLY
from workers.runtime.pump import Sleep


class OneTimer:
    """Calls ``fire()`` once the monotonic ``clock`` reaches the moment last armed, unless ``stopped()``."""

    def __init__(
        self, clock: Callable[[], float], sleep: Sleep, stopped: Callable[[], bool], fire: Callable[[], None], name: str
    ) -> None:
        self._clock, self._sleep, self._stopped, self._fire, self._name = clock, sleep, stopped, fire, name
        self._timer: tuple[float, asyncio.Task[None]] | None = None  # (the moment, its task)

    def arm(self, at: float | None, *, or_sooner: bool = False) -> None:
        """Fire at ``at`` (None: not at all) instead of the moment armed before; with ``or_sooner``, a
        pending timer that fires no later is kept (a look earlier than needed does no harm, and a watch
        that looks often need not make a task at every look)."""
        timer = self._timer
        if timer is not None and self.armed and at is not None and (timer[0] == at or (or_sooner and timer[0] <= at)):
            return
        self.cancel()
        if at is not None and not self._stopped():
            self._timer = (at, asyncio.get_running_loop().create_task(self._at(at), name=self._name))

    @property
    def armed(self) -> bool:
        """Whether a moment is armed and not reached yet."""
        return self._timer is not None and not self._timer[1].done()

    async def _at(self, at: float) -> None:
        await self._sleep(max(0.0, at - self._clock()) + EARLY)  # EARLY: a timer may fire a hair early
        self._timer = None
        if self._clock() >= at:
            self._fire()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer[1].cancel()
            self._timer = None
