"""An event's AMQP sections, kept byte for byte: split when it comes in, put back together when it goes out.

Incoming, a message (AMQP 1.0 part 3) is, in this order: header, delivery annotations, message
annotations, properties, application properties, a body (one or more data sections, one or more
sequence sections, or one value section) and a footer; each at most once but for the body. What
the hub keeps of it (``Split``): the partition key; the body's bytes; and the encoded sections as
sent (``ReceivedEvent.amqp``), but for the annotations the hub sets itself (``HUB_ANNOTATIONS``,
taken out of the message annotations) and a body of exactly one data section (kept as ``body``
alone: most events, stored without a second copy). Values are never decoded and re-encoded, so
whatever a producer sent (binary map keys, described types, arrays) comes back exactly.

Outgoing, the stored sections are put back in order with the hub's annotations at the head of the
message annotations and the receiver's runtime metrics added to the delivery annotations.

A message this cannot keep whole (a section twice, two body kinds, an unknown section) raises
BadMessage with the AMQP error to answer: it is refused, never cut down.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from workers.hub.amqp.frames import FrameError, split_values

HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES, APPLICATION_PROPERTIES = 0x70, 0x71, 0x72, 0x73, 0x74
DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x75, 0x76, 0x77, 0x78
BODY = (DATA, AMQP_SEQUENCE, AMQP_VALUE)
_NAMES = {
    b"amqp:header:list": HEADER,
    b"amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    b"amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    b"amqp:properties:list": PROPERTIES,
    b"amqp:application-properties:map": APPLICATION_PROPERTIES,
    b"amqp:data:binary": DATA,
    b"amqp:amqp-sequence:list": AMQP_SEQUENCE,
    b"amqp:amqp-value:*": AMQP_VALUE,
    b"amqp:footer:map": FOOTER,
}
PARTITION_KEY = "x-opt-partition-key"
HUB_ANNOTATIONS = frozenset({PARTITION_KEY, "x-opt-sequence-number", "x-opt-offset", "x-opt-enqueued-time"})


class BadMessage(ValueError):
    """A transfer that is not an event this hub can store; ``condition`` is the AMQP error to answer."""

    def __init__(self, description: str, condition: str = "amqp:decode-error") -> None:
        super().__init__(description)
        self.condition = condition


@dataclass(frozen=True, slots=True)
class Split:
    """One message as the hub stores it."""

    body: bytes
    amqp: bytes
    partition_key: str | None


def descriptor(raw: bytes) -> tuple[int, int]:
    """(section code, where its value starts) of one encoded section. Raises BadMessage."""
    if len(raw) >= 3 and raw[0] == 0x00:
        kind = raw[1]
        if kind == 0x53:
            return raw[2], 3
        if kind == 0x44:
            return 0, 2
        if kind == 0x80 and len(raw) >= 10:
            return int.from_bytes(raw[2:10], "big"), 10
        if kind in (0xA3, 0xB3):
            text, end = _text_at(raw, 1)
            if text is not None and text.encode() in _NAMES:
                return _NAMES[text.encode()], end
            raise BadMessage(f"unknown message section {text!r}", "amqp:not-implemented")
    raise BadMessage("a message section is a described value with a section descriptor")


def _text_at(raw: bytes, at: int) -> tuple[str | None, int]:
    """The string or symbol encoded at ``at`` and where it ends; (None, end) for any other value."""
    constructor = raw[at]
    if constructor in (0xA1, 0xA3) and at + 2 <= len(raw):
        start, size = at + 2, raw[at + 1]
    elif constructor in (0xB1, 0xB3) and at + 5 <= len(raw):
        start, size = at + 5, int.from_bytes(raw[at + 1 : at + 5], "big")
    else:
        return None, at
    if start + size > len(raw):
        raise BadMessage("a string runs past the end of its section")
    return raw[start : start + size].decode("utf-8", "replace"), start + size


def binary_at(raw: bytes, at: int) -> bytes | None:
    """The binary encoded at ``at``, None for any other value."""
    constructor = raw[at] if at < len(raw) else None
    if constructor == 0xA0 and at + 2 <= len(raw):
        return raw[at + 2 : at + 2 + raw[at + 1]]
    if constructor == 0xB0 and at + 5 <= len(raw):
        return raw[at + 5 : at + 5 + int.from_bytes(raw[at + 1 : at + 5], "big")]
    return None


def map_entries(raw: bytes, at: int) -> list[bytes]:
    """The encoded keys and values, alternating, of the map encoded at ``at`` (null: none).
    Raises BadMessage."""
    constructor = raw[at] if at < len(raw) else None
    if constructor == 0x40:
        return []
    if constructor == 0xC1 and at + 3 <= len(raw):
        payload = raw[at + 3 : at + 2 + raw[at + 1]]
    elif constructor == 0xD1 and at + 9 <= len(raw):
        payload = raw[at + 9 : at + 5 + int.from_bytes(raw[at + 1 : at + 5], "big")]
    else:
        raise BadMessage("annotations, application properties and footers are maps", "amqp:invalid-field")
    try:
        entries = split_values(payload)
    except FrameError as exc:
        raise BadMessage(f"a map cannot be read: {exc}") from None
    if len(entries) % 2:
        raise BadMessage("a map with a key but no value")
    return entries


def map_section(code: int, entries: list[bytes]) -> bytes:
    """A section of ``code`` holding a map of ``entries`` (keys and values, alternating, encoded)."""
    payload = b"".join(entries)
    return b"\x00\x53" + bytes([code]) + b"\xd1" + struct.pack(">II", len(payload) + 4, len(entries)) + payload


def split(payload: bytes) -> Split:
    """A message's sections as the hub stores them. Raises BadMessage."""
    try:
        parts = split_values(payload)
    except FrameError as exc:
        raise BadMessage(f"not an AMQP message: {exc}") from None
    kept: list[tuple[int, bytes]] = []
    body_parts: list[tuple[int, bytes, int]] = []
    key: str | None = None
    seen: set[int] = set()
    for raw in parts:
        code, at = descriptor(raw)
        if code not in _NAMES.values():
            raise BadMessage(f"unknown message section 0x{code:x}", "amqp:not-implemented")
        # The spec's order is not insisted on (the SDKs send delivery annotations after the message
        # annotations); each section but the body's comes once, and goes out in the spec's order.
        if code not in BODY and code in seen:
            raise BadMessage(f"message section 0x{code:x} repeated")
        seen.add(code)
        if code in BODY:
            if body_parts and (body_parts[0][0] != code or code == AMQP_VALUE):
                raise BadMessage("a message body is data sections, sequence sections or one value section")
            body_parts.append((code, raw, at))
            kept.append((code, raw))
        elif code == MESSAGE_ANNOTATIONS:
            key, annotations = _own_annotations(map_entries(raw, at))
            if annotations:
                kept.append((code, map_section(MESSAGE_ANNOTATIONS, annotations)))
        else:
            if code in (DELIVERY_ANNOTATIONS, APPLICATION_PROPERTIES, FOOTER):
                map_entries(raw, at)  # refused now if it is not a map, not when a receiver reads it
            kept.append((code, raw))
    kind = body_parts[0][0] if body_parts else DATA
    if kind == DATA:
        pieces = [binary_at(raw, at) for _, raw, at in body_parts]
        if any(piece is None for piece in pieces):
            raise BadMessage("a data section holds binary")
        body = b"".join(piece for piece in pieces if piece is not None)
        if len(body_parts) <= 1:  # the common case: the body is the record's body alone
            kept = [(code, raw) for code, raw in kept if code != DATA]
    elif kind == AMQP_VALUE:
        _, raw, at = body_parts[0]
        text, _ = _text_at(raw, at)
        body = binary_at(raw, at) or (text.encode() if text is not None else b"")
    else:
        body = b""
    kept.sort(key=lambda part: DATA if part[0] in BODY else part[0])  # stable: body sections keep their order
    return Split(body, b"".join(raw for _, raw in kept), key)


