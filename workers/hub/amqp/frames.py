"""AMQP 1.0 frames at the byte level: what proton's engine cannot be asked, and what the SDK cannot read.

The server runs proton's protocol engine (``Transport``) and sits between it and the socket. Two
mismatches are repaired here, and only here:

- Outgoing. Proton leaves out trailing fields that are null or default, as the spec allows; the
  Azure SDK's own AMQP stack decodes performatives by position (and appends a transfer's payload
  as one more field), so a short ``transfer`` puts the payload where it looks for a flag, and a
  ``list0`` performative (``end`` without an error) is read as garbage. :func:`complete` rewrites
  every outgoing frame with all fields written out, and every error with an ``info`` map. Padding
  makes a transfer frame longer than proton sized it, so :func:`shrink_open` lowers the peer's
  max-frame-size, as proton sees it, by :data:`HEADROOM`.
- Incoming. Proton's Python binding exposes neither a link's desired capabilities nor a
  transfer's message format (a batch of events is format 0x80013700), and decodes delivery tags as
  text. :func:`decode` reads a frame's performative with proton's own codec, so those fields can be
  taken from the raw frames before proton consumes them.

:class:`FrameSplitter` cuts a byte stream into protocol headers and frames. Nothing here keeps
connection state. Every function raises :class:`FrameError` for bytes it cannot make sense of;
the server then hands the bytes to proton unchanged, which answers with a framing or decode error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from proton import Data, DataException, Described

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
HEADROOM = 64  # bytes a padded transfer performative may grow by (11 fields: at most 11 nulls + list32 header)

OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
ERROR = 0x1D
REJECTED = 0x25
SASL_MECHANISMS, SASL_INIT, SASL_CHALLENGE, SASL_RESPONSE, SASL_OUTCOME = range(0x40, 0x45)

# How many fields each performative has (AMQP 1.0, part 2 and 5).
FIELDS = {
    OPEN: 10,
    BEGIN: 8,
    ATTACH: 14,
    FLOW: 11,
    TRANSFER: 11,
    DISPOSITION: 6,
    DETACH: 3,
    END: 1,
    CLOSE: 1,
    SASL_MECHANISMS: 1,
    SASL_INIT: 3,
    SASL_CHALLENGE: 1,
    SASL_RESPONSE: 1,
    SASL_OUTCOME: 2,
}
_ERROR_FIELD = {DETACH: 2, END: 0, CLOSE: 0}
_STATE_FIELD = {DISPOSITION: 4, TRANSFER: 7}
_NULL = b"\x40"
_EMPTY_MAP = b"\xc1\x01\x00"
_HEAD = struct.Struct(">IBBH")  # size, data offset (in 4-byte words), type, channel


class FrameError(ValueError):
    """Bytes that are not a well-formed frame or performative."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: ``kind`` 0 is AMQP, 1 is SASL; ``body`` is everything after the header (empty for
    a heartbeat). ``raw`` is the whole frame as it was read."""

    kind: int
    channel: int
    body: bytes
    raw: bytes

    def with_body(self, body: bytes) -> Frame:
        """The same frame carrying ``body`` (any extended header is dropped)."""
        raw = _HEAD.pack(8 + len(body), 2, self.kind, self.channel) + body
        return Frame(self.kind, self.channel, body, raw)


class FrameSplitter:
    """Cuts a byte stream into 8-byte protocol headers (``bytes``) and :class:`Frame` objects.

    ``max_size`` bounds what is buffered: a frame announcing more is an error at once (the peer
    must not make us wait for gigabytes before anything is checked). After an error the splitter
    returns nothing more; ``error`` says what was wrong and :meth:`take_rest` hands over the bytes
    from the bad frame on, so they can go to proton unchanged."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self.error: str | None = None
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes | Frame]:
        """Everything complete after adding ``data``; a partial frame stays buffered. A frame size
        below 8 or above ``max_size``, or a bad data offset, sets ``error`` and ends the list there."""
        self._buf += data
        out: list[bytes | Frame] = []
        buf, i = self._buf, 0
        while self.error is None and len(buf) - i >= 8:
            if buf[i : i + 4] == b"AMQP":
                out.append(bytes(buf[i : i + 8]))
                i += 8
                continue
            size, doff, kind, channel = _HEAD.unpack_from(buf, i)
            if size < 8 or size > self.max_size or doff < 2 or doff * 4 > size:
                self.error = f"bad frame header: size {size}, data offset {doff}"
                break
            if len(buf) - i < size:
                break
            raw = bytes(buf[i : i + size])
            out.append(Frame(kind, channel, raw[doff * 4 :], raw))
            i += size
        del self._buf[:i]
        return out

    def take_rest(self) -> bytes:
        """The bytes buffered and not yet returned (emptying the buffer)."""
        rest = bytes(self._buf)
        self._buf.clear()
        return rest


