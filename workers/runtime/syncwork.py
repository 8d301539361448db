"""The lane thread's side of a pump whose handler is sync: read, hand events to the handler one by
one (or batch by batch), and return to the event loop only when it has something to do.

One lane call ends only when a checkpoint is due, the partition has nothing new, the pump must
stop, or the handler failed: one round trip between the loop and the thread per checkpoint, not
two per read (the hops, not the reads, were what cost a worker its throughput). The loop's side
(checkpoints, retries, dead letters) is ``PartitionPump`` in ``pump.py``.

Ownership is judged here without calling into the coordinator per event: the lease deadline is
read once per chunk of events and compared with the clock before each event, and read again only
when the clock passes it. A worker woken from SIGSTOP past its deadline handles nothing more.
Events read and not handled stay pending: a pump that pauses (its lease may have run out) hands
them to the handler when it resumes, so nothing is read twice or skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from workers.handlers import Handler, NotHeld, PartitionContext
from workers.runtime.checkpoints import Checkpointer
from workers.runtime.sequence import SequenceGuard
from workers.sources.base import PartitionReader, ReceivedEvent


@dataclass(frozen=True, slots=True)
class Run:
    """How one lane call ended: a checkpoint is due (all fields empty), the partition had nothing
    new (``idle``), the pump must stop or pause (``stopped``: the events not handled are kept for
    the next call), or the handler raised ``error`` on ``failed`` (one event, or a batch)."""

    idle: bool = False
    stopped: bool = False
    failed: list[ReceivedEvent] = field(default_factory=list)
    error: Exception | None = None


class SyncWork:
    """Reads and sync handler calls of one pump; every method but ``stop`` runs in its lane thread.

    ``deadline(partition)`` is the ``monotonic`` time the lease runs out; ``may_go_on`` is asked
    before a batch; ``advance`` records events handled. ``batch``: the handler's batch size, or
    None for a handler of one event at a time.
    """

    def __init__(
        self,
        *,
        handler: Handler,
        ctx: PartitionContext,
        batch: int | None,
        max_events: int,
        deadline: Callable[[str], float],
        monotonic: Callable[[], float],
        may_go_on: Callable[[], bool],
        advance: Callable[[Sequence[ReceivedEvent]], None],
        sequence: SequenceGuard,
        checkpoints: Checkpointer,
    ) -> None:
        self._handler = handler
        self._ctx = ctx
        self._batch = batch
        self._size = batch or max_events
        self._deadline = deadline
        self._monotonic = monotonic
        self._may_go_on = may_go_on
        self._advance = advance
        self._sequence = sequence
        self._checkpoints = checkpoints
        self.stop_requested = False  # read before every event: a plain attribute, not a method call
        self.deferred: Exception | None = None  # a read error held back until the events before it are checkpointed
        self._pending: list[ReceivedEvent] = []  # read, not yet handled
        # The event (or batch) a handler call has now and since when (monotonic), else None: one attribute
        # written per call, which the worker's watch for stuck handlers reads from the loop (``handlerwatch``).
        self.calling: tuple[object, float] | None = None

    def stop(self) -> None:
        """From any thread: handle no event after the one in hand."""
        self.stop_requested = True

    def work(self, reader: PartitionReader) -> Run:
        """Read and handle until the loop has something to do. Raises a read error at once when nothing
        handled waits for a checkpoint, else (``deferred``) at the next call, so that the loop
        checkpoints what was handled first (in this call or an earlier one)."""
        if self.deferred is not None:
            error, self.deferred = self.deferred, None
            raise error
        progressed = False
        while True:
            if not self._pending:
                try:
                    received = reader.receive(self._size)
                except Exception as exc:
                    if not progressed and not self._checkpoints.unsaved:
                        raise
                    self.deferred = exc
                    return Run()
                self._pending = self._sequence.contiguous(received)
                if not self._pending:
                    return Run(idle=True)
            progressed = True
            run = self._handle_pending()
            if run is not None:
                return run
            if self._checkpoints.due(self._monotonic()):
                return Run()

    def _handle_pending(self) -> Run | None:
        """Hand the pending events to the handler, up to the next checkpoint; None if all went well."""
        events = self._pending
        if self._batch is not None:
            if not self._may_go_on():
                return Run(stopped=True)  # the batch stays pending
            self._pending = []
            self.calling = (events, self._monotonic())
            try:
                self._handler(events, self._ctx)
            except NotHeld as exc:
                if self._ctx.holds():
                    return Run(failed=events, error=exc)  # raised while held: a failure like any other
                self._pending = events  # the lease ran out before the batch was visible: kept, as above
                return Run(stopped=True)
            except Exception as exc:
                return Run(failed=events, error=exc)
            finally:
                self.calling = None
            self._advance(events)
            return None
        room = self._checkpoints.room()
        if room < len(events):
            events, self._pending = events[:room], events[room:]
        else:
            self._pending = []
        handled, error = self._one_by_one(events)
        self._advance(events[:handled])
        if error is not None:
            # The failed event goes to the loop (retries, dead letters); the rest wait for the next call.
            self._pending = events[handled + 1 :] + self._pending
            return Run(failed=[events[handled]], error=error)
        if handled < len(events):
            # Stopped or no longer held between two events: the rest waits (a paused pump resumes with it).
            self._pending = events[handled:] + self._pending
            return Run(stopped=True)
        return None

    def _one_by_one(self, events: Sequence[ReceivedEvent]) -> tuple[int, Exception | None]:
        """The per-event loop: (how many were handled, the error of the next one or None).

        This loop is the per-event cost of the runtime: names are bound locally. The deadline is
        read per chunk, so a lease the cycle dropped (another worker holds it) ends the pump at the
        next chunk at the latest; ``stop()`` from the same cycle ends it at the next event.
        """
        handler, ctx, deadline, monotonic = self._handler, self._ctx, self._deadline, self._monotonic
        pid = ctx.partition_id
        until = deadline(pid)
        try:
            for n, event in enumerate(events):
                if self.stop_requested:
                    return n, None
                now = monotonic()
                if now >= until:
                    until = deadline(pid)  # renewed meanwhile?
                    if monotonic() >= until:
                        return n, None
                self.calling = (event, now)  # one store: the loop never reads an event with another's time
                try:
                    handler(event, ctx)
                except NotHeld as exc:
                    return (n, exc) if ctx.holds() else (n, None)  # None: kept for after the pause, as above
                except Exception as exc:
                    return n, exc
            return len(events), None
        finally:
            self.calling = None
