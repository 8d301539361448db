"""When a pump writes its partition's checkpoint, and what a failed write does.

A checkpoint is written after every ``checkpoint_events`` events or ``checkpoint_seconds`` seconds,
whichever comes first, and once more when the pump is stopped on purpose. Delivery is at least
once: a worker that dies loses its un-checkpointed tail, which the next owner handles again.

Failure modes. The store refusing a checkpoint with ``OwnershipLost`` (another worker owns the
partition now) stops the pump. Any other failure (the store is down) does not: the pump goes on
handling events while its lease lasts, and the next checkpoint, tried again after at least
``checkpoint_seconds``, covers them too. Every pump of a worker fails at once in a store outage, so
``CheckpointOutage`` reports it once for all of them.

A pump whose lease may have run out (no successful cycle for the expiry: the store is down) pauses
with its checkpoint still pending (``pump.py``; its wait: ``Pause``); ``PauseLog`` says so once per
worker, not once per partition, and counts the paused partitions (``leaseboard_paused_partitions``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import workers.metrics as metrics
from balancer.errors import OwnershipLost
from balancer.model import Checkpoint, HubRef
from balancer.protocol import CheckpointStore
from workers.runtime.config import PumpConfig, PumpStats
from workers.runtime.sink import OutageLog
from workers.runtime.tracing import pump_trace
from workers.sources.base import ReceivedEvent

log = logging.getLogger("leaseboard.pump")
T = TypeVar("T")


class CheckpointOutage:
    """The checkpoint store failing for one worker's pumps, logged once for all of them.

    In a store outage every pump of the worker fails its checkpoints at once; one line says so (and
    one says when it works again), not one per partition. It works again once no partition that
    failed is still failing; a pump that ends while failing is forgotten, so it cannot keep the
    outage open, and one partition failing on its own while the others succeed is not reported as
    recovered each time another partition checkpoints.
    """

    def __init__(self, owner_id: str) -> None:
        self._log = OutageLog(
            log,
            f"worker {owner_id}: checkpoint store",
            "retrying; events handled meanwhile are checkpointed when it answers (or handled again by the next owner)",
        )
        self._failing: set[str] = set()

    def failed(self, partition_id: str, exc: BaseException) -> None:
        self._failing.add(partition_id)
        self._log.failed(exc)

    def ok(self, partition_id: str) -> None:
        self._failing.discard(partition_id)
        if not self._failing:
            self._log.ok()

    def forget(self, partition_id: str) -> None:
        self._failing.discard(partition_id)


class PauseLog:
    """The pumps of one worker pausing and resuming, logged once for all of them and counted.

    In a store outage every lease of the worker runs out at about the same time, so every pump
    pauses: one line says so when the first pauses, one when the last is no longer paused (resumed
    once the lease was renewed, or ended because it was lost). ``leaseboard_paused_partitions``
    follows each pump.
    """

    def __init__(self, owner_id: str, monotonic: Callable[[], float]) -> None:
        self._owner_id = owner_id
        self._monotonic = monotonic
        self._paused: set[str] = set()
        self._since = 0.0
        self._resumed = 0
        self._ended = 0

    @property
    def paused(self) -> frozenset[str]:
        return frozenset(self._paused)

    def pause(self, partition_id: str) -> None:
        if partition_id in self._paused:
            return
        if not self._paused:
            self._since = self._monotonic()
            self._resumed = self._ended = 0
            log.warning(
                "worker %s: lease of partition %s may have run out (no successful cycle for the expiry): its pump "
                "pauses, and so will the others that run out; each keeps its position and its pending checkpoint, "
                "and resumes when its lease is renewed",
                self._owner_id,
                partition_id,
            )
        self._paused.add(partition_id)
        metrics.PAUSED_PARTITIONS.inc()

    def resume(self, partition_id: str) -> None:
        """The lease of ``partition_id`` was renewed: its pump goes on from where it was."""
        self._leave(partition_id, resumed=True)

    def end(self, partition_id: str) -> None:
        """The pump of ``partition_id`` ends while paused (the lease was lost, or the worker stops)."""
        self._leave(partition_id, resumed=False)

    def _leave(self, partition_id: str, *, resumed: bool) -> None:
        if partition_id not in self._paused:
            return
        self._paused.discard(partition_id)
        metrics.PAUSED_PARTITIONS.dec()
        if resumed:
            self._resumed += 1
        else:
            self._ended += 1
        if not self._paused:
            log.warning(
                "worker %s: pumps no longer paused after %.1fs: %d resumed where they were, %d ended without a "
                "checkpoint (lease lost or stopping)",
                self._owner_id,
                self._monotonic() - self._since,
                self._resumed,
                self._ended,
            )


class Checkpointer:
    """The checkpoint policy of one pump: what is done since the last checkpoint, and writing it.

    ``done`` is called from the pump's thread and ``write`` from the event loop. The loop writes
    after the thread's work, and also while it is still in progress when a checkpoint comes due by
    time (``during``): a read that waits long on a silent or starved hub must not hold back what was
    handled before it. ``done`` only ever moves ``_last`` on to an event handled, so whatever the
    loop takes from it is a true checkpoint.
    """

    def __init__(
        self,
        *,
        ref: HubRef,
        partition_id: str,
        owner_id: str,
        store: CheckpointStore,
        holds: Callable[[str], bool],
        config: PumpConfig,
        stats: PumpStats,
        outage: CheckpointOutage,
        monotonic: Callable[[], float],
        label: str,
    ) -> None:
        self._ref = ref
        self._partition_id = partition_id
        self._owner_id = owner_id
        self._store = store
        self._holds = holds
        self._events = config.checkpoint_events
        self._seconds = config.checkpoint_seconds
        # The final checkpoint (a handoff's, a stop's) is tried again this often on a store failure,
        # each wait doubling: a release after a failed one would have the next owner handle again what
        # this pump handled since its last checkpoint (a connection that died in an outage fails its
        # first request after the heal; the next, on a new connection, goes through).
        self._final_tries = 1 + config.retries
        self._backoff = config.backoff_seconds
        self._stats = stats
        self._outage = outage
        self._monotonic = monotonic
        self._label = label
        self._last: tuple[int, str] | None = None  # (sequence number, offset) of the last event done
        self._since = 0  # events done since the last checkpoint
        self._at = 0.0  # ``monotonic`` time of the last checkpoint (or of the start)
        self._retry_at = 0.0  # no write before this ``monotonic`` time (after a failed one)
        self._trace = pump_trace(ref, partition_id, owner_id)  # None while tracing is off

    def start(self) -> None:
        """Count ``checkpoint_seconds`` from now (the pump has just opened its reader)."""
        self._at = self._monotonic()

    def done(self, events: Sequence[ReceivedEvent]) -> None:
        """``events`` (in order, not empty) are handled or set aside: the next checkpoint covers them."""
        last = events[-1]
        self._last = (last.sequence_number, last.offset)
        self._since += len(events)

    def room(self) -> int:
        """How many events may be handled before a checkpoint is due by count (at least one)."""
        return max(1, self._events - self._since)

    def due(self, now: float) -> bool:
        """True when events are done since the last checkpoint and the count or the time says write one
        (and a failed write's retry time has come)."""
        if self._last is None or self._last[0] == self._stats.checkpointed or now < self._retry_at:
            return False
        return self._since >= self._events or now - self._at >= self._seconds

    def due_in(self, now: float) -> float:
        """Seconds until a checkpoint is due by time (inf when nothing is pending)."""
        if self._last is None or self._last[0] == self._stats.checkpointed:
            return math.inf
        return max(self._at + self._seconds, self._retry_at) - now

    async def during(self, work: Awaitable[T]) -> T:
        """``work``'s result (the pump's read, in its thread); meanwhile a checkpoint that comes due by
        time is written, so events handled before a read that hangs are checkpointed on time. A timer
        of the loop's (no task per read: reads are the pump's hot path) looks when one may be due."""
        loop = asyncio.get_running_loop()
        writing: asyncio.Task[bool] | None = None
        timer: asyncio.TimerHandle | None = None

        def arm() -> None:
            nonlocal timer
            wait = min(self.due_in(self._monotonic()), self._seconds)
            timer = loop.call_later(max(wait, 0.01), look)

        def look() -> None:
            nonlocal writing
            if (writing is None or writing.done()) and self.due(self._monotonic()):
                writing = loop.create_task(self._write_once(final=False))
            arm()

        arm()
        try:
            return await work
        finally:
            if timer is not None:
                timer.cancel()
            if writing is not None:
                await writing  # before the pump's own write after the read: one write at a time

    async def write(self, final: bool = False) -> bool:
        """Checkpoint the last event done if due (always when ``final``); False if ownership is gone
        (no longer held, or the store says another worker owns the partition: ``stats.ended`` is
        then "lost"). A store failure is logged and counted, and returns True; a final one is tried
        again first (``retries`` times, while the lease holds), and ``unsaved`` says one failed."""
        if not final:
            return await self._write_once(final=False)
        delay = self._backoff
        for _ in range(self._final_tries - 1):
            written = await self._write_once(final=True)
            if not written or not self.unsaved:
                return written
            await asyncio.sleep(delay)
            delay *= 2
        return await self._write_once(final=True)

    @property
    def unsaved(self) -> bool:
        """Events done since the last checkpoint written (a final write that failed leaves some)."""
        return self._last is not None and self._last[0] != self._stats.checkpointed

    async def _write_once(self, final: bool) -> bool:
        if not self.unsaved:
            return True
        now = self._monotonic()
        if not final and not self.due(now):
            return True
        if not self._holds(self._partition_id):
            return False
        assert self._last is not None
        sequence, offset = self._last
        counted = self._since  # the thread may count more meanwhile (``during``): those stay counted
        try:
            await self._store.update_checkpoint(
                Checkpoint(self._ref, self._partition_id, sequence, offset), self._owner_id
            )
        except OwnershipLost as exc:
            log.warning("%s: %s; stopping the pump", self._label, exc)
            self._stats.ended = "lost"
            return False
        except Exception as exc:
            # Keep handling while the lease lasts; the next checkpoint covers these events too.
            metrics.STORE_ERRORS.labels(operation="update_checkpoint").inc()
            self._outage.failed(self._partition_id, exc)
            self._retry_at = now + max(self._seconds, 0.5)
            return True
        self._outage.ok(self._partition_id)
        self._retry_at = 0.0  # the store answers again: the count and the time say when, as before
        metrics.CHECKPOINTS.inc()
        self._stats.checkpoints += 1
        self._stats.checkpointed = sequence
        if self._trace is not None:
            self._trace.checkpointed(sequence, offset, counted)
        self._since = max(0, self._since - counted)
        self._at = now
        return True


PAUSED_CHECK = 1.0  # seconds: a paused pump looks at its lease at least this often (besides every wake())


async def set_or_slept(event: asyncio.Event, sleep: Callable[[float], Awaitable[None]], seconds: float) -> None:
    """Wait until ``event`` is set or ``sleep(seconds)`` has returned, whichever comes first (a
    pump's own sleep: a test's fake clock moves it)."""
    sleeper = asyncio.ensure_future(sleep(seconds))
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait([sleeper, waiter], return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        waiter.cancel()


class Pause:
    """One pump's pause: ``wait()`` pauses it (told to the worker's ``PauseLog`` once) until ``wake()``
    (the processor's every cycle, a stop) or ``PAUSED_CHECK`` seconds, whichever comes first;
    ``resumed()`` (its lease was renewed) or ``ended()`` (the pump ends) closes it."""

    def __init__(self, partition_id: str, pauses: PauseLog, sleep: Callable[[float], Awaitable[None]]) -> None:
        self._partition_id = partition_id
        self._pauses = pauses
        self._sleep = sleep
        self._wake = asyncio.Event()
        self.on = False

    def wake(self) -> None:
        self._wake.set()

    async def wait(self) -> None:
        if not self.on:
            self.on = True
            self._pauses.pause(self._partition_id)
        self._wake.clear()
        await set_or_slept(self._wake, self._sleep, PAUSED_CHECK)

    def resumed(self) -> None:
        self.on = False
        self._pauses.resume(self._partition_id)

    def ended(self) -> None:
        if self.on:
            self.on = False
            self._pauses.end(self._partition_id)
