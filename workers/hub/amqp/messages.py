"""Event Hubs messages: what a producer's transfer holds, and how a stored event goes out.

Incoming. A message is a run of sections; a batch (message format 0x80013700) is an outer message
whose data sections each hold one encoded event, with the partition key on the outer message's
annotations. The embedded log keeps an event's partition key and body only: application
properties and message properties are accepted and not kept (say so in what you build on it).
A body is the event's data sections joined; an AMQP value body of binary or text is taken as
its bytes; anything else is refused.

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

from workers.hub.amqp.frames import FrameError, split_values
from workers.sources.base import PartitionProperties, ReceivedEvent

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


class BadMessage(ValueError):
    """A transfer that is not an event this hub can store; ``condition`` is the AMQP error to answer."""

    def __init__(self, description: str, condition: str = "amqp:decode-error") -> None:
        super().__init__(description)
        self.condition = condition


@dataclass(frozen=True, slots=True)
class Incoming:
    """What one transfer asks to append: bodies in order, to one partition, with one key."""

    bodies: list[bytes]
    partition_key: str | None


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
    outer = sections(payload)
    key = _partition_key(outer)
    if message_format == BATCH_FORMAT:
        inner = [value for code, value in outer if code == DATA]
        if not inner:
            raise BadMessage("a batch without events (no data sections)", "amqp:invalid-field")
        return Incoming([_body(sections(_binary(part))) for part in inner], key)
    if message_format != 0:
        raise BadMessage(f"message format 0x{message_format:08x} is not supported", "amqp:not-implemented")
    return Incoming([_body(outer)], key)


def _partition_key(parts: list[tuple[int, Any]]) -> str | None:
    for code, value in parts:
        if code == MESSAGE_ANNOTATIONS and isinstance(value, dict):
            key = value.get(PARTITION_KEY)
            if key is None:
                return None
            if isinstance(key, bytes):
                key = key.decode("utf-8", "replace")
            if not isinstance(key, str):
                kind = type(key).__name__
                raise BadMessage(f"x-opt-partition-key must be a string, got {kind}", "amqp:invalid-field")
            return key
    return None


def _binary(value: Any) -> bytes:
    if not isinstance(value, bytes):
        raise BadMessage(f"a data section holds binary, got {type(value).__name__}")
    return value


def _body(parts: list[tuple[int, Any]]) -> bytes:
    data = [_binary(value) for code, value in parts if code == DATA]
    if data:
        return b"".join(data)
    for code, value in parts:
        if code == AMQP_VALUE:
            if isinstance(value, bytes):
                return value
            if isinstance(value, str):
                return value.encode("utf-8")
            raise BadMessage(
                f"the embedded hub stores bytes; an AMQP value body of {type(value).__name__} cannot be stored",
                NOT_IMPLEMENTED,
            )
        if code == AMQP_SEQUENCE:
            raise BadMessage("the embedded hub stores bytes; AMQP sequence bodies cannot be stored", NOT_IMPLEMENTED)
    return b""


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
    message annotations, one data section with the body."""
    annotations: dict[Any, Any] = {
        _SEQUENCE: event.sequence_number,
        _OFFSET: event.offset,
        _ENQUEUED: timestamp(millis(event.enqueued_time)),
    }
    if event.partition_key is not None:
        annotations[PARTITION_KEY] = event.partition_key
    body = event.body
    head = b"\x00\x53\x75" + (bytes([0xA0, len(body)]) if len(body) < 256 else b"\xb0" + struct.pack(">I", len(body)))
    return metrics + _described(MESSAGE_ANNOTATIONS, annotations) + head + body


def _described(code: int, value: Any) -> bytes:
    data = Data()
    data.put_object(Described(ulong(code), value))
    return bytes(data.encode())
