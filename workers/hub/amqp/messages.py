"""Event Hubs messages: what a producer's transfer holds, and how a stored event goes out.

Incoming. A message is a run of sections; a batch (message format 0x80013700) is an outer message
whose data sections each hold one encoded event, with the partition key on the outer message's
annotations. Each event is kept whole (``sections.split``): its properties, application
properties, header, footer, annotations and body sections come back to receivers exactly as sent.

Outgoing. Each event carries the annotations Event Hubs sets (``x-opt-sequence-number`` long,
``x-opt-offset`` string, ``x-opt-enqueued-time`` timestamp, ``x-opt-partition-key`` when set) and,
when the receiver asked for runtime metrics, delivery annotations with the partition's
last-enqueued event on every event.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from proton import Data, DataException, Described, symbol, timestamp, ulong

from workers.hub.amqp import sections as kept
from workers.hub.amqp.frames import FrameError, split_values
from workers.hub.amqp.sections import BadMessage
from workers.sources.base import PartitionProperties, ReceivedEvent

__all__ = ["BATCH_FORMAT", "BadMessage", "Incoming", "encode", "parse", "runtime_metrics", "sections"]

BATCH_FORMAT = 0x80013700
NOT_IMPLEMENTED = "amqp:not-implemented"
DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES = 0x71, 0x72, 0x73, 0x74
DATA, AMQP_SEQUENCE, AMQP_VALUE = 0x75, 0x76, 0x77
PARTITION_KEY = symbol("x-opt-partition-key")
_SEQUENCE = symbol("x-opt-sequence-number")
_OFFSET = symbol("x-opt-offset")
_ENQUEUED = symbol("x-opt-enqueued-time")
_LAST_SEQUENCE = symbol("last_enqueued_sequence_number")
_LAST_OFFSET = symbol("last_enqueued_offset")
_LAST_TIME = symbol("last_enqueued_time_utc")
_RETRIEVED = symbol("runtime_info_retrieval_time_utc")


@dataclass(frozen=True, slots=True)
class Incoming:
    """What one transfer asks to append: bodies in order, with their other AMQP sections
    (``ReceivedEvent.amqp``), to one partition, with one key."""

    bodies: list[bytes]
    partition_key: str | None
    amqp: list[bytes]


def sections(payload: bytes) -> list[tuple[int, Any]]:
    """(descriptor code, value) of each section of an encoded message, decoded by proton.
    Binary values come back as ``bytes``. Raises BadMessage."""
    try:
        parts = split_values(payload)
    except FrameError as exc:
        raise BadMessage(f"not an AMQP message: {exc}") from None
    out = []
    data = Data()
    for part in parts:
        data.clear()
        try:
            data.decode(part)
            data.rewind()
            data.next()
            value = data.get_object()
        except (DataException, KeyError, TypeError, ValueError) as exc:
            raise BadMessage(f"undecodable message section: {exc}") from None
        if not isinstance(value, Described) or not isinstance(value.descriptor, int):
            raise BadMessage("a message section is a described value with a numeric descriptor")
        out.append((int(value.descriptor), _plain(value.value)))
    return out


def _plain(value: Any) -> Any:
    # proton hands binary out as views into its own buffer, which the next decode reuses.
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def parse(payload: bytes, message_format: int) -> Incoming:
    """The events in one transfer's payload (a batch when ``message_format`` is BATCH_FORMAT).
    Raises BadMessage."""
    if message_format == BATCH_FORMAT:
        outer = kept.split(payload)
        parts = split_values(outer.amqp) if outer.amqp else []
        # One event makes one data section, which split() keeps as the body; more stay sections.
        inner = [_binary(raw) for raw in parts if kept.descriptor(raw)[0] == kept.DATA] or [outer.body]
        if not any(inner):
            raise BadMessage("a batch without events (no data sections)", "amqp:invalid-field")
        events = [kept.split(raw) for raw in inner]
        return Incoming([e.body for e in events], outer.partition_key, [e.amqp for e in events])
    if message_format != 0:
        raise BadMessage(f"message format 0x{message_format:08x} is not supported", "amqp:not-implemented")
    event = kept.split(payload)
    return Incoming([event.body], event.partition_key, [event.amqp])


def _binary(raw: bytes) -> bytes:
    """The binary of an encoded data section (a batch's events are data sections)."""
    _, at = kept.descriptor(raw)
    data = kept.binary_at(raw, at)
    if data is None:
        raise BadMessage("a data section holds binary")
    return data


# -- outgoing ----------------------------------------------------------------------------------


def millis(seconds: float) -> int:
    return round(seconds * 1000)


def runtime_metrics(last: PartitionProperties, now: float) -> bytes:
    """The delivery-annotations section Event Hubs adds for a receiver that asked for runtime metrics."""
    value: dict[Any, Any] = {
        _LAST_SEQUENCE: last.last_enqueued_sequence_number,
        _LAST_OFFSET: last.last_enqueued_offset if last.last_enqueued_offset is not None else "-1",
        _RETRIEVED: timestamp(millis(now)),
    }
    if last.last_enqueued_time is not None:
        value[_LAST_TIME] = timestamp(millis(last.last_enqueued_time))
    return _described(DELIVERY_ANNOTATIONS, value)


def encode(event: ReceivedEvent, metrics: bytes = b"") -> bytes:
    """``event`` as an Event Hubs message: delivery annotations (``metrics``, may be empty),
    message annotations, then the sections it was sent with; one data section with the body
    if it was sent as bytes alone."""
    annotations: dict[Any, Any] = {
        _SEQUENCE: event.sequence_number,
        _OFFSET: event.offset,
        _ENQUEUED: timestamp(millis(event.enqueued_time)),
    }
    if event.partition_key is not None:
        annotations[PARTITION_KEY] = event.partition_key
    hub_annotations = _described(MESSAGE_ANNOTATIONS, annotations)
    if event.amqp:
        delivery = kept.map_entries(metrics, kept.descriptor(metrics)[1]) if metrics else []
        hub = kept.map_entries(hub_annotations, kept.descriptor(hub_annotations)[1])
        return kept.join(event.amqp, event.body, hub, delivery)
    body = event.body
    head = b"\x00\x53\x75" + (bytes([0xA0, len(body)]) if len(body) < 256 else b"\xb0" + struct.pack(">I", len(body)))
    return metrics + hub_annotations + head + body


def _described(code: int, value: Any) -> bytes:
    data = Data()
    data.put_object(Described(ulong(code), value))
    return bytes(data.encode())
