"""What a dead letter holds, for people: its body as JSON, text or hex, and its application
properties as JSON; and its AMQP sections with one property set, for sending it again.

The sections are the ones the embedded hub keeps (``ReceivedEvent.amqp``, ``workers.hub.amqp.sections``):
a new application property is added as an encoded map entry, the other entries and sections byte
for byte as they were.
"""

from __future__ import annotations

import codecs
import json
import math
import struct
from typing import Any

from workers.hub.amqp.frames import FrameError, split_values
from workers.hub.amqp.messages import sections
from workers.hub.amqp.sections import APPLICATION_PROPERTIES, BadMessage, descriptor, map_entries, map_section

BODY_SHOWN = 64 * 1024  # bytes of a body shown; the rest is cut (``truncated``)
_CONTROL = frozenset(chr(c) for c in range(32)) - {"\t", "\n", "\r"}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity: Python reads them, JSON has none


def body_view(body: bytes) -> dict[str, Any]:
    """``{"encoding": "json" | "text" | "hex", "value", "size", "truncated"}``: JSON where the whole body
    is JSON (in UTF-8), else UTF-8 text where it is text (no control character but tab and line
    breaks), else hex; at most BODY_SHOWN bytes of it."""
    shown, truncated = body[:BODY_SHOWN], len(body) > BODY_SHOWN
    view: dict[str, Any] = {"size": len(body), "truncated": truncated}
    try:
        # A cut body may end inside a character: the incremental decoder leaves that tail out.
        text = codecs.getincrementaldecoder("utf-8")().decode(shown, final=not truncated)
    except UnicodeDecodeError:
        return {"encoding": "hex", "value": shown.hex(), **view}
    if not truncated and text.strip():
        try:
            return {"encoding": "json", "value": json.loads(text, parse_constant=_no_constant), **view}
        except (ValueError, RecursionError):
            pass
    if any(c in _CONTROL for c in text):
        return {"encoding": "hex", "value": shown.hex(), **view}
    return {"encoding": "text", "value": text, **view}


def _plain(value: Any) -> Any:
    """A property's value as JSON can hold it: bytes as text where UTF-8, else ``0x`` and hex."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)  # a symbol is a str of its own class
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return "0x" + value.hex()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(_plain(k)): _plain(v) for k, v in value.items()}
    return str(value)


def json_safe(properties: dict[Any, Any]) -> dict[str, Any]:
    """Application properties as a source gives them (keys and values may be bytes), JSON-safe."""
    return {str(_plain(k)): _plain(v) for k, v in properties.items()}


def properties_of(amqp: bytes) -> dict[str, Any]:
    """The application properties in ``amqp`` (an event's sections), JSON-safe; {} when none or unreadable."""
    if not amqp:
        return {}
    try:
        found = sections(amqp)
    except BadMessage:
        return {}
    for code, value in found:
        if code == APPLICATION_PROPERTIES and isinstance(value, dict):
            return json_safe(value)
    return {}


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) < 256:
        return b"\xa1" + bytes([len(data)]) + data
    return b"\xb1" + struct.pack(">I", len(data)) + data


def with_property(amqp: bytes, name: str, value: str) -> bytes:
    """``amqp`` with the application property ``name`` set to the string ``value`` (replacing one of
    that name we set before). Raises BadMessage for sections that cannot be read."""
    try:
        parts = split_values(amqp) if amqp else []
    except FrameError as exc:
        raise BadMessage(f"not AMQP sections: {exc}") from None
    key, entry = _string(name), [_string(name), _string(value)]
    out: list[bytes] = []
    added = False
    for raw in parts:
        code, at = descriptor(raw)
        if code == APPLICATION_PROPERTIES:
            entries = map_entries(raw, at)
            kept = [e for i in range(0, len(entries), 2) if entries[i] != key for e in entries[i : i + 2]]
            raw, added = map_section(APPLICATION_PROPERTIES, kept + entry), True
        elif code > APPLICATION_PROPERTIES and not added:
            out.append(map_section(APPLICATION_PROPERTIES, entry))  # in the spec's order: before the body
            added = True
        out.append(raw)
    if not added:
        out.append(map_section(APPLICATION_PROPERTIES, entry))
    return b"".join(out)
