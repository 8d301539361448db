"""The pump of one owned partition: read from the checkpoint, call the handler, checkpoint.

Reading and sync handlers run in the pump's own thread (a ``ThreadLane``), never on the event
loop, so a slow handler delays only its own partition and never a lease renewal. Events of one
partition are handled strictly one after another (or one batch after another); partitions run
concurrently, one thread each.

Ownership. Before every handler call and every checkpoint the pump asks ``holds(partition)``,
the coordinator's local lease deadline; once it says no, the pump stops without touching another
event. (A sync handler's thread reads the deadline itself once per read of events and compares it
with the clock before each event, re-reading it when the clock passes it: the same answer for one
clock read instead of a call into the coordinator per event. A worker woken from SIGSTOP past its
deadline handles nothing more.) A checkpoint refused with ``OwnershipLost`` (the store says
another worker owns the partition) stops the pump too.

Checkpoints. After every ``checkpoint_events`` events or ``checkpoint_seconds`` seconds,
whichever comes first, and once more when the pump is stopped on purpose. Delivery is at least
once: a worker that dies loses its un-checkpointed tail, which the next owner handles again.

Sequence numbers must be contiguous per partition. A jump means events were lost (retention ran
out before they were read, or a reader bug): it is logged as an error and counted in
``leaseboard_sequence_gaps_total``; processing goes on from the event that arrived.

Handler errors (the worker never dies of one):
1. the failure is logged and counted (``leaseboard_handler_errors_total``, the pump's ``errors``);
2. the same event (or batch) is retried up to ``retries`` times, waiting ``backoff_seconds``,
   doubling, at most ``backoff_max`` between tries; ``MalformedEvent`` skips the retries;
3. then the event (every event of a failed batch) is set aside to the dead-letter file
   ``<dead_letter_dir>/<hub>/<partition>.jsonl``, one JSON object per line with partition,
   sequence number, offset, error and the body in base64, and processing goes on with the next
   event, which moves the checkpoint past the dead-lettered one.
If the pump is stopped or loses the partition during retries, the failing event is neither
handled nor set aside: the checkpoint stays before it and the next owner tries it again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import workers.metrics as metrics
from balancer.errors import OwnershipLost
from balancer.model import Checkpoint, HubRef
from balancer.protocol import CheckpointStore
from workers.handlers import Handler, MalformedEvent, PartitionContext, batch_size, is_async
from workers.runtime.sink import OutageLog
from workers.sources.base import EventSource, PartitionReader, PartitionTaken, Position, ReceivedEvent

log = logging.getLogger("leaseboard.pump")
T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class PumpConfig:
    checkpoint_events: int = 100
    checkpoint_seconds: float = 1.0
    initial_position: Position = field(default_factory=Position.earliest)
    max_events: int = 100  # events per read (a batch handler's own size wins)
    poll_seconds: float = 0.05  # pause when the partition has nothing new
    retries: int = 3
    backoff_seconds: float = 0.1
    backoff_max: float = 5.0
    dead_letter_dir: Path | None = None  # None: dead letters are kept in memory only

    def __post_init__(self) -> None:
        if self.checkpoint_events < 1 or self.max_events < 1 or self.retries < 0:
            raise ValueError("checkpoint_events and max_events must be >= 1, retries >= 0")

    @classmethod
    def from_settings(cls, **overrides: Any) -> PumpConfig:
        """The config from Django settings (LEASEBOARD_CHECKPOINT_*), with ``overrides`` applied."""
        from django.conf import settings

        values: dict[str, Any] = {
            "checkpoint_events": settings.LEASEBOARD_CHECKPOINT_EVENTS,
            "checkpoint_seconds": settings.LEASEBOARD_CHECKPOINT_SECONDS,
            "dead_letter_dir": Path(getattr(settings, "LEASEBOARD_DEADLETTER_DIR", settings.VAR_DIR / "deadletter")),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass
class PumpStats:
    """What one pump did, for status output and tests."""

    processed: int = 0
    errors: int = 0
    dead_lettered: int = 0
    gaps: int = 0
    checkpoints: int = 0
    last_sequence: int | None = None
    checkpointed: int | None = None
    ended: str | None = None  # why the pump stopped: stopped, expired, lost, failed


@dataclass(frozen=True, slots=True)
class _Run:
    """How one lane call of a sync pump ended: a checkpoint is due (all fields empty), the partition
    had nothing new (``idle``), the pump must stop (``stopped``), or the handler raised ``error`` on
    ``failed`` (one event, or a batch)."""

    idle: bool = False
    stopped: bool = False
    failed: list[ReceivedEvent] = field(default_factory=list)
    error: Exception | None = None


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
            log, f"worker {owner_id}: checkpoint store",
            "retrying; events handled meanwhile are checkpointed when it answers (or handled again by the next owner)",
        )  # fmt: skip
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


class ThreadLane:
    """One daemon thread that runs calls in order, awaited from the event loop.

    Daemon, unlike a ThreadPoolExecutor's workers: a handler stuck forever must not keep the
    process from exiting once the bounded shutdown has given up on it.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Callable[[Any, BaseException | None], None]] | None]
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if future.done():
                return  # the awaiting task was cancelled meanwhile
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        def done(result: Any, error: BaseException | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(settle, result, error)

        self._queue.put((lambda: fn(*args), done))
        return await future

    def submit(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` after what is queued, without waiting for it (errors are logged)."""

        def done(_result: Any, error: BaseException | None) -> None:
            if error is not None:
                log.warning("%s failed: %s", fn, error)

        self._queue.put((fn, done))

    def close(self) -> None:
        """Let the thread end after what is queued."""
        self._queue.put(None)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, done = item
            try:
                result = fn()
            except BaseException as exc:
                done(None, exc)
            else:
                done(result, None)


class DeadLetters:
    """Events set aside: appended to ``<directory>/<hub>/<partition>.jsonl``, the latest kept here."""

    def __init__(self, directory: Path | None, keep: int = 1000) -> None:
        self.directory = directory
        self.entries: list[dict[str, Any]] = []
        self.keep = keep
        self._lock = threading.Lock()

    def path(self, ref: HubRef, partition_id: str) -> Path | None:
        return None if self.directory is None else self.directory / ref.hub / f"{partition_id}.jsonl"

    def add(self, ref: HubRef, owner_id: str, event: ReceivedEvent, error: BaseException, attempts: int) -> None:
        """Record ``event`` (blocking file I/O: call it from a pump's thread)."""
        entry = {
            "namespace": ref.namespace,
            "hub": ref.hub,
            "consumer_group": ref.consumer_group,
            "partition_id": event.partition_id,
            "sequence_number": event.sequence_number,
            "offset": event.offset,
            "enqueued_time": event.enqueued_time,
            "partition_key": event.partition_key,
            "owner_id": owner_id,
            "attempts": attempts,
            "error": f"{type(error).__name__}: {error}",
            "set_aside_at": time.time(),
            "body_base64": base64.b64encode(event.body).decode("ascii"),
        }
        path = self.path(ref, event.partition_id)
        with self._lock:
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                # One write of one line in append mode: lines of several processes do not interleave.
                with path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(entry, sort_keys=True) + "\n")
            self.entries.append(entry)
            del self.entries[: -self.keep]


def describe(position: Position) -> str:
    if position.offset is not None:
        return f"the event after offset {position.offset}"
    if position.sequence_number is not None:
        return f"the event after sequence number {position.sequence_number}"
    return "the end (new events only)" if position.latest else "the earliest event"


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
        self._deadline = deadline  # ``monotonic`` time the lease runs out; agrees with ``holds``
        self._checkpoints = checkpoints
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
        self._stopping = threading.Event()  # read by the lane thread between events
        self._stop_requested = False
        self._expected: int | None = None  # next sequence number, once known
        self._last: tuple[int, str] | None = None  # (sequence number, offset) of the last event done
        self._since = 0  # events done since the last checkpoint
        self._checkpoint_at = 0.0
        self._retry_checkpoint_at = 0.0
        self._pending: list[ReceivedEvent] = []  # read, not yet handled (sync handlers; lane thread only)
        self._deferred: Exception | None = None  # a read error held back until the events before it are checkpointed
        self._store = outage or CheckpointOutage(owner_id)  # shared by the worker's pumps
        self._label = f"partition {partition_id} ({owner_id})"

    def stop(self) -> None:
        """Ask the pump to stop after the event in hand and write a final checkpoint."""
        self._stop_requested = True  # what the per-event loop reads: a plain attribute, not a method call
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
            self._checkpoint_at = self._monotonic()
            while self._may_go_on() and await self._step(lane, reader):
                pass
            if self._stopping.is_set() and self.stats.ended is None:
                await self._checkpoint(final=True)
            return self._end()
        except PartitionTaken as exc:
            log.warning("%s: the source gave the partition to another reader: %s", self._label, exc)
            self.stats.ended = "lost"
            return self._end()
        except Exception:
            self.stats.ended = "failed"
            raise
        finally:
            self._store.forget(self.partition_id)
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
                listed = await self._checkpoints.list_checkpoints(self.ref)
            except Exception as exc:
                metrics.STORE_ERRORS.labels(operation="list_checkpoints").inc()
                self._store.failed(self.partition_id, exc)
                await self._pause(self._config.backoff_max)
                continue
            self._store.ok(self.partition_id)
            found = next((c for c in listed if c.partition_id == self.partition_id), None)
            if found is None:
                log.info("%s: no checkpoint, starting at %s", self._label, describe(self._config.initial_position))
                return self._config.initial_position
            log.info("%s: resuming after checkpoint %d", self._label, found.sequence_number)
            self._expected = found.sequence_number + 1
            self.stats.checkpointed = found.sequence_number
            return Position.after(found.sequence_number, found.offset)
        return None

    async def _step(self, lane: ThreadLane, reader: PartitionReader) -> bool:
        """Read and handle until a checkpoint is due or nothing is left; False when the pump must stop.

        A sync handler runs with the reads in one lane call that ends only when a checkpoint is due,
        the partition has nothing new, the pump must stop, or the handler failed: one round trip
        between the loop and the thread per checkpoint, not two per read (the hops, not the reads,
        were what cost a worker its throughput).
        """
        if self._async:
            return await self._step_on_loop(lane, reader)
        run = await lane.call(self._work, reader)
        if run.error is not None:
            if not await self._recover(lane, run.failed, run.error):
                return False
        elif run.stopped:
            return False
        # Before a held-back read error ends the pump, what was handled is checkpointed.
        if not await self._checkpoint(final=self._deferred is not None):
            return False
        if run.idle:
            await self._pause(self._config.poll_seconds)
        return True

    def _work(self, reader: PartitionReader) -> _Run:
        """In the lane thread: read and handle (sync handler) until the loop has something to do."""
        if self._deferred is not None:
            error, self._deferred = self._deferred, None
            raise error
        size = self._batch or self._config.max_events
        progressed = False
        while True:
            if not self._pending:
                try:
                    received = reader.receive(size)
                except Exception as exc:
                    if not progressed:
                        raise
                    self._deferred = exc  # checkpoint what was handled first; raised by the next call
                    return _Run()
                self._pending = self._contiguous(received)
                if not self._pending:
                    return _Run(idle=True)
            progressed = True
            run = self._handle_pending()
            if run is not None:
                return run
            if self._checkpoint_due(self._monotonic()):
                return _Run()

    def _handle_pending(self) -> _Run | None:
        """Hand the pending events to the sync handler, up to the next checkpoint; None if all went well."""
        events = self._pending
        if self._batch is not None:
            self._pending = []
            if not self._may_go_on():
                return _Run(stopped=True)
            try:
                self._handler(events, self.ctx)
            except Exception as exc:
                return _Run(failed=events, error=exc)
            self._advance(events)
            return None
        room = max(1, self._config.checkpoint_events - self._since)
        if room < len(events):
            events, self._pending = events[:room], events[room:]
        else:
            self._pending = []
        handled, error = self._run_sync(events)
        self._advance(events[:handled])
        if error is not None:
            self._pending = events[handled + 1 :] + self._pending
            return _Run(failed=[events[handled]], error=error)
        if handled < len(events):
            return _Run(stopped=True)  # stopped or no longer held between two events
        return None

    async def _step_on_loop(self, lane: ThreadLane, reader: PartitionReader) -> bool:
        """Read once (in the lane) and hand what came to an async handler on the loop."""
        events = await lane.call(reader.receive, self._batch or self._config.max_events)
        events = self._contiguous(events)
        if not events:
            if not await self._checkpoint():
                return False
            await self._pause(self._config.poll_seconds)
            return True
        if self._batch is not None:
            return await self._handle_batch(lane, events)
        done = 0
        while done < len(events):
            room = max(1, self._config.checkpoint_events - self._since)
            chunk = events[done : done + room]
            handled, error = await self._run(lane, chunk)
            self._advance(chunk[:handled])
            done += handled
            if error is not None:
                if not await self._recover(lane, [chunk[handled]], error):
                    return False
                done += 1
            elif handled < len(chunk):
                return False  # stopped or no longer held between two events
            if not await self._checkpoint():
                return False
        return True

    def _contiguous(self, events: list[ReceivedEvent]) -> list[ReceivedEvent]:
        """``events`` without repeats; a jump in sequence numbers is logged as lost data."""
        expected = self._expected
        if expected is not None and events:
            # The usual case, checked in C rather than event by event: exactly the next numbers.
            numbers = [event.sequence_number for event in events]
            if numbers == list(range(expected, expected + len(numbers))):
                self._expected = expected + len(numbers)
                return events
        kept = []
        for event in events:
            expected = self._expected
            if expected is not None and event.sequence_number < expected:
                log.warning("%s: reader repeated sequence number %d; skipped", self._label, event.sequence_number)
                continue
            if expected is not None and event.sequence_number > expected:
                missing = event.sequence_number - expected
                log.error(
                    "%s: sequence numbers jump from %d to %d: %d events were never received (lost data)",
                    self._label, expected - 1, event.sequence_number, missing,
                )
                metrics.SEQUENCE_GAPS.inc()
                self.stats.gaps += 1
            self._expected = event.sequence_number + 1
            kept.append(event)
        return kept

    # handler calls -------------------------------------------------------------------------

    async def _run(self, lane: ThreadLane, events: Sequence[ReceivedEvent]) -> tuple[int, Exception | None]:
        """Handle ``events`` one by one; (how many were handled, the error of the next one or None)."""
        if not self._async:
            return await lane.call(self._run_sync, events)
        for n, event in enumerate(events):
            if not self._may_go_on():
                return n, None
            try:
                await self._handler(event, self.ctx)
            except Exception as exc:
                return n, exc
        return len(events), None

    def _run_sync(self, events: Sequence[ReceivedEvent]) -> tuple[int, Exception | None]:
        # In the lane thread. holds() only reads the coordinator's lease table and clock. Names are
        # bound locally: this loop is the per-event cost of the runtime.
        handler, ctx, holds, pid, stopping = self._handler, self.ctx, self._holds, self.partition_id, self._stopping
        if self._deadline is None:
            for n, event in enumerate(events):
                if stopping.is_set() or not holds(pid):
                    return n, None
                try:
                    handler(event, ctx)
                except Exception as exc:
                    return n, exc
            return len(events), None
        deadline, monotonic = self._deadline, self._monotonic
        # Read per chunk, so a lease the cycle dropped (another worker holds it) ends the pump at the
        # next chunk at the latest; pump.stop() from the same cycle ends it at the next event.
        until = deadline(pid)
        for n, event in enumerate(events):
            if self._stop_requested:
                return n, None
            if monotonic() >= until:
                until = deadline(pid)  # renewed meanwhile?
                if monotonic() >= until:
                    return n, None
            try:
                handler(event, ctx)
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
        return await self._checkpoint()

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
        last = events[-1]
        self._last = (last.sequence_number, last.offset)
        self._since += len(events)
        self.stats.processed += len(events)
        self.stats.last_sequence = last.sequence_number
        metrics.EVENTS_PROCESSED.inc(len(events))

    # checkpoints ---------------------------------------------------------------------------

    def _checkpoint_due(self, now: float) -> bool:
        """True when events are done since the last checkpoint and the count or the time says write one
        (and a failed write's retry time has come)."""
        if self._last is None or self._last[0] == self.stats.checkpointed or now < self._retry_checkpoint_at:
            return False
        config = self._config
        return self._since >= config.checkpoint_events or now - self._checkpoint_at >= config.checkpoint_seconds

    async def _checkpoint(self, final: bool = False) -> bool:
        """Checkpoint the last event done if due (always when ``final``); False if ownership is gone."""
        if self._last is None or self._last[0] == self.stats.checkpointed:
            return True
        now = self._monotonic()
        if not final and not self._checkpoint_due(now):
            return True
        if not self._holds(self.partition_id):
            return False
        sequence, offset = self._last
        try:
            await self._checkpoints.update_checkpoint(
                Checkpoint(self.ref, self.partition_id, sequence, offset), self.owner_id
            )
        except OwnershipLost as exc:
            log.warning("%s: %s; stopping the pump", self._label, exc)
            self.stats.ended = "lost"
            return False
        except Exception as exc:
            # Keep handling while the lease lasts; the next checkpoint covers these events too.
            metrics.STORE_ERRORS.labels(operation="update_checkpoint").inc()
            self._store.failed(self.partition_id, exc)
            self._retry_checkpoint_at = now + max(self._config.checkpoint_seconds, 0.5)
            return True
        self._store.ok(self.partition_id)
        metrics.CHECKPOINTS.inc()
        self.stats.checkpoints += 1
        self.stats.checkpointed = sequence
        self._since = 0
        self._checkpoint_at = now
        return True

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds`` in short steps, ending early when the pump is asked to stop."""
        # Counted in steps rather than read off the clock, so a test's fake clock need not move.
        left = seconds
        while left > 0 and not self._stopping.is_set():
            await self._sleep(min(left, 0.05))
            left -= 0.05
