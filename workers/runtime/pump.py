"""The pump of one owned partition: read from the checkpoint, call the handler, checkpoint.

Reading and sync handlers run in the pump's own thread (a ``ThreadLane``, ``lane.py``; the work
there is ``syncwork.py``), never on the event loop, so a slow handler delays only its own partition
and never a lease renewal. Events of one partition are handled strictly one after another (or one
batch after another); partitions run concurrently, one thread each.

Ownership. Before every handler call and every checkpoint the pump asks ``holds(partition)``,
the coordinator's local lease deadline; once it says no, the pump stops without touching another
event (a sync handler's thread compares the deadline with the clock itself: see ``syncwork.py``).
A checkpoint refused with ``OwnershipLost`` (the store says another worker owns the partition)
stops the pump too.

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
If the pump is stopped or loses the partition during retries, the failing event is neither
handled nor set aside: the checkpoint stays before it and the next owner tries it again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import workers.metrics as metrics
from balancer.model import HubRef
from balancer.protocol import CheckpointStore
from workers.handlers import Handler, MalformedEvent, PartitionContext, batch_size, is_async
from workers.runtime.checkpoints import Checkpointer, CheckpointOutage
from workers.runtime.config import PumpConfig, PumpStats
from workers.runtime.deadletters import DeadLetters
from workers.runtime.lane import ThreadLane
from workers.runtime.sequence import SequenceGuard
from workers.runtime.syncwork import SyncWork
from workers.sources.base import EventSource, PartitionReader, PartitionTaken, Position, ReceivedEvent

log = logging.getLogger("leaseboard.pump")
Sleep = Callable[[float], Awaitable[None]]


class PartitionPump:
    """Processes one partition for one owner until stopped or the partition is no longer held."""

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
    ) -> None:
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
        self.ctx = PartitionContext(ref, partition_id, owner_id)
        self.stats = PumpStats()
        self._stopping = threading.Event()
        self._outage = outage or CheckpointOutage(owner_id)  # shared by the worker's pumps
        self._label = f"partition {partition_id} ({owner_id})"
        self._sequence = SequenceGuard(self._label, self.stats)
        self._checkpoints = Checkpointer(
            ref=ref, partition_id=partition_id, owner_id=owner_id, store=checkpoints, holds=holds, config=config,
            stats=self.stats, outage=self._outage, monotonic=monotonic, label=self._label,
        )  # fmt: skip
        self._sync: SyncWork | None = None
        if not self._async:
            # Without a deadline (a pump built by hand) the lane asks ``holds`` once per chunk of events.
            self._sync = SyncWork(
                handler=handler, ctx=self.ctx, batch=self._batch, max_events=config.max_events,
                deadline=deadline or (lambda pid: math.inf if holds(pid) else -math.inf), monotonic=monotonic,
                may_go_on=self._may_go_on, advance=self._advance, sequence=self._sequence,
                checkpoints=self._checkpoints,
            )  # fmt: skip

    def stop(self) -> None:
        """Ask the pump to stop after the event in hand and write a final checkpoint."""
        if self._sync is not None:
            self._sync.stop()
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _may_go_on(self) -> bool:
        return not self._stopping.is_set() and self._holds(self.partition_id)

    # the loop ------------------------------------------------------------------------------

    async def run(self) -> PumpStats:
        """Pump until stopped or no longer held; return the stats (``ended`` says why)."""
        lane = ThreadLane(f"pump-{self.owner_id}-{self.partition_id}")
        reader: PartitionReader | None = None
        try:
            position = await self._start_position()
            if position is None:
                return self._end()
            reader = await lane.call(self._source.reader, self.partition_id, position)
            self._checkpoints.start()
            while self._may_go_on() and await self._step(lane, reader):
                pass
            if self._stopping.is_set() and self.stats.ended is None:
                await self._checkpoints.write(final=True)
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
        while self._may_go_on():
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

    async def _step(self, lane: ThreadLane, reader: PartitionReader) -> bool:
        """Read and handle until a checkpoint is due or nothing is left; False when the pump must stop."""
        if self._sync is None:
            return await self._step_on_loop(lane, reader)
        run = await lane.call(self._sync.work, reader)
        if run.error is not None:
            if not await self._recover(lane, run.failed, run.error):
                return False
        elif run.stopped:
            return False
        # Before a held-back read error ends the pump, what was handled is checkpointed.
        if not await self._checkpoints.write(final=self._sync.deferred is not None):
            return False
        if run.idle:
            await self._pause(self._config.poll_seconds)
        return True

    async def _step_on_loop(self, lane: ThreadLane, reader: PartitionReader) -> bool:
        """Read once (in the lane) and hand what came to an async handler on the loop."""
        events = await lane.call(reader.receive, self._batch or self._config.max_events)
        events = self._sequence.contiguous(events)
        if not events:
            if not await self._checkpoints.write():
                return False
            await self._pause(self._config.poll_seconds)
            return True
        if self._batch is not None:
            return await self._handle_batch(lane, events)
        done = 0
        while done < len(events):
            chunk = events[done : done + self._checkpoints.room()]
            handled, error = await self._run_async(chunk)
            self._advance(chunk[:handled])
            done += handled
            if error is not None:
                if not await self._recover(lane, [chunk[handled]], error):
                    return False
                done += 1
            elif handled < len(chunk):
                return False  # stopped or no longer held between two events
            if not await self._checkpoints.write():
                return False
        return True

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
                return n, exc
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

    async def _handle_batch(self, lane: ThreadLane, events: list[ReceivedEvent]) -> bool:
        if not self._may_go_on():
            return False
        error = await self._call_once(lane, events)
        if error is None:
            self._advance(events)
        elif not await self._recover(lane, events, error):
            return False
        return await self._checkpoints.write()

    async def _recover(self, lane: ThreadLane, events: list[ReceivedEvent], error: Exception) -> bool:
        """Retry ``events`` per the policy, else set them aside. False when the pump must stop."""
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
            if not self._may_go_on():
                return False  # the next owner (or the next run) tries the event again
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

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds`` in short steps, ending early when the pump is asked to stop."""
        # Counted in steps rather than read off the clock, so a test's fake clock need not move.
        left = seconds
        while left > 0 and not self._stopping.is_set():
            await self._sleep(min(left, 0.05))
            left -= 0.05
