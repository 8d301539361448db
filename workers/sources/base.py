"""What the runtime reads events from: the embedded hub, or Azure Event Hubs (same protocol).

A source is opened once per process; a reader per owned partition. Readers are synchronous and
never block for long (``receive`` returns what is there, possibly nothing): the runtime calls them
from worker threads so the event loop, and with it lease renewal, is never held up. A reader may
also offer ``notify(wake)`` to wake its pump when new events come instead of being polled
(``workers.sources.arrivals``), and ``gate(may_open)``: a reader whose link can take the partition
from another reader (Event Hubs' owner level) opens it only while ``may_open()``, which the pump
answers with "my lease is still valid".

A source may also offer ``browse`` (``Browsing``): a bounded look at a partition's events from a
position, for people (the console's event browser), with no lease, no checkpoint and no exclusive link.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class PartitionTaken(Exception):
    """The source cut this reader off because another reader took the partition (Event Hubs'
    exclusive receivers: a higher or equal owner level attached). The pump ends as "lost"."""


@dataclass(frozen=True, slots=True)
class ReceivedEvent:
    """One event as read from a partition."""

    partition_id: str
    sequence_number: int
    offset: str
    enqueued_time: float  # seconds since the epoch, the hub's clock
    partition_key: str | None
    body: bytes
    # The message's AMQP sections as its producer sent them, but for the hub's own annotations and a
    # body that is one data section (that is ``body``); empty for an event sent as bytes alone.
    # ``workers.hub.amqp.sections`` reads it; the embedded hub stores it in format-2 records.
    amqp: bytes = b""
    # The W3C trace context (``traceparent``, ``tracestate``) of a source that reads the message's
    # application properties apart from ``amqp`` (Event Hubs' SDK); the tracing reads either.
    trace_context: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionProperties:
    """What the hub knows of one partition (Event Hubs' partition properties)."""

    partition_id: str
    begin_sequence_number: int  # first retained sequence number (0 on a new partition)
    last_enqueued_sequence_number: int  # -1 while the partition is empty
    last_enqueued_offset: str | None
    last_enqueued_time: float | None
    is_empty: bool


@dataclass(frozen=True, slots=True)
class Position:
    """Where a reader starts. Exactly one of the fields is meaningful, in this order:

    ``offset`` (start after the event at this offset), ``sequence_number`` (start after the event
    with this number), ``latest`` (only events enqueued from now on), else the earliest retained.
    """

    offset: str | None = None
    sequence_number: int | None = None
    latest: bool = False

    @classmethod
    def earliest(cls) -> Position:
        return cls()

    @classmethod
    def after(cls, sequence_number: int, offset: str | None = None) -> Position:
        return cls(offset=offset, sequence_number=sequence_number)

    def describe(self) -> str:
        """Where a reader at this position starts, in words (for logs)."""
        if self.offset is not None:
            return f"the event after offset {self.offset}"
        if self.sequence_number is not None:
            return f"the event after sequence number {self.sequence_number}"
        return "the end (new events only)" if self.latest else "the earliest event"


class PartitionReader(Protocol):
    def receive(self, max_events: int) -> list[ReceivedEvent]:
        """Up to ``max_events`` next events in sequence order; [] when none are there yet."""

    def close(self) -> None: ...


class EventSource(Protocol):
    """A hub to read. A source reached over a network may also offer ``probe()``: one small request on
    a connection of its own, returning when the hub answered and raising when it could not be asked
    (``workers.runtime.hubwatch`` asks it when a worker's readers have gone quiet)."""

    def partition_ids(self) -> tuple[str, ...]:
        """The hub's partition ids now ("0".."P-1"); may grow while the hub runs."""

    def properties(self, partition_id: str) -> PartitionProperties: ...

    def reader(self, partition_id: str, position: Position) -> PartitionReader:
        """A reader of one partition starting at ``position``; ValueError for an unknown partition."""

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Start:
    """Where a browse starts, inclusive; exactly one field is set: the event with this sequence
    number, the event at this offset, or the first event enqueued at or after this time (seconds
    since the epoch)."""

    sequence_number: int | None = None
    offset: str | None = None
    enqueued_time: float | None = None


@dataclass(frozen=True, slots=True)
class Browsed:
    """An event a browse read, and its application properties where the source gives them apart
    (Event Hubs' SDK; None: they are in ``event.amqp``, as the embedded hub keeps them)."""

    event: ReceivedEvent
    properties: dict[Any, Any] | None = None


class Browsing(Protocol):
    def browse(
        self,
        partition_id: str,
        start: Start,
        max_events: int,
        max_bytes: int,
        *,
        until: int | None = None,
        consumer_group: str | None = None,
    ) -> list[Browsed]:
        """Up to ``max_events`` events of ``partition_id`` from ``start`` on, in sequence order, read
        without a lease, a checkpoint or an exclusive link (a worker's reader is never cut off). The
        read stops after the event with sequence number ``until``, at the partition's end, or once
        ``max_bytes`` of bodies and sections are read (the event that crosses it is the last one).
        ``consumer_group``: the group to read as (Event Hubs; None: the source's own). Raises
        ValueError for an unknown partition or a start naming no event, anything else when the hub
        cannot be read."""