# -- reading -----------------------------------------------------------------------------------


def decode(body: bytes) -> tuple[int, list[Any], int]:
    """(descriptor code, fields, length of the performative) of a frame body, decoded by proton
    into Python values (symbols as ``proton.symbol``, maps as dicts). A transfer's payload starts
    at the returned length. Raises FrameError."""
    data = Data()
    try:
        used = data.decode(body)
        data.rewind()
        data.next()
        value = data.get_object()
    except (DataException, KeyError, TypeError, ValueError) as exc:
        raise FrameError(f"undecodable performative: {exc}") from None
    if not isinstance(value, Described) or not isinstance(value.value, list):
        raise FrameError("a performative is a described list")
    code = value.descriptor
    if isinstance(code, int):
        return int(code), value.value, int(used)
    raise FrameError(f"performative descriptor {code!r} is not a numeric code")


def field(fields: list[Any], index: int) -> Any:
    """``fields[index]``, or None when the list stops before it (a left-out trailing field)."""
    return fields[index] if index < len(fields) else None


# -- rewriting ---------------------------------------------------------------------------------


def complete(body: bytes) -> bytes:
    """``body`` (a performative, and a transfer's payload) with every field of the performative
    written out, errors (in detach, end, close, a rejected outcome) with all three fields and an
    ``info`` map. Raises FrameError."""
    code, start = _descriptor(body, 0)
    if code not in FIELDS:
        return body
    items, end = _items(body, start)
    if len(items) > FIELDS[code]:
        raise FrameError(f"performative 0x{code:02x} has {len(items)} fields, at most {FIELDS[code]} exist")
    items += [_NULL] * (FIELDS[code] - len(items))
    if code in _ERROR_FIELD:
        items[_ERROR_FIELD[code]] = _complete_error(items[_ERROR_FIELD[code]])
    if code in _STATE_FIELD:
        items[_STATE_FIELD[code]] = _complete_state(items[_STATE_FIELD[code]])
    return b"\x00\x53" + bytes([code]) + _list(items) + body[end:]


def shrink_open(body: bytes, by: int = HEADROOM) -> bytes:
    """An ``open`` performative with its max-frame-size lowered by ``by`` (if it is set and larger
    than 512 + ``by``), so frames sized for the smaller limit still fit once padded. Raises FrameError."""
    code, start = _descriptor(body, 0)
    if code != OPEN:
        raise FrameError(f"not an open performative: 0x{code:02x}")
    items, end = _items(body, start)
    if len(items) < 3 or items[2] == _NULL:
        return body  # no limit: 4 GiB
    size = _uint(items[2])
    if size <= 512 + by:
        return body
    items[2] = b"\x70" + struct.pack(">I", size - by)
    return b"\x00\x53" + bytes([OPEN]) + _list(items) + body[end:]


def _complete_error(item: bytes) -> bytes:
    if item == _NULL:
        return item
    code, start = _descriptor(item, 0)
    if code != ERROR:
        raise FrameError(f"expected an error, found descriptor 0x{code:02x}")
    items, _ = _items(item, start)
    items += [_NULL] * (3 - len(items))
    if items[2] == _NULL:
        items[2] = _EMPTY_MAP
    return b"\x00\x53" + bytes([ERROR]) + _list(items)


