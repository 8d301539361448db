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
stored); stopped to be handed off, it waits for the renewal instead (the worker renews a handoff's
lease until its release) and writes its checkpoint. A checkpoint refused with ``OwnershipLost``
(the store says another worker owns the partition) ends the pump at once ("lost").

Idle. A pump with nothing new to read waits for its reader to say events came, bounded by a pending
checkpoint's time, its lease's deadline passing unrenewed and a safety read (``idle.py``).

Checkpoints: ``checkpoints.py`` (every ``checkpoint_events`` events or ``checkpoint_seconds`` seconds,
and once more when stopped on purpose; at least once). Sequence numbers: ``sequence.py``. Handler
errors: retried, then set aside as dead letters (``handling.py``); dead letters an operator replays
in place are handed to the handler between two reads (``inplace.py``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable

import workers.metrics as metrics
from balancer.model import HubRef
from balancer.protocol import CheckpointStore
from workers.handlers import Handler, NotHeld, PartitionContext
from workers.runtime.checkpoints import Checkpointer, CheckpointOutage, Pause, PauseLog
from workers.runtime.config import PumpConfig, PumpStats
from workers.runtime.deadletters import DeadLetters
from workers.runtime.handling import HandlerCalls
from workers.runtime.idle import Idle
from workers.runtime.inplace import InPlace, folder_for
from workers.runtime.lane import ThreadLane
from workers.runtime.sequence import SequenceGuard
from workers.sources.base import EventSource, PartitionReader, PartitionTaken, Position

log = logging.getLogger("leaseboard.pump")
Sleep = Callable[[float], Awaitable[None]]


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
        self._config = config
        self._monotonic = monotonic
        self._sleep = sleep
        self.ctx = PartitionContext(ref, partition_id, owner_id, holds=self._handler_holds)
        self.stats = PumpStats()
        self._stopping = threading.Event()
        self._outage = outage or CheckpointOutage(owner_id)  # shared by the worker's pumps
        self._pause = Pause(partition_id, pauses or PauseLog(owner_id, monotonic), sleep)  # the log: the worker's
        self._lost = False  # stopped because the partition was lost: not one more checkpoint
        self._handoff = False  # stopped to be released: a lease that may have run out is waited for
        self.has_read = False  # a step of this pump read without failing (``stuck.ReaderWatch``)
        self.reading_since: float | None = None  # when its read under way began (``wedged.WedgeWatch``)
        self._label = f"partition {partition_id} ({owner_id})"
        self._sequence = SequenceGuard(self._label, self.stats)
        self._build_rooms(handler, dead_letters, deadline, looked_after)

    def _build_rooms(
        self,
        handler: Handler,
        dead_letters: DeadLetters,
        deadline: Callable[[str], float] | None,
        looked_after: bool,
    ) -> None:
        """The pump's rooms: its checkpoints, its idle waits and its handler calls."""
        self._checkpoints = Checkpointer(
            ref=self.ref,
            partition_id=self.partition_id,
            owner_id=self.owner_id,
            store=self._store,
            holds=self._may_write,
            config=self._config,
            stats=self.stats,
            outage=self._outage,
            monotonic=self._monotonic,
            label=self._label,
        )
        self._idle = Idle(
            config=self._config,
            checkpoints=self._checkpoints,
            stats=self.stats,
            monotonic=self._monotonic,
            sleep=self._sleep,
            stopping=self._stopping,
            looked_after=looked_after,
            label=self._label,
        )
        # Without a deadline (a pump built by hand) the lane asks ``holds`` once per chunk of events.
        holds = self._holds
        self._deadline = deadline or (lambda pid: math.inf if holds(pid) else -math.inf)
        self._calls = HandlerCalls(
            handler=handler,
            ctx=self.ctx,
            config=self._config,
            dead_letters=dead_letters,
            checkpoints=self._checkpoints,
            stats=self.stats,
            label=self._label,
            sequence=self._sequence,
            deadline=self._deadline,
            monotonic=self._monotonic,
            hold=self._hold,
            may_go_on=self._may_go_on,
            lease_gone=self._lease_gone,
            pause=self._idle.pause,
        )
        self._sync = self._calls.sync
        folder = folder_for(dead_letters.directory, self.ref)
        self.in_place = InPlace(folder, self.ctx, self._calls.call_once, self._lease_gone, self._idle.arrive)

    def stop(self, *, lost: bool = False, handoff: bool = False) -> None:
        """Ask the pump to stop after the event in hand and write a final checkpoint. None when ``lost``
        (the partition was lost, even if claimed back since: this pump's position is stale) or when
        its lease may have run out: it then ends "expired", unless ``handoff`` (a planned move or a
        give-up, whose lease the worker renews until its release): it then waits, paused, for that
        renewal and writes its checkpoint, or for the loss. Called on the event loop."""
        self._lost = self._lost or lost
        self._handoff = handoff  # a shutdown's stop() after it does not wait: its own bound is short
        if self._sync is not None:
            self._sync.stop()
        self._stopping.set()
        self._pause.wake()
        self._idle.arrive()

    def wake(self) -> None:
        """Let a paused pump look at its lease now (the processor calls it after every cycle)."""
        self._pause.wake()

    @property
    def paused(self) -> bool:
        return self._pause.on

    def deadline_passed(self) -> None:
        """The lease's deadline passed unrenewed (the processor keeps one timer for all its pumps'
        deadlines): an idle pump stops waiting and pauses; a busy one pauses at its next event anyway."""
        self._idle.arrive()

    def look(self) -> None:
        """The safety read of an idle pump, by the processor for all its pumps: if its reader cannot
        say nothing came since the last read, the pump reads. Called on the event loop."""
        self._idle.look()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def calling(self) -> tuple[object, float] | None:
        """The event (or batch) a handler call of this pump has now and since when (its monotonic
        clock), else None (read from the loop)."""
        if self._calls.calling is not None:
            return self._calls.calling
        return None if self._sync is None else self._sync.calling

    def handed(self) -> int | None:
        """The last sequence number handed over, else the checkpoint it started after (None: neither)."""
        return self.stats.last_sequence if self.stats.last_sequence is not None else self.stats.checkpointed

    def abandon(self) -> None:
        """Give up on this pump's handler call, which is stuck: what the call does from now on is fenced
        (``ctx.holds()`` is False, nothing more is checkpointed); the caller cancels the pump's task,
        and the thread is left to end when the call returns, if ever."""
        self.stop(lost=True)

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
        (a paused pump then ends "expired", without a checkpoint, unless handed off: it waits for the
        renewal, then its final checkpoint follows) or its partition is lost."""
        while True:
            if self.stats.ended is not None:
                return False
            if self._stopping.is_set():
                if self._handoff and not self._lost and not self._held():
                    await self._pause.wait()  # its release waits for this pump (handoffs.py) and renews the lease
                    continue  # meanwhile: a deadline passed under load is no reason to hand events over twice
                if self._lost or not self._held():
                    self.stats.ended = "expired"  # no checkpoint: the next owner starts after the last one stored
                elif self.paused:  # renewed while stopping
                    self._pause.resumed()
                return False  # else (a handoff, a shutdown) the final checkpoint follows
            if self._held():
                if not self.paused:
                    return True
                # Renewed: checkpoint what was handled before the pause, then go on where it was.
                if await self._checkpoints.write(final=True):
                    self._pause.resumed()
                    log.info(
                        "%s: lease renewed, resuming after sequence number %s", self._label, self.stats.last_sequence
                    )
                    return True
                continue  # lost (the store said so), or not held again
            await self._pause.wait()

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
            gate = getattr(reader, "gate", None)
            if callable(gate):  # its link opens only while the lease holds (workers.sources.base)
                gate(self._held)
            self._idle.attach(reader)
            self._checkpoints.start()
            while await self._hold():
                if self.in_place.waiting:
                    await self.in_place.run(lane, self._may_go_on)
                    continue
                await self._step(lane, reader)
                self.has_read = True  # a read (and what it gave handled) went through
            if self.stats.ended is None:  # stopped while held: the final checkpoint
                written = await self._checkpoints.write(final=True)
                if not written and self.stats.ended is None:
                    self.stats.ended = "expired"  # the lease ran out just now: no checkpoint
                elif self._checkpoints.unsaved:
                    log.warning(
                        "%s: final checkpoint not written (the store failed %d times); the next owner resumes after %s",
                        *(self._label, self._config.retries + 1, self.stats.checkpointed),
                    )
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
            self._pause.ended()
            if reader is not None:
                lane.submit(reader.close)  # queued behind a handler that may still be running
            lane.close()

    def _end(self) -> PumpStats:
        if self.stats.ended is None:
            self.stats.ended = "stopped" if self._stopping.is_set() else "expired"
        log.info(
            "%s: pump %s after %d events (checkpoint at %s)",
            self._label,
            self.stats.ended,
            self.stats.processed,
            self.stats.checkpointed,
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
                await self._idle.pause(self._config.backoff_max)
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
        self._idle.clear()  # before the read: what arrives from now on wakes the idle wait below
        self.reading_since = self._monotonic()
        try:
            run = await self._checkpoints.during(lane.call(self._sync.work, reader))
        finally:
            self.reading_since = None
        if run.error is not None:
            if not await self._calls.recover(lane, run.failed, run.error):
                return
        elif run.stopped:
            return
        # Before a held-back read error ends the pump, what was handled is checkpointed.
        if await self._checkpoints.write(final=self._sync.deferred is not None) and run.idle:
            await self._idle.wait()

    async def _step_on_loop(self, lane: ThreadLane, reader: PartitionReader) -> None:
        """Read once (in the lane) and hand what came to an async handler on the loop, pausing in
        place (with the events in hand) while the lease may have run out."""
        self._idle.clear()
        self.reading_since = self._monotonic()
        try:
            events = await self._checkpoints.during(
                lane.call(reader.receive, self._calls.batch or self._config.max_events)
            )
        except Exception:
            await self._checkpoints.write(final=True)  # what was handled, before the error ends the pump
            raise
        finally:
            self.reading_since = None
        events = self._sequence.contiguous(events)
        if not events:
            if await self._checkpoints.write():
                await self._idle.wait()
            return
        if self._calls.batch is not None:
            await self._calls.handle_batch(lane, events)
            return
        done = 0
        while done < len(events):
            if not await self._hold():
                return  # stopped or lost: the rest is the next owner's
            chunk = events[done : done + self._checkpoints.room()]
            handled, error = await self._calls.run_async(chunk)
            self._calls.advance(chunk[:handled])
            done += handled
            if error is not None:
                if not await self._calls.recover(lane, [chunk[handled]], error):
                    return
                done += 1
            # Not written when no longer held (handled < len(chunk)): _hold pauses, then writes it.
            await self._checkpoints.write()
