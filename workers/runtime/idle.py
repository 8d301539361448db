"""The waits of one pump: idle until its reader says events came, and short pauses that end early
when the pump is stopped (polling a reader without ``notify``, backing off between tries).

A reader that offers ``notify(wake)`` (``workers.sources.arrivals``) wakes the pump when new events
may be there: an idle pump waits for that and costs nothing meanwhile, bounded only by a pending
checkpoint's time, its lease's deadline passing unrenewed (``arrive()``, from the processor's one
timer for all its pumps) and a safety read every ``idle_seconds``. A reader that can tell cheaply
that nothing came (``nothing_new()``) is asked that on the event loop instead, and read only if
something did; under a processor (``looked_after``) the processor asks for all its pumps at once
(``look()``), so such a pump keeps no timer of its own. A reader without ``notify`` is polled every
``poll_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
from collections.abc import Awaitable, Callable

from workers.runtime.checkpoints import Checkpointer, set_or_slept
from workers.runtime.config import PumpConfig, PumpStats
from workers.sources.base import PartitionReader

log = logging.getLogger("leaseboard.pump")


class Idle:
    """How one pump waits. ``stopping`` is the pump's stop; ``checkpoints`` bounds an idle wait by
    the pending checkpoint's time; ``label`` names the pump in the log."""

    def __init__(
        self,
        *,
        config: PumpConfig,
        checkpoints: Checkpointer,
        stats: PumpStats,
        monotonic: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        stopping: threading.Event,
        looked_after: bool,
        label: str,
    ) -> None:
        self._config = config
        self._checkpoints = checkpoints
        self._stats = stats
        self._monotonic = monotonic
        self._sleep = sleep
        self._stopping = stopping
        self._label = label
        self._arrived = asyncio.Event()  # set by the reader's notify() and by stop(): an idle pump reads again
        self._notified = False  # the reader offers notify(): idle waits for it instead of polling
        self._nothing_new: Callable[[], bool] | None = None  # the reader's cheap check at the safety read
        self._looked_after = looked_after
        self._idling = False  # waiting in wait() for an arrival: look() may find one

    def attach(self, reader: PartitionReader) -> None:
        """Listen to ``reader``'s arrivals where it offers ``notify``, and keep its ``nothing_new``."""
        self._notified = self._listen(reader)
        nothing_new = getattr(reader, "nothing_new", None)
        self._nothing_new = nothing_new if callable(nothing_new) else None

    def arrive(self) -> None:
        """End an idle wait (or the next one) at once: the pump reads (or pauses, or stops) next."""
        self._arrived.set()

    def clear(self) -> None:
        """Before a read: what arrives from now on wakes the idle wait after it."""
        self._arrived.clear()

    def look(self) -> None:
        """The safety read of an idle pump, by the processor for all its pumps: if its reader cannot
        say nothing came since the last read, the pump reads. Called on the event loop."""
        if self._idling and self._nothing_new is not None and not self._nothing_left():
            self._arrived.set()

    def _listen(self, reader: PartitionReader) -> bool:
        """Ask ``reader`` to wake this pump on new events; False if it cannot (it is polled then)."""
        notify = getattr(reader, "notify", None)
        if not callable(notify):
            return False
        loop = asyncio.get_running_loop()
        arrived = self._arrived

        def wake() -> None:  # any thread, once per write to the partition: cheap when already set
            if not arrived.is_set():
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                    loop.call_soon_threadsafe(arrived.set)

        try:
            notify(wake)
        except OSError as exc:
            log.warning(
                "%s: the source cannot wake this pump (%s); polling every %gs",
                self._label,
                exc,
                self._config.poll_seconds,
            )
            return False
        return True

    async def wait(self) -> None:
        """Nothing new to read: wait until the reader says events came (or ``stop()``), a pending
        checkpoint is due, ``deadline_passed()`` (the lease ran out unrenewed), or ``idle_seconds`` went by. A reader
        without ``notify`` is read again after ``poll_seconds``."""
        self._stats.idle_waits += 1
        if not self._notified:
            await self.pause(self._config.poll_seconds)
            return
        # Looked after, a pump whose reader answers nothing_new waits with no timer of its own for it.
        looked_after = self._looked_after and self._nothing_new is not None
        until = math.inf if looked_after else self._monotonic() + self._config.idle_seconds
        self._idling = True
        try:
            while not self._arrived.is_set() and not self._stopping.is_set():
                now = self._monotonic()
                bound = min(until, now + self._checkpoints.due_in(now))
                await self._await_arrival(max(bound - now, self._config.poll_seconds))
                now = self._monotonic()
                if self._checkpoints.due(now):
                    return  # a checkpoint
                if now >= until:
                    if not self._nothing_left():
                        return  # the safety read
                    until = now + self._config.idle_seconds
        finally:
            self._idling = False

    def _nothing_left(self) -> bool:
        """The reader says cheaply that nothing came since the last read (a safety read would find
        nothing). False where it cannot tell, or fails to: the pump reads, and the read says why."""
        if self._nothing_new is None:
            return False
        try:
            return bool(self._nothing_new())
        except Exception:  # e.g. a closed or vanished log: the read in the pump's thread reports it
            return False

    async def _await_arrival(self, seconds: float) -> None:
        """Wait for the reader's wake-up, ``stop()`` or ``seconds``, whichever comes first."""
        if self._arrived.is_set():
            return
        if math.isinf(seconds):  # nothing to time: an arrival (or a look, a deadline, stop()) ends it
            await self._arrived.wait()
            return
        await set_or_slept(self._arrived, self._sleep, seconds)

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds`` in short steps, ending early when the pump is asked to stop."""
        # Counted in steps rather than read off the clock, so a test's fake clock need not move.
        left = seconds
        while left > 0 and not self._stopping.is_set():
            await self._sleep(min(left, 0.05))
            left -= 0.05