def _own_annotations(entries: list[bytes]) -> tuple[str | None, list[bytes]]:
    """The partition key among message annotations, and the annotations other than the hub's."""
    key: str | None = None
    kept: list[bytes] = []
    for i in range(0, len(entries), 2):
        name, _ = _text_at(entries[i], 0)
        if name in HUB_ANNOTATIONS:
            if name == PARTITION_KEY:
                key = _partition_key(entries[i + 1])
            continue
        kept += entries[i : i + 2]
    return key, kept


def _partition_key(raw: bytes) -> str | None:
    if raw[:1] == b"\x40":
        return None
    text, _ = _text_at(raw, 0)
    if text is None:
        data = binary_at(raw, 0)
        if data is None:
            raise BadMessage(
                f"x-opt-partition-key must be a string, got constructor 0x{raw[0]:02x}", "amqp:invalid-field"
            )
        text = data.decode("utf-8", "replace")
    return text


def join(amqp: bytes, body: bytes, annotations: list[bytes], delivery: list[bytes]) -> bytes:
    """A stored event as a message: its sections (``amqp``) in order, ``annotations`` (the hub's,
    encoded map entries) first among its message annotations, ``delivery`` (runtime metrics)
    added to its delivery annotations, and ``body`` as one data section unless ``amqp`` holds the
    body."""
    by_code: dict[int, list[bytes]] = {}
    for raw in split_values(amqp) if amqp else []:
        by_code.setdefault(descriptor(raw)[0], []).append(raw)

    def entries(code: int) -> list[bytes]:
        return [e for raw in by_code.get(code, []) for e in map_entries(raw, descriptor(raw)[1])]

    out = by_code.get(HEADER, [])[:]
    stored_delivery = entries(DELIVERY_ANNOTATIONS)
    if delivery or stored_delivery:
        out.append(map_section(DELIVERY_ANNOTATIONS, stored_delivery + delivery))
    out.append(map_section(MESSAGE_ANNOTATIONS, annotations + entries(MESSAGE_ANNOTATIONS)))
    out += by_code.get(PROPERTIES, []) + by_code.get(APPLICATION_PROPERTIES, [])
    stored_body = [raw for code in BODY for raw in by_code.get(code, [])]
    if stored_body:
        out += stored_body
    else:
        size = struct.pack(">I", len(body))
        out.append(b"\x00\x53\x75" + (bytes([0xA0, len(body)]) if len(body) < 256 else b"\xb0" + size) + body)
    out += by_code.get(FOOTER, [])
    return b"".join(out)
