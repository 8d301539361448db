"""A worker's waits between cycles: each ends at its time, or at once on ``stop()`` or ``wake()``.

One future per wait, which the sleep, ``stop()`` and ``wake()`` resolve: with the loop's own sleep
(as deployed) a timer resolves it, with no sleeping task and no ``asyncio.wait`` (the fewest turns
of the loop for a wait every idle worker makes every cycle and every renewal); an injected sleep (a
test's) runs as a task that resolves it when it returns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial

_SLEPT = object()  # what a wait's timer resolves it with (stop() and wake() resolve it with None)


def _resolve(future: asyncio.Future[object], value: object) -> None:
    if not future.done():
        future.set_result(value)


def _slept(future: asyncio.Future[object], sleep: asyncio.Task[None]) -> None:
    """An injected sleep returned (or failed: a wait ends as if it had slept): resolve ``future``."""
    if not sleep.cancelled():
        sleep.exception()  # retrieved, so the loop does not warn of it
        _resolve(future, _SLEPT)


class Waits:
    """The stop and wake-up of one worker, and the wait under way that either ends."""

    def __init__(self) -> None:
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self.waiting: asyncio.Future[object] | None = None  # what ``wait`` waits on (and its sleep)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        """End the wait under way, and every wait from now on, at once."""
        self._stop.set()
        self._interrupt()

    def wake(self) -> None:
        """End the wait under way (or the next one) at once."""
        self._wake.set()
        self._interrupt()

    def _interrupt(self) -> None:
        """End ``wait`` now (``stop()`` or ``wake()`` was called)."""
        if self.waiting is not None and not self.waiting.done():
            self.waiting.set_result(None)

    async def wait(self, seconds: float, sleeping: Awaitable[None] | None, late: Callable[[float], None]) -> bool:
        """Wait ``seconds`` (at least 0) or until ``stop()`` or ``wake()``, whichever comes first: on a
        timer of the loop's (``sleeping`` None: the loop's own sleep, as deployed), else until the
        injected sleep ``sleeping`` returns. True when ``stop()`` or ``wake()`` ended it; ``late`` is
        told how late a wait that slept its time ended (how late the loop ran this worker's timer)."""
        due = time.monotonic() + seconds
        loop = asyncio.get_running_loop()
        interrupted = self.waiting = loop.create_future()
        if self._stop.is_set() or self._wake.is_set():
            interrupted.set_result(None)
        ending: asyncio.TimerHandle | asyncio.Task[None]
        if sleeping is None:
            ending = loop.call_later(seconds, _resolve, interrupted, _SLEPT)
        else:
            ending = asyncio.ensure_future(sleeping)
            ending.add_done_callback(partial(_slept, interrupted))
        try:
            slept = await interrupted is _SLEPT
            woken = self._wake.is_set()
            if slept and not woken:
                late(time.monotonic() - due)
            return woken or self._stop.is_set()
        finally:
            self.waiting = None
            self._wake.clear()
            ending.cancel()