def _complete_state(item: bytes) -> bytes:
    if item == _NULL:
        return item
    code, start = _descriptor(item, 0)
    if code != REJECTED:
        return item
    items, _ = _items(item, start)
    items = items or [_NULL]
    items[0] = _complete_error(items[0])
    return b"\x00\x53" + bytes([REJECTED]) + _list(items)


def _descriptor(buf: bytes, i: int) -> tuple[int, int]:
    """(numeric descriptor, where the described value starts) of the described value at ``i``."""
    if len(buf) < i + 3 or buf[i] != 0x00:
        raise FrameError("expected a described value")
    if buf[i + 1] == 0x53:
        return buf[i + 2], i + 3
    if buf[i + 1] == 0x80 and len(buf) >= i + 10:
        return int.from_bytes(buf[i + 2 : i + 10], "big"), i + 10
    raise FrameError(f"descriptor constructor 0x{buf[i + 1]:02x} is not a ulong")


def _items(buf: bytes, i: int) -> tuple[list[bytes], int]:
    """The encoded elements of the list at ``i``, and where the list ends."""
    if i >= len(buf):
        raise FrameError("expected a list, found the end")
    constructor = buf[i]
    if constructor == 0x45:
        return [], i + 1
    if constructor == 0xC0 and len(buf) >= i + 3:
        size, count, first = buf[i + 1], buf[i + 2], i + 3
        end = i + 2 + size
    elif constructor == 0xD0 and len(buf) >= i + 9:
        size, count = struct.unpack_from(">II", buf, i + 1)
        first, end = i + 9, i + 5 + size
    else:
        raise FrameError(f"expected a list, found constructor 0x{constructor:02x}")
    if end > len(buf) or end < first:
        raise FrameError("a list runs past the end of the frame")
    items, at = [], first
    for _ in range(count):
        nxt = _skip(buf, at, end)
        items.append(bytes(buf[at:nxt]))
        at = nxt
    if at != end:
        raise FrameError("a list's size does not match its elements")
    return items, end


def _skip(buf: bytes, i: int, end: int) -> int:
    """Where the encoded value at ``i`` ends (AMQP 1.0 part 1: widths follow from the constructor)."""
    if i >= end:
        raise FrameError("a value runs past the end of its list")
    constructor = buf[i]
    if constructor == 0x00:
        return _skip(buf, _skip(buf, i + 1, end), end)
    width = constructor >> 4
    if width in (0x4, 0x5, 0x6, 0x7, 0x8, 0x9):
        nxt = i + 1 + {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}[width]
    elif width in (0xA, 0xC, 0xE) and i + 2 <= end:
        nxt = i + 2 + buf[i + 1]
    elif width in (0xB, 0xD, 0xF) and i + 5 <= end:
        nxt = i + 5 + int.from_bytes(buf[i + 1 : i + 5], "big")
    else:
        raise FrameError(f"unknown constructor 0x{constructor:02x}")
    if nxt > end:
        raise FrameError("a value runs past the end of its list")
    return nxt


def _uint(item: bytes) -> int:
    if item[0] == 0x43:
        return 0
    if item[0] == 0x52 and len(item) == 2:
        return item[1]
    if item[0] == 0x70 and len(item) == 5:
        return int.from_bytes(item[1:], "big")
    raise FrameError(f"expected a uint, found constructor 0x{item[0]:02x}")


def _list(items: list[bytes]) -> bytes:
    content = b"".join(items)
    if len(content) + 1 <= 0xFF and len(items) <= 0xFF:
        return bytes([0xC0, len(content) + 1, len(items)]) + content
    return b"\xd0" + struct.pack(">II", len(content) + 4, len(items)) + content


def split_values(buf: bytes) -> list[bytes]:
    """The encoded values one after another in ``buf`` (a message is a run of sections). Raises
    FrameError if the last one is cut short."""
    out, at = [], 0
    while at < len(buf):
        nxt = _skip(buf, at, len(buf))
        out.append(buf[at:nxt])
        at = nxt
    return out
