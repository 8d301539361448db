"""The pump of one owned partition: read from the checkpoint, call the handler, checkpoint.

Reading and sync handlers run in the pump's own thread (a ``ThreadLane``, ``lane.py``; the work
there is ``syncwork.py``), never on the event loop, so a slow handler delays only its own partition
and never a lease renewal. Events of one partition are handled strictly one after another (or one
batch after another); partitions run concurrently, one thread each.

Ownership. Before every handler call and every checkpoint the pump asks ``holds(partition)``,
the coordinator's local lease deadline (a sync handler's thread compares the deadline with the
clock itself: see ``syncwork.py``). Once it says no, the pump PAUSES without touching another
event: the lease may have run out in a store outage, yet nobody could claim the partition while
the store was down, so the pump keeps its reader, its position, the events it read but did not
handle, and its pending checkpoint (what it handled since the last one), and writes nothing. It
waits for the next cycle (the processor calls ``wake()``; at the latest every ``PAUSED_CHECK``
seconds). When the lease is renewed it first writes the pending checkpoint, then goes on where it
was: nothing is read or handled twice. When the lease is lost instead, the processor stops the
paused pump, which ends "expired" WITHOUT a checkpoint (the next owner starts after the last one
stored). A checkpoint refused with ``OwnershipLost`` (the store says another worker owns the
partition) ends the pump at once ("lost").

Idle. A reader that offers ``notify(wake)`` (``workers.sources.arrivals``: the embedded hub's
files through one watcher per process, Event Hubs through its long-polling receive) wakes the pump
when new events may be there: an idle pump waits for that and costs nothing meanwhile, bounded only
by a pending checkpoint's time, its lease's deadline passing unrenewed (so it pauses when the lease
may have run out: ``deadline_passed()``, from the processor's one timer for all its pumps) and a
safety read every ``idle_seconds``. A reader that can tell cheaply that nothing came (``nothing_new()``:
the embedded hub's readers, from the log's size) is asked that on the event loop instead, and read
only if something did; under a processor (``looked_after``) the processor asks for all its pumps at
once after a cycle (``look()``), so such a pump keeps no timer of its own. A reader without
``notify`` is polled every ``poll_seconds``.

Checkpoints: ``checkpoints.py`` (every ``checkpoint_events`` events or ``checkpoint_seconds``
seconds, and once more when the pump is stopped on purpose; delivery is at least once). Sequence
numbers: ``sequence.py`` (a jump is logged as lost data, and processing goes on).

Handler errors (the worker never dies of one):
1. the failure is logged and counted (``leaseboard_handler_errors_total``, the pump's ``errors``);
2. the same event (or batch) is retried up to ``retries`` times, waiting ``backoff_seconds``,
   doubling, at most ``backoff_max`` between tries; ``MalformedEvent`` skips the retries;
3. then the event (every event of a failed batch) is set aside to the dead-letter file
   (``deadletters.py``), and processing goes on with the next event, which moves the checkpoint
   past the dead-lettered one.
If the pump is stopped during retries, the failing event is neither handled nor set aside: the
checkpoint stays before it and the next owner tries it again. A pump paused during retries goes on
retrying once it resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import workers.metrics as metrics
from balancer.model import HubRef
from balancer.protocol import CheckpointStore
from workers.handlers import Handler, MalformedEvent, NotHeld, PartitionContext, batch_size, is_async
from workers.runtime.checkpoints import Checkpointer, CheckpointOutage, PauseLog
from workers.runtime.config import PumpConfig, PumpStats
from workers.runtime.deadletters import DeadLetters
from workers.runtime.lane import ThreadLane
from workers.runtime.sequence import SequenceGuard
from workers.runtime.syncwork import SyncWork
from workers.sources.base import EventSource, PartitionReader, PartitionTaken, Position, ReceivedEvent

log = logging.getLogger("leaseboard.pump")
Sleep = Callable[[float], Awaitable[None]]
PAUSED_CHECK = 1.0  # seconds: a paused pump looks at its lease at least this often (besides every wake())


class PartitionPump:
    """Processes one partition for one owner until stopped or the partition is lost; paused while
    its lease may have run out."""

    def __init__(
        self,
        *,
        ref: HubRef,
        partition_id: str,
        owner_id: str,
        holds: Callable[[str], bool],
        checkpoints: CheckpointStore,
        source: EventSource,
        handler: Handler,
        config: PumpConfig,
        dead_letters: DeadLetters,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        deadline: Callable[[str], float] | None = None,
        outage: CheckpointOutage | None = None,
        pauses: PauseLog | None = None,
        looked_after: bool = False,
    ) -> None:
        """``looked_after``: the caller does the safety read of this idle pump (``look()``) every
        ``idle_seconds``; the pump then arms no timer for it where its reader answers ``nothing_new``."""
        self.ref = ref
        self.partition_id = partition_id
        self.owner_id = owner_id
        self._holds = holds
        self._store = checkpoints
        self._source = source
        self._handler = handler
        self._batch = batch_size(handler)
        self._async = is_async(handler)
        self._config = config
        self._dead = dead_letters
        self._monotonic = monotonic
        self._sleep = sleep
        self.ctx = PartitionContext(ref, partition_id, owner_id, holds=self._handler_holds)
        self.stats = PumpStats()
        self._stopping = threading.Event()
        self._outage = outage or CheckpointOutage(owner_id)  # shared by the worker's pumps
        self._pauses = pauses or PauseLog(owner_id, monotonic)  # shared by the worker's pumps
        self._wake = asyncio.Event()  # set by wake() and stop(): a paused pump looks again
        self._arrived = asyncio.Event()  # set by the reader's notify() and by stop(): an idle pump reads again
        self._notified = False  # the reader offers notify(): idle waits for it instead of polling
        self._nothing_new: Callable[[], bool] | None = None  # the reader's cheap check at the safety read
        self._looked_after = looked_after
        self._idling = False  # waiting in _idle for an arrival: look() may find one
        self._lost = False  # stopped because the partition was lost: not one more checkpoint
        self.paused = False
        self._label = f"partition {partition_id} ({owner_id})"
        self._sequence = SequenceGuard(self._label, self.stats)
        self._checkpoints = Checkpointer(
            ref=ref, partition_id=partition_id, owner_id=owner_id, store=checkpoints, holds=self._may_write,
            config=config,
            stats=self.stats, outage=self._outage, monotonic=monotonic, label=self._label,
        )  # fmt: skip
        # Without a deadline (a pump built by hand) the lane asks ``holds`` once per chunk of events.
        self._deadline = deadline or (lambda pid: math.inf if holds(pid) else -math.inf)
        self._sync: SyncWork | None = None
        if not self._async:
            self._sync = SyncWork(
                handler=handler, ctx=self.ctx, batch=self._batch, max_events=config.max_events,
                deadline=self._deadline, monotonic=monotonic, may_go_on=self._may_go_on, advance=self._advance,
                sequence=self._sequence, checkpoints=self._checkpoints,
            )  # fmt: skip

    def stop(self, *, lost: bool = False) -> None:
        """Ask the pump to stop after the event in hand and write a final checkpoint. None when ``lost``
        (the partition was lost, even if claimed back since: this pump's position is stale) or when
        its lease may have run out: it then ends "expired". Called on the event loop."""
        self._lost = self._lost or lost
        if self._sync is not None:
            self._sync.stop()
        self._stopping.set()
        self._wake.set()
        self._arrived.set()

    def wake(self) -> None:
        """Let a paused pump look at its lease now (the processor calls it after every cycle)."""
        self._wake.set()

    def deadline_passed(self) -> None:
        """The lease's deadline passed unrenewed (the processor keeps one timer for all its pumps'
        deadlines): an idle pump stops waiting and pauses; a busy one pauses at its next event anyway."""
        self._arrived.set()

    def look(self) -> None:
        """The safety read of an idle pump, by the processor for all its pumps: if its reader cannot
        say nothing came since the last read, the pump reads. Called on the event loop."""
        if self._idling and self._nothing_new is not None and not self._nothing_left():
            self._arrived.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _held(self) -> bool:
        """The lease is certainly still valid (``holds`` and the deadline the lane thread compares agree)."""
        return self._holds(self.partition_id) and self._monotonic() < self._deadline(self.partition_id)

    def _may_go_on(self) -> bool:
        return not self._stopping.is_set() and self._held()

    def _handler_holds(self) -> bool:
        """``ctx.holds()``: the lease is still valid (a handoff or a shutdown in progress lets the
        handler finish what it has in hand, so stopping does not count; a lost partition does)."""
        return not self._lost and self._held()

    def _lease_gone(self, error: Exception | None) -> bool:
        """``error`` is the handler's ``NotHeld`` and the lease is indeed not held (raised while it is,
        it counts as any other failure, so a handler that always raises it cannot spin the pump)."""
        return isinstance(error, NotHeld) and not self._handler_holds()

    def _may_write(self, partition_id: str) -> bool:
        """The checkpointer's ``holds``: never once the partition was lost."""
        return not self._lost and self._holds(partition_id)

    async def _hold(self) -> bool:
        """True when the pump may go on: at once while its lease is held, else after a pause, once the
        lease is renewed and the pending checkpoint written. False when the pump must end: stopped
        (a paused pump then ends "expired", without a checkpoint) or its partition is lost."""
        while True:
            if self.stats.ended is not None:
                return False
            if self._stopping.is_set():
                if self._lost or not self._held():
                    self.stats.ended = "expired"  # no checkpoint: the next owner starts after the last one stored
                return False  # else (a handoff, a shutdown) the final checkpoint follows
            if self._held():
                if not self.paused:
                    return True
                # Renewed: checkpoint what was handled before the pause, then go on where it was.
                if await self._checkpoints.write(final=True):
                    self.paused = False
                    self._pauses.resume(self.partition_id)
                    log.info("%s: lease renewed, resuming after sequence number %s", self._label,
                             self.stats.last_sequence)  # fmt: skip
                    return True
                continue  # lost (the store said so), or not held again
            if not self.paused:
                self.paused = True
                self._pauses.pause(self.partition_id)
            await self._await_wake()

    async def _await_wake(self) -> None:
        """Wait for ``wake()``, ``stop()`` or ``PAUSED_CHECK`` seconds, whichever comes first."""
        self._wake.clear()
        sleeper = asyncio.ensure_future(self._sleep(PAUSED_CHECK))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait([sleeper, waker], return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()

    # the loop ------------------------------------------------------------------------------

    async def run(self) -> PumpStats:
        """Pump until stopped or the partition is lost; return the stats (``ended`` says why)."""
        lane = ThreadLane(f"pump-{self.owner_id}-{self.partition_id}")
        reader: PartitionReader | None = None
        try:
            position = await self._start_position()
            if position is None:
                return self._end()
            reader = await lane.call(self._source.reader, self.partition_id, position)
            self._notified = self._listen(reader)
            nothing_new = getattr(reader, "nothing_new", None)
            self._nothing_new = nothing_new if callable(nothing_new) else None
            self._checkpoints.start()
            while await self._hold():
                await self._step(lane, reader)
            if self.stats.ended is None:  # stopped while held: the final checkpoint
                written = await self._checkpoints.write(final=True)
                if not written and self.stats.ended is None:
                    self.stats.ended = "expired"  # the lease ran out just now: no checkpoint
            return self._end()
        except PartitionTaken as exc:
            log.warning("%s: the source gave the partition to another reader: %s", self._label, exc)
            self.stats.ended = "lost"
            return self._end()
        except Exception:
            self.stats.ended = "failed"
            raise
        finally:
            self._outage.forget(self.partition_id)
            if self.paused:
                self.paused = False
                self._pauses.end(self.partition_id)
            if reader is not None:
                lane.submit(reader.close)  # queued behind a handler that may still be running
            lane.close()

    def _end(self) -> PumpStats:
        if self.stats.ended is None:
            self.stats.ended = "stopped" if self._stopping.is_set() else "expired"
        log.info(
            "%s: pump %s after %d events (checkpoint at %s)",
            self._label, self.stats.ended, self.stats.processed, self.stats.checkpointed,
        )
        return self.stats

    async def _start_position(self) -> Position | None:
        """The checkpoint's position, else the configured initial one; None if stopped meanwhile."""
        while await self._hold():
            try:
                listed = await self._store.list_checkpoints(self.ref)
            except Exception as exc:
                metrics.STORE_ERRORS.labels(operation="list_checkpoints").inc()
                self._outage.failed(self.partition_id, exc)
                await self._pause(self._config.backoff_max)
                continue
            self._outage.ok(self.partition_id)
            found = next((c for c in listed if c.partition_id == self.partition_id), None)
            if found is None:
                log.info("%s: no checkpoint, starting at %s", self._label, self._config.initial_position.describe())
                return self._config.initial_position
            log.info("%s: resuming after checkpoint %d", self._label, found.sequence_number)
            self._sequence.after(found.sequence_number)
            self.stats.checkpointed = found.sequence_number
            return Position.after(found.sequence_number, found.offset)
        return None

    async def _step(self, lane: ThreadLane, reader: PartitionReader) -> None:
        """Read and handle until a checkpoint is due or nothing is left, or the pump must stop or pause
        (the loop in ``run`` asks ``_hold`` next: events read and not handled are kept)."""
        if self._sync is None:
            await self._step_on_loop(lane, reader)
            return
        self._arrived.clear()  # before the read: what arrives from now on wakes the idle wait below
        run = await lane.call(self._sync.work, reader)
        if run.error is not None:
            if not await self._recover(lane, run.failed, run.error):
                return
        elif run.stopped:
            return
        # Before a held-back read error ends the pump, what was handled is checkpointed.
        if await self._checkpoints.write(final=self._sync.deferred is not None) and run.idle:
            await self._idle()

    async def _step_on_loop(self, lane: ThreadLane, reader: PartitionReader) -> None:
        """Read once (in the lane) and hand what came to an async handler on the loop, pausing in
        place (with the events in hand) while the lease may have run out."""
        self._arrived.clear()
        events = await lane.call(reader.receive, self._batch or self._config.max_events)
        events = self._sequence.contiguous(events)
        if not events:
            if await self._checkpoints.write():
                await self._idle()
            return
        if self._batch is not None:
            await self._handle_batch(lane, events)
            return
        done = 0
        while done < len(events):
            if not await self._hold():
                return  # stopped or lost: the rest is the next owner's
            chunk = events[done : done + self._checkpoints.room()]
            handled, error = await self._run_async(chunk)
            self._advance(chunk[:handled])
            done += handled
            if error is not None:
                if not await self._recover(lane, [chunk[handled]], error):
                    return
                done += 1
            # Not written when no longer held (handled < len(chunk)): _hold pauses, then writes it.
            await self._checkpoints.write()

    # handler calls -------------------------------------------------------------------------

    async def _run_async(self, events: Sequence[ReceivedEvent]) -> tuple[int, Exception | None]:
        """Hand ``events`` one by one to the async handler, on the loop; (how many were handled, the
        error of the next one or None)."""
        for n, event in enumerate(events):
            if not self._may_go_on():
                return n, None
            try:
                await self._handler(event, self.ctx)
            except Exception as exc:
                # NotHeld: the handler found the lease gone before its work became visible.
                return (n, None) if self._lease_gone(exc) else (n, exc)
        return len(events), None

    async def _call_once(self, lane: ThreadLane, events: list[ReceivedEvent]) -> Exception | None:
        """One handler call with ``events`` (one event, or a batch); the error or None."""
        arg: Any = events if self._batch is not None else events[0]
        try:
            if self._async:
                await self._handler(arg, self.ctx)
            else:
                await lane.call(self._handler, arg, self.ctx)
        except Exception as exc:
            return exc
        return None

    async def _handle_batch(self, lane: ThreadLane, events: list[ReceivedEvent]) -> None:
        while True:
            if not await self._hold():
                return
            error = await self._call_once(lane, events)
            if not self._lease_gone(error):
                break  # else the handler found the lease gone: pause, then the same batch again
        if error is None:
            self._advance(events)
        elif not await self._recover(lane, events, error):
            return
        await self._checkpoints.write()

    async def _recover(self, lane: ThreadLane, events: list[ReceivedEvent], error: Exception) -> bool:
        """Retry ``events`` per the policy, else set them aside. False when the pump must stop (paused
        meanwhile, it goes on retrying once the lease is renewed)."""
        attempts = 1
        first = events[0].sequence_number
        while True:
            metrics.HANDLER_ERRORS.inc()
            self.stats.errors += 1
            log.warning(
                "%s: handler failed on sequence number %d (attempt %d of %d): %s: %s",
                self._label, first, attempts, self._config.retries + 1, type(error).__name__, error,
            )
            if isinstance(error, MalformedEvent) or attempts > self._config.retries:
                break
            delay = min(self._config.backoff_seconds * 2 ** (attempts - 1), self._config.backoff_max)
            await self._pause(delay)
            if not await self._hold():
                return False  # the next owner (or the next run) tries the event again
            retry_error = await self._call_once(lane, events)
            while self._lease_gone(retry_error):  # not an attempt: the lease ran out during it
                if not await self._hold():
                    return False
                retry_error = await self._call_once(lane, events)
            if retry_error is None:
                self._advance(events)
                return True
            error = retry_error
            attempts += 1
        for event in events:
            await lane.call(self._dead.add, self.ref, self.owner_id, event, error, attempts)
        metrics.DEAD_LETTERS.inc(len(events))
        self.stats.dead_lettered += len(events)
        log.error(
            "%s: set aside %d event(s) from sequence number %d to %s after %d attempt(s): %s: %s",
            self._label, len(events), first, self._dead.path(self.ref, self.partition_id) or "memory",
            attempts, type(error).__name__, error,
        )
        self._advance(events)
        return True

    def _advance(self, events: Sequence[ReceivedEvent]) -> None:
        if not events:
            return
        self._checkpoints.done(events)
        self.stats.processed += len(events)
        self.stats.last_sequence = events[-1].sequence_number
        metrics.EVENTS_PROCESSED.inc(len(events))

    # idle --------------------------------------------------------------------------------------

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
            log.warning("%s: the source cannot wake this pump (%s); polling every %gs", self._label, exc,
                        self._config.poll_seconds)  # fmt: skip
            return False
        return True

    async def _idle(self) -> None:
        """Nothing new to read: wait until the reader says events came (or ``stop()``), a pending
        checkpoint is due, ``deadline_passed()`` (the lease ran out unrenewed), or ``idle_seconds`` went by. A reader
        without ``notify`` is read again after ``poll_seconds``."""
        self.stats.idle_waits += 1
        if not self._notified:
            await self._pause(self._config.poll_seconds)
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
        sleeper = asyncio.ensure_future(self._sleep(seconds))
        waiter = asyncio.ensure_future(self._arrived.wait())
        try:
            await asyncio.wait([sleeper, waiter], return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waiter.cancel()

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds`` in short steps, ending early when the pump is asked to stop."""
        # Counted in steps rather than read off the clock, so a test's fake clock need not move.
        left = seconds
        while left > 0 and not self._stopping.is_set():
            await self._sleep(min(left, 0.05))
            left -= 0.05
