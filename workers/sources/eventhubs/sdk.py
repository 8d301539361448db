"""The part of azure-eventhub this package uses: the consumer client (a protocol, so tests can hand
in a fake), and the SDK's values turned into ours (positions, events, partition properties)."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from azure.eventhub import EventData, EventHubConsumerClient, PartitionContext
from azure.eventhub.amqp import AmqpMessageBodyType

from workers.sources.base import PartitionProperties, Position, ReceivedEvent


class ConsumerClient(Protocol):
    """The part of ``azure.eventhub.EventHubConsumerClient`` this package calls."""

    def get_partition_ids(self) -> list[str]: ...

    def get_partition_properties(self, partition_id: str) -> dict[str, Any]: ...

    def receive_batch(
        self, on_event_batch: Callable[[PartitionContext, list[EventData]], None], **kwargs: Any
    ) -> None: ...

    def close(self) -> None: ...


ClientFactory = Callable[[str, str, str], ConsumerClient]  # (connection string, hub, consumer group)


def sdk_client(connection_string: str, hub: str, consumer_group: str) -> ConsumerClient:
    """A real ``EventHubConsumerClient``; it connects on first use, not here."""
    return EventHubConsumerClient.from_connection_string(
        connection_string, consumer_group=consumer_group, eventhub_name=hub
    )


@dataclass(frozen=True, slots=True)
class LastEnqueued:
    """The partition's last-enqueued event as the service attached it to a delivery."""

    sequence_number: int
    offset: str | None
    enqueued_time: float | None


def starting_position(position: Position) -> str | int:
    """The SDK's ``starting_position`` for ``position``, used with ``starting_position_inclusive=False``:
    an offset (str), a sequence number (int), "@latest", or "-1" (the start of the partition)."""
    if position.offset is not None:
        return str(position.offset)
    if position.sequence_number is not None:
        if isinstance(position.sequence_number, bool) or not isinstance(position.sequence_number, int):
            raise TypeError(f"sequence number must be a whole number, got {position.sequence_number!r}")
        # -1 is "before the first event": exclusive of -1 is the start, which the SDK spells offset "-1".
        return "-1" if position.sequence_number < 0 else position.sequence_number
    return "@latest" if position.latest else "-1"


def received(partition_id: str, event: EventData) -> ReceivedEvent:
    """``event`` as a ReceivedEvent. Raises ValueError for an event without a sequence number,
    offset or enqueued time (the service always sets them)."""
    sequence, offset, enqueued = event.sequence_number, event.offset, event.enqueued_time
    if sequence is None or offset is None or enqueued is None:
        raise ValueError(
            f"partition {partition_id}: event without sequence number, offset or enqueued time"
            f" ({sequence!r}, {offset!r}, {enqueued!r})"
        )
    key = event.partition_key
    return ReceivedEvent(
        partition_id=partition_id,
        sequence_number=int(sequence),
        offset=str(offset),
        enqueued_time=enqueued.timestamp(),
        partition_key=key.decode("utf-8", "replace") if isinstance(key, bytes) else key,
        body=_body(event),
    )


def properties(partition_id: str, raw: dict[str, Any]) -> PartitionProperties:
    """The SDK's partition properties dict as PartitionProperties."""
    last = int(raw["last_enqueued_sequence_number"])
    offset = raw.get("last_enqueued_offset")
    when = raw.get("last_enqueued_time_utc")
    nothing_yet = last < 0
    return PartitionProperties(
        partition_id=partition_id,
        begin_sequence_number=int(raw["beginning_sequence_number"]),
        last_enqueued_sequence_number=last,
        last_enqueued_offset=None if nothing_yet or offset in (None, "-1") else str(offset),
        last_enqueued_time=None if nothing_yet or when is None else _epoch(when),
        is_empty=bool(raw["is_empty"]),
    )


def last_enqueued(tracked: dict[str, Any] | None) -> LastEnqueued | None:
    """A delivery's ``last_enqueued_event_properties`` as LastEnqueued; None when it has none."""
    if not tracked or tracked.get("sequence_number") is None:
        return None
    when = tracked.get("enqueued_time")
    offset = tracked.get("offset")
    return LastEnqueued(
        int(tracked["sequence_number"]), None if offset is None else str(offset), None if when is None else _epoch(when)
    )


def _epoch(when: datetime.datetime) -> float:
    if when.tzinfo is None:  # the SDK's datetimes are UTC; a naive one is read as UTC, not local time
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def _body(event: EventData) -> bytes:
    if event.body_type == AmqpMessageBodyType.DATA:
        body = event.body
        return body if isinstance(body, bytes) else b"".join(cast(Iterable[bytes], body))
    value = event.body if event.body_type == AmqpMessageBodyType.VALUE else None
    if isinstance(value, bytes):
        return value
    return event.body_as_str().encode("utf-8")  # AMQP value or sequence bodies of other producers
