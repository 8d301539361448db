"""One partition's receiver: the SDK's consumer driven on a thread, bridged to ``receive(max_events)``.

Each reader drives the SDK's own per-partition consumer (``EventHubConsumer``, made by
``EventHubConsumerClient._create_consumer``) on a thread of its own, with a client of its own:
the loop ``EventProcessor`` runs for a single-partition ``receive_batch``, without the processor.
The processor first lists the hub's partitions on a load-balancing thread of its own (a management
connection) while its receive loop spins, holding a CPU, until that thread has made the consumer:
one reader waited 0.6 s for its first event, eight in one process 2.4 s, all of it on the CPU.
Driven directly, the consumer opens its link at once and waits in the socket. The consumer's API
is private: ``sdk.open_consumer`` checks it, and where it is missing (another azure-eventhub than
the pinned range) the reader falls back to ``receive_batch``, logged once; everything below holds
on both paths. Batches go into a bounded queue; while it is full the callback waits, the SDK stops
pulling, and the service keeps the rest (backpressure, not memory growth). ``receive`` takes from
the queue without waiting.

What the reader asks of the consumer is what the processor asks: the starting position exclusive,
``owner_level``, ``prefetch``, last-enqueued properties tracked, batches of at most
``max_batch_size`` (never above the queue), and the SDK's own retries inside ``receive``. The
processor's distributed tracing spans around each batch are not made.

Latency and prefetch. The SDK hands a read's events over only when the read ends, and a read ends
at a silence of the socket timeout (0.2 s) or after ``prefetch`` frames. Events arriving more often
than every 0.2 s therefore come in bursts of ``prefetch``: with Microsoft's default of 300, at 20
events a second, each waits 4 s on the median and up to 8 s (up to a minute just above 5 a
second). Readers ask for 20 (``EVENTHUB_PREFETCH``): at most 20 events' spacing, under 0.2 s each,
at no loss of throughput on the embedded hub (``tests.benchmarks.bench_prefetch``). Over a long
round trip to the service a bigger credit reads faster; raise it there.

Exclusive receivers. Readers pass ``owner_level`` (the service's epoch, 0 by default as in
Microsoft's processor): when a partition moves, the new owner's receiver makes the service cut off
the previous one, even if that worker has not yet noticed it lost its lease. The old reader's
``receive`` then raises ``PartitionStolen``.

Opening only while the lease holds. The pump hands the reader ``gate(may_open)`` (its lease is
still valid): every opening of the link, the first, ours after a failed open and the SDK's own
reconnects inside ``receive``, waits until ``may_open()`` says yes. A worker cut off from the hub
and the store keeps its paused pump and reader; without the gate, its reader reconnected when the
network healed, with the same owner level as the partition's new owner, and the service cut the
new owner's receiver off (the partition suite saw the new owner's pump end "lost" and handle 20
events again).

Failure modes of the bridge:
- The first error, after the SDK's own retries, ends the reader for good and ``receive`` raises
  (``PartitionStolen`` or ``ReaderFailed``); the runtime restarts the pump from its checkpoint if
  it still owns the partition. (Left alone, the processor would re-create the consumer later from
  the *original* starting position: a stolen partition would be stolen back and events read again.)
  The consumer's ``receive`` swallows a failure to open its connection and returns as if nothing
  had happened (the processor then retries at once, forever); the reader opens it itself, with the
  client's retry settings and backoff, and fails with the SDK's error once the retries are spent.
- ``close`` may be called while the thread waits in our callback for room in the queue, or inside
  the SDK: it wakes the callback, and the thread closes the consumer at its next turn (the SDK
  waits in the socket at most 0.2 s at a time; closing waits up to 1 s more for the SDK's
  keep-alive thread). A thread still opening the connection after 0.5 s is in a handshake the
  service does not answer (the SDK reads it with no timeout): the reader shuts that socket down.
  The join is bounded; a thread still in the SDK after that is a daemon and is logged, never
  waited on forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from azure.eventhub import EventData, PartitionContext

from workers.sources.base import ReceivedEvent
from workers.sources.eventhubs.errors import PartitionStolen, ReaderFailed, first_line, reader_failure
from workers.sources.eventhubs.sdk import (
    Consumer,
    ConsumerClient,
    LastEnqueued,
    Retries,
    interrupt,
    last_enqueued,
    open_consumer,
    received,
)

log = logging.getLogger("leaseboard.eventhubs")

GRACE_SECONDS = 0.5  # for the thread to close the consumer itself before close() cuts its socket
GATE_CHECK = 0.2  # seconds: a link waiting for its gate asks again this often (close() wakes it at once)


class EventHubsReader:
    """Receives one partition on a background thread into a bounded queue (see the module)."""

    def __init__(
        self,
        client: ConsumerClient,
        *,
        hub: str,
        partition_id: str,
        starting_position: str | int,
        owner_level: int | None,
        owner_id: str | None = None,
        consumer_group: str = "$Default",
        queue_events: int = 300,
        prefetch: int = 20,
        max_batch_size: int = 100,
        join_seconds: float = 10.0,
        on_tracked: Callable[[str, LastEnqueued], None] | None = None,
    ) -> None:
        self.partition_id = partition_id
        self.last_enqueued: LastEnqueued | None = None
        self._client = client
        self._label = f"event hub {hub} partition {partition_id}" + (f" (owner {owner_id})" if owner_id else "")
        self._capacity = queue_events
        self._join_seconds = join_seconds
        self._on_tracked = on_tracked
        self._cond = threading.Condition()
        self._queue: deque[ReceivedEvent] = deque()
        self._error: ReaderFailed | None = None
        self._closed = False
        self._wake: Callable[[], None] | None = None  # notify(): the pump waiting for events
        self._consumer_group = consumer_group
        self._consumer: Consumer | None = None  # the SDK's, while the thread drives it
        self._gate: Callable[[], bool] | None = None  # may the link be opened now (see ``gate``)
        # The callback's context, as EventProcessor keeps one per partition (last_enqueued comes from it).
        self._context = PartitionContext("", hub, consumer_group, partition_id)
        self._kwargs: dict[str, Any] = {
            "partition_id": partition_id,
            "starting_position": starting_position,
            "starting_position_inclusive": False,
            "owner_level": owner_level,
            "track_last_enqueued_event_properties": True,
            # Batches no bigger than the queue: what waits for room is at most one queue's worth.
            "max_batch_size": min(max_batch_size, queue_events),
            # The link credit, and also how many frames one SDK read takes before it hands anything
            # over: it returns only at a gap of its socket timeout (0.2 s) or after that many, so
            # events arriving faster than 5 a second wait until `prefetch` of them have come (see
            # the module docstring). Not above the queue: a read must fit in it.
            "prefetch": min(prefetch, queue_events),
            "on_error": self._on_error,
        }
        self._thread = threading.Thread(
            target=self._run, name=f"eventhubs {hub}/{partition_id}" + (f" {owner_id}" if owner_id else ""), daemon=True
        )
        self._thread.start()

    def receive(self, max_events: int) -> list[ReceivedEvent]:
        """Up to ``max_events`` next events in sequence order; [] when none are there yet.

        Raises PartitionStolen at once when another receiver took the partition (queued events
        are dropped: the new owner reads them), ReaderFailed once the queue is drained after any
        other receive error, ValueError if closed or ``max_events`` < 1."""
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events must be a whole number of at least 1, got {max_events!r}")
        with self._cond:
            if self._closed:
                raise ValueError(f"{self._label}: reader is closed")
            if isinstance(self._error, PartitionStolen):
                self._queue.clear()
                raise self._error
            out = [self._queue.popleft() for _ in range(min(max_events, len(self._queue)))]
            if out:
                self._cond.notify_all()  # room again for a callback waiting on a full queue
                return out
            if self._error is not None:
                raise self._error
            return out

    def notify(self, wake: Callable[[], None] | None) -> None:
        """Call ``wake()`` (from the SDK's thread) when a batch arrives or the reader fails, so an
        idle pump waits for that instead of polling: the SDK's receive is the long poll."""
        with self._cond:
            self._wake = wake
            ready = bool(self._queue) or self._error is not None
        if wake is not None and ready:
            wake()

    def gate(self, may_open: Callable[[], bool] | None) -> None:
        """Open (and open again) the link only while ``may_open()`` (called from the reader's thread)
        says so: the pump passes "my lease is still valid". None opens at any time."""
        with self._cond:
            self._gate = may_open
            self._cond.notify_all()

    def _woken(self) -> None:
        wake = self._wake
        if wake is not None:
            wake()

    def close(self) -> None:
        """Stops receiving and waits (at most ``join_seconds``) for the receive thread to end."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        self._close_client()
        if threading.current_thread() is not self._thread:
            self._join()

    def _join(self) -> None:
        deadline = time.monotonic() + self._join_seconds
        self._thread.join(min(GRACE_SECONDS, self._join_seconds))
        while self._thread.is_alive() and time.monotonic() < deadline:
            consumer = self._consumer
            if consumer is not None and not consumer.running:
                # Still opening: a handshake the service does not answer (see the module). Once
                # open, the SDK reads with its socket timeout and the thread needs no help.
                interrupt(consumer, self._thread)
            self._thread.join(min(0.1, max(0.0, deadline - time.monotonic())))
        if self._thread.is_alive():
            log.warning(
                "%s: receive thread still inside the SDK %gs after close; left behind (daemon)",
                self._label,
                self._join_seconds,
            )

    def __enter__(self) -> EventHubsReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def receiving(self) -> bool:
        """Whether the receive thread is still running."""
        return self._thread.is_alive()

    # -- the SDK's side (its receive thread) -------------------------------------------------------

    def _run(self) -> None:
        try:
            consumer = open_consumer(
                self._client,
                consumer_group=self._consumer_group,
                partition_id=self.partition_id,
                starting_position=self._kwargs["starting_position"],
                on_events=self._on_events,
                owner_level=self._kwargs["owner_level"],
                prefetch=self._kwargs["prefetch"],
            )
            if consumer is None:
                self._client.receive_batch(self._on_batch, **self._kwargs)
            else:
                self._drive(consumer)
        except Exception as exc:
            self._fail(exc)
        else:
            with self._cond:
                ended_alone = not self._closed and self._error is None
            if ended_alone:
                self._fail(RuntimeError("the SDK's receive returned without being closed"))

    def _drive(self, consumer: Consumer) -> None:
        """EventProcessor's receive loop for one partition: until closed or failed."""
        self._consumer = consumer
        self._gated(consumer)
        try:
            while self._going():
                if not consumer.running and not self._open(consumer):
                    break
                consumer.receive(True, self._kwargs["max_batch_size"], None)
        finally:
            self._consumer = None  # closing now: close() must not cut its socket
            try:
                consumer.close()  # detaches the link; waits up to 1 s for the SDK's keep-alive thread
            except Exception as exc:
                log.warning("%s: closing the consumer failed: %s", self._label, exc)

    def _open(self, consumer: Consumer) -> bool:
        """Opens the consumer's connection and link as the SDK's retrying open does (its client's
        retry settings, its error mapping), but waits out the backoff on our condition, so that
        close() cuts it short: receive() would swallow the failure (it returns as if closed, and
        the processor calls it again at once, forever). False if closed meanwhile; raises the
        SDK's error once the retries are spent."""
        retries = Retries.of(self._client)
        retried = 0
        while self._going():
            try:
                consumer._open()
                return True
            except Exception as exc:
                error = consumer._handle_exception(exc)  # raises an EventHubError as it is
                wait = retries.backoff(retried)
                if wait is None:
                    raise error from None
                log.info("%s: opening failed (%s); retrying in %gs", self._label, first_line(error), wait)
                with self._cond:
                    self._cond.wait_for(lambda: self._closed or self._error is not None, wait)
                retried += 1
        return False

    def _gated(self, consumer: Consumer) -> None:
        """Every opening of ``consumer``'s link (ours in ``_open`` and the SDK's retries inside its
        ``receive``, which call the same method) first waits for the gate."""
        opening = consumer._open

        def gated_open() -> bool:
            return opening() if consumer.running or self._may_open() else False

        setattr(consumer, "_open", gated_open)  # noqa: B010 (the SDK calls self._open(); a method of its own)

    def _may_open(self) -> bool:
        """Wait until the gate says the link may open: True, or False once closed or failed."""
        waited = False
        while True:
            with self._cond:
                if self._closed or self._error is not None:
                    return False
                gate = self._gate
            if gate is None or gate():
                if waited:
                    log.info("%s: the lease holds again; opening the link", self._label)
                return True
            if not waited:
                log.info("%s: the lease may have run out; the link opens once it holds again", self._label)
                waited = True
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._error is not None, GATE_CHECK)

    def _going(self) -> bool:
        with self._cond:
            return not self._closed and self._error is None

    def _on_events(self, batch: list[EventData]) -> None:
        if batch:
            self._context._last_received_event = batch[-1]  # as EventProcessor._on_event_received does
            self._on_batch(self._context, batch)

    def _on_batch(self, context: PartitionContext, batch: Sequence[EventData]) -> None:
        try:
            events = [received(self.partition_id, event) for event in batch]
            last = last_enqueued(context.last_enqueued_event_properties)
        except Exception as exc:  # the SDK would only log it and go on past the event
            self._fail(exc)
            return
        if last is not None:
            self.last_enqueued = last
            if self._on_tracked is not None:
                self._on_tracked(self.partition_id, last)
        with self._cond:
            # Backpressure: while the queue is full the SDK's thread waits here and pulls nothing
            # more; the service holds the rest. close() and a failure wake it.
            while len(self._queue) >= self._capacity and not self._closed and self._error is None:
                self._cond.wait()
            if not self._closed and self._error is None:
                self._queue.extend(events)
        self._woken()

    def _on_error(self, context: PartitionContext | None, error: Exception) -> None:
        self._fail(error)

    def _fail(self, error: BaseException) -> None:
        with self._cond:
            if self._closed or self._error is not None:
                return
            failure = reader_failure(self._label, self.partition_id, error)
            log.warning("%s", failure)
            self._error = failure
            self._cond.notify_all()
        self._woken()
        # Stop the SDK before it re-creates the consumer from the original starting position.
        self._close_client()

    def _close_client(self) -> None:
        try:
            self._client.close()
        except Exception as exc:
            log.warning("%s: closing the client failed: %s", self._label, exc)
