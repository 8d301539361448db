"""``EventHubsSource.browse``: a bounded look at a partition through the SDK's public ``receive_batch``,
on a client of its own, closed when done.

The receiver is not exclusive (no ``owner_level``), so it never cuts a worker's reader off, and no
checkpoint store is given, so nothing is written anywhere. Event Hubs refuses a non-exclusive
receiver on a partition where an exclusive one (a worker's) is attached in the same consumer group:
the browse then fails with the service's words, and the console says to browse as a consumer group
of its own (``LEASEBOARD_BROWSE_CONSUMER_GROUP``).

Events come in batches of at most ``BATCH`` (the link credit too), so the bytes read are bounded by
``max_bytes`` plus one batch; the read ends at ``until``, at the partition's end, or after
``DEADLINE`` seconds whatever came. The end is the last event the hub had enqueued when the browse
began (its partition properties, asked first): an empty batch (``WAIT`` seconds without an event)
before it is a slow hub, not the end (a starved machine's hub once sent nothing within the first
``WAIT``, and a browse of ten events came back empty). A start past that end reads nothing at once.
Where the properties cannot be read, the first empty batch ends the read, as it did before. The
SDK's event processor takes about half a second to start reading.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from typing import Any

from azure.eventhub import EventData, PartitionContext

from workers.sources.base import Browsed, PartitionProperties, Start
from workers.sources.eventhubs.sdk import ConsumerClient, properties, received

BATCH = 10
WAIT = 0.5  # seconds without an event that end a browse
DEADLINE = 10.0  # seconds a browse may take in all


def sdk_start(start: Start) -> str | int | datetime.datetime:
    """The SDK's inclusive ``starting_position`` for ``start``."""
    if start.offset is not None:
        return str(start.offset)
    if start.enqueued_time is not None:
        return datetime.datetime.fromtimestamp(start.enqueued_time, datetime.UTC)
    sequence = start.sequence_number or 0
    return "-1" if sequence <= 0 else sequence  # "-1": the start of the partition (exclusive of it)


class _Collected:
    """What the receiving thread hands over, and when the browse is done."""

    def __init__(
        self, partition_id: str, max_events: int, max_bytes: int, until: int | None, end: int | None = None
    ) -> None:
        self.partition_id, self.max_events, self.max_bytes, self.until = partition_id, max_events, max_bytes, until
        self.end = end  # the last sequence number enqueued when the browse began (None: not known)
        self.events: list[Browsed] = []
        self.bytes_read = 0
        self.error: Exception | None = None
        self.done = threading.Event()

    def _full(self) -> bool:
        last = self.events[-1].event.sequence_number if self.events else None
        ended = self.until is not None and last is not None and last >= self.until
        return ended or len(self.events) >= self.max_events or self.bytes_read >= self.max_bytes

    def on_batch(self, context: PartitionContext, batch: list[EventData]) -> None:
        if not batch and self._at_end():
            self.done.set()  # WAIT seconds and nothing: the end of the partition for now
        for event in batch:
            if self.done.is_set() or self._full():
                break
            got = received(self.partition_id, event)
            self.events.append(Browsed(got, dict(event.properties or {})))
            self.bytes_read += len(got.body)
        if self._full():
            self.done.set()

    def _at_end(self) -> bool:
        if self.end is None:
            return True  # not known: an empty batch is the end
        return bool(self.events) and self.events[-1].event.sequence_number >= self.end

    def on_error(self, context: PartitionContext | None, error: Exception) -> None:
        if self.error is None:
            self.error = error
        self.done.set()


def browse_with(
    client: ConsumerClient,
    partition_id: str,
    start: Start,
    max_events: int,
    max_bytes: int,
    until: int | None,
) -> list[Browsed]:
    """The events ``client`` reads of ``partition_id`` from ``start`` (``workers.sources.base.Browsing``);
    closes ``client``. Raises the SDK's error when it failed before any event came, TimeoutError when
    the hub said nothing within DEADLINE."""
    end = _end(client, partition_id)
    if end is not None and _past(start, end):
        with contextlib.suppress(Exception):
            client.close()
        return []
    last = None if end is None else end.last_enqueued_sequence_number
    collected = _Collected(partition_id, max_events, max_bytes, until, last)
    position = sdk_start(start)
    kwargs: dict[str, Any] = {
        "partition_id": partition_id,
        "starting_position": position,
        "starting_position_inclusive": position != "-1",
        "max_batch_size": min(BATCH, max_events),
        "prefetch": min(BATCH, max_events),
        "max_wait_time": WAIT,
        "on_error": collected.on_error,
    }
    thread = threading.Thread(
        target=client.receive_batch, args=(collected.on_batch,), kwargs=kwargs, name="browse", daemon=True
    )
    thread.start()
    finished = collected.done.wait(DEADLINE)
    with contextlib.suppress(Exception):  # closing a half-broken connection must not mask what was read
        client.close()
    # Not joined: the SDK's event processor notices the close about a second later and its thread
    # ends then; what it might still hand over is not looked at.
    if collected.error is not None and not collected.events:
        raise collected.error
    if not finished and not collected.events:
        raise TimeoutError(f"partition {partition_id}: the event hub sent nothing within {DEADLINE:g} s")
    return collected.events[:max_events]


def _end(client: ConsumerClient, partition_id: str) -> PartitionProperties | None:
    """The partition's properties as the browse begins; None when the hub does not say (the first
    empty batch then ends the read)."""
    try:
        return properties(partition_id, client.get_partition_properties(partition_id))
    except Exception:
        return None


def _past(start: Start, end: PartitionProperties) -> bool:
    """Whether nothing the hub had enqueued lies at or after ``start``."""
    if end.is_empty or end.last_enqueued_sequence_number < 0:
        return True
    if start.offset is not None:
        try:
            return end.last_enqueued_offset is not None and int(start.offset) > int(end.last_enqueued_offset)
        except ValueError:
            return False  # offsets this hub does not write as numbers: not compared
    if start.enqueued_time is not None:
        return end.last_enqueued_time is not None and start.enqueued_time > end.last_enqueued_time
    return (start.sequence_number or 0) > end.last_enqueued_sequence_number
