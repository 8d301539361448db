"""The trace context an event carries: W3C ``traceparent`` (and ``tracestate``) in its AMQP application
properties, where Azure's SDKs put it (with the older ``Diagnostic-Id``, the same value, beside it).

Read from ``ReceivedEvent.amqp`` (the sections the embedded hub keeps) without decoding the rest of
the message: only the application-properties map is walked, and only string, symbol and binary keys
and values are looked at. Written as an application-properties section for the embedded hub's
``send_batch(amqp=...)``. Nothing here imports OpenTelemetry: ``tracing.py`` turns the strings into
contexts with the W3C TraceContext propagator.
"""

from __future__ import annotations

import struct

from workers.hub.amqp.frames import FrameError, split_values
from workers.hub.amqp.sections import APPLICATION_PROPERTIES, BadMessage, descriptor, map_entries, map_section

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
DIAGNOSTIC_ID = "diagnostic-id"  # Azure's older name for the same value ("Diagnostic-Id"); keys compare lowercased
_WANTED = frozenset({TRACEPARENT, TRACESTATE, DIAGNOSTIC_ID})


def _text(raw: bytes) -> str | None:
    """The string, symbol or binary (as UTF-8) ``raw`` encodes; None for any other value."""
    if len(raw) < 2:
        return None
    constructor = raw[0]
    if constructor in (0xA1, 0xA3, 0xA0):
        start, size = 2, raw[1]
    elif constructor in (0xB1, 0xB3, 0xB0) and len(raw) >= 5:
        start, size = 5, int.from_bytes(raw[1:5], "big")
    else:
        return None
    return raw[start : start + size].decode("utf-8", "replace")


def trace_headers(amqp: bytes) -> dict[str, str]:
    """The trace context among the application properties in ``amqp`` (an event's sections), keys
    lowercased: ``traceparent``, ``tracestate`` and where no ``traceparent`` is there, a
    ``Diagnostic-Id`` as ``traceparent``. {} when there is none or the sections cannot be read."""
    if not amqp:
        return {}
    try:
        for raw in split_values(amqp):
            code, at = descriptor(raw)
            if code == APPLICATION_PROPERTIES:
                return _from_map(map_entries(raw, at))
    except (FrameError, BadMessage):
        return {}
    return {}


def _from_map(entries: list[bytes]) -> dict[str, str]:
    found: dict[str, str] = {}
    for i in range(0, len(entries) - 1, 2):
        key = _text(entries[i])
        if key is None or key.lower() not in _WANTED:
            continue
        value = _text(entries[i + 1])
        if value:
            found[key.lower()] = value
    diagnostic = found.pop(DIAGNOSTIC_ID, None)
    if TRACEPARENT not in found and diagnostic is not None:
        found[TRACEPARENT] = diagnostic
    return found


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) < 256:
        return b"\xa1" + bytes([len(data)]) + data
    return b"\xb1" + struct.pack(">I", len(data)) + data


def properties_section(properties: dict[str, str]) -> bytes:
    """An application-properties section holding ``properties`` (string keys and values), as the
    embedded hub stores an event's sections (``ReceivedEvent.amqp``)."""
    entries = [part for key, value in properties.items() for part in (_string(key), _string(value))]
    return map_section(APPLICATION_PROPERTIES, entries)
