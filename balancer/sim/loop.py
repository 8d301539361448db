"""An asyncio event loop on simulated time, for the simulator.

The loop's clock starts at 0 and only moves when every task is waiting: where a real loop would
block in ``select()`` until the next timer, this one jumps its clock to that timer at once. So
``asyncio.sleep(10)`` takes no wall time, the real coordinator code (and anything it awaits,
``gather`` and ``wait_for`` included) runs unchanged, and runs are deterministic: with no real
I/O, the ready queue and the timer heap are ordered by the program alone.

Threads and real I/O do not mix with it (nothing would wake the loop); the simulator uses neither.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class SimulationStalled(RuntimeError):
    """Every task waits for something that no timer will bring (a deadlock in the simulation)."""


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0


class _InstantSelector(selectors.SelectSelector):
    """Never waits for file descriptors: a timeout becomes a jump of the simulated clock."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimulationStalled("no task is ready and no timer is set")
        if timeout > 0:
            self._clock.now += timeout
        return []


class SimulatedLoop(asyncio.SelectorEventLoop):
    """``time()`` is simulated seconds since the loop was made."""

    def __init__(self) -> None:
        self._sim_clock = _Clock()
        super().__init__(selector=_InstantSelector(self._sim_clock))

    def time(self) -> float:
        return self._sim_clock.now


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a fresh simulated loop; return its result (or raise its error)."""
    loop = SimulatedLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
