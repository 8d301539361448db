"""The log file of one embedded-hub partition: record layout, forward parsing, finding the tail.

One record per event, appended with a single ``write`` under the partition's ``flock``::

    format 1: crc32 u32 | length u32 | sequence i64 | enqueued f64 | key length u16 | key | body | length u32
    format 2: crc32 u32 | length u32 | sequence i64 | enqueued f64 | 0x8000 + key length u16 | key
              | amqp length u32 | amqp | body | length u32

``length`` counts the whole record; the CRC covers everything after itself, trailer included. A key
length of 0xFFFF (format 1) or 0x8000 + 0x3FF (format 2) means "no key". Format 2 adds the AMQP
sections an event was sent with (``ReceivedEvent.amqp``: properties, annotations, other body kinds);
an event without any is still written in format 1, and logs of either format, or both mixed, read. The
trailing length lets the last record be found from the end of the file without a scan. The offset
of an event is the byte position where its record starts.

Readers never lock, so they may meet the record a writer is appending right now. Linux makes written
bytes visible no later than the file size that covers them, so what a reader sees past the last
complete record is a prefix of the next one: "incomplete" means "not yet written", never an error.
A record that is complete but fails its CRC is a torn tail when nothing follows it (a writer died
or the machine crashed mid-write; the next writer truncates it under the lock) and corruption when
more data follows; corruption raises :class:`CorruptLog` and is never skipped.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from types import MemberDescriptorType

from workers.sources.base import ReceivedEvent

HEADER = struct.Struct("<IIqdH")  # crc32, record length, sequence number, enqueued time, key length
TRAILER = struct.Struct("<I")  # the record length again
AMQP_LENGTH = struct.Struct("<I")  # format 2: the length of the AMQP sections
NO_KEY = 0xFFFF
FORMAT_2 = 0x8000  # set in the key length field of a format-2 record
NO_KEY_2 = 0x3FF  # format 2's "no key" (beside the flag)
MAX_BODY = 1024 * 1024  # Event Hubs refuses events over about 1 MB
MAX_AMQP = MAX_BODY + 64 * 1024  # a message's other sections; whole messages are capped by the server
MAX_KEY = 256  # bytes of UTF-8; ours, Event Hubs' own limit is lower
MIN_RECORD = HEADER.size + TRAILER.size
MAX_RECORD = MIN_RECORD + MAX_KEY + AMQP_LENGTH.size + MAX_AMQP + MAX_BODY
CHUNK = 1 << 20

# Why a parse stopped.
_FULL, _END, _PARTIAL, _BAD, _SEQUENCE = range(5)


class CorruptLog(Exception):
    """A record in the middle of a partition's log is damaged; events after it cannot be trusted."""

    def __init__(self, hub: str, partition_id: str, offset: int, problem: str) -> None:
        self.hub = hub
        self.partition_id = partition_id
        self.offset = offset
        super().__init__(f"embedded hub {hub!r} partition {partition_id} is corrupt at offset {offset}: {problem}")


@dataclass(frozen=True, slots=True)
class Tail:
    """The end of the complete records of a log, and the last of them."""

    end: int
    next_sequence: int
    last_offset: int | None
    last_time: float | None


EMPTY = Tail(0, 0, None, None)

MakeEvent = Callable[[str, int, str, float, "str | None", bytes, bytes], ReceivedEvent]
_EVENT_FIELDS = ("partition_id", "sequence_number", "offset", "enqueued_time", "partition_key", "body", "amqp")


def event_factory() -> MakeEvent:
    """``ReceivedEvent``'s constructor, or an equivalent about twice as fast.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``: that was a
    third of the cost of reading an event. The slots' own descriptors set the same fields for far
    less. The fast path is used only while ``ReceivedEvent`` is what it was written for (these
    fields in this order, slots, no ``__post_init__``); otherwise the class itself is returned.
    """
    cls = ReceivedEvent
    slots = [cls.__dict__.get(name) for name in _EVENT_FIELDS]
    if (
        tuple(f.name for f in fields(cls)) != _EVENT_FIELDS
        or hasattr(cls, "__post_init__")
        or not all(isinstance(slot, MemberDescriptorType) for slot in slots)
    ):
        return cls
    new = object.__new__
    set_pid, set_seq, set_offset, set_time, set_key, set_body, set_amqp = (slot.__set__ for slot in slots)  # type: ignore[union-attr]

    def make(
        partition_id: str,
        sequence_number: int,
        offset: str,
        enqueued_time: float,
        partition_key: str | None,
        body: bytes,
        amqp: bytes = b"",
    ) -> ReceivedEvent:
        event: ReceivedEvent = new(cls)
        set_pid(event, partition_id)
        set_seq(event, sequence_number)
        set_offset(event, offset)
        set_time(event, enqueued_time)
        set_key(event, partition_key)
        set_body(event, body)
        set_amqp(event, amqp)
        return event

    return make


make_event = event_factory()


def encode(sequence_number: int, enqueued_time: float, key: bytes | None, body: bytes, amqp: bytes = b"") -> bytes:
    """One record, ready to append: format 2 if the event has AMQP sections, else format 1."""
    key_bytes = key if key is not None else b""
    if amqp:
        key_field = FORMAT_2 | (NO_KEY_2 if key is None else len(key_bytes))
        middle = AMQP_LENGTH.pack(len(amqp)) + amqp
    else:
        key_field, middle = (NO_KEY if key is None else len(key_bytes)), b""
    length = MIN_RECORD + len(key_bytes) + len(middle) + len(body)
    head = HEADER.pack(0, length, sequence_number, enqueued_time, key_field)
    rest = b"".join((head[4:], key_bytes, middle, body, TRAILER.pack(length)))
    return zlib.crc32(rest).to_bytes(4, "little") + rest


class LogFile:
    """An open partition log; read-only unless ``writable``. Not shared between threads."""

    def __init__(self, path: str, hub: str, partition_id: str, *, writable: bool = False) -> None:
        flags = (os.O_RDWR | os.O_APPEND) if writable else os.O_RDONLY
        self.fd = os.open(path, flags | os.O_CLOEXEC)
        self.path = path
        self.hub = hub
        self.partition_id = partition_id

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def pread(self, size: int, pos: int) -> bytes:
        return os.pread(self.fd, size, pos)

    def corrupt(self, offset: int, problem: str) -> CorruptLog:
        return CorruptLog(self.hub, self.partition_id, offset, problem)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def record_at(self, pos: int) -> tuple[int, float, int] | None:
        """(sequence number, enqueued time, length) of the intact record starting at ``pos``, else None."""
        head = self.pread(HEADER.size, pos)
        if len(head) < HEADER.size:
            return None
        crc, length, sequence, enqueued, _ = HEADER.unpack(head)
        if not MIN_RECORD <= length <= MAX_RECORD:
            return None
        record = self.pread(length, pos)
        if len(record) < length or zlib.crc32(memoryview(record)[4:]) != crc:
            return None
        return sequence, enqueued, length

    def last_record(self, size: int) -> Tail | None:
        """The tail if the file ends with an intact record (found through its trailer), else None."""
        if size < MIN_RECORD:
            return None
        (length,) = TRAILER.unpack(self.pread(TRAILER.size, size - TRAILER.size))
        if not MIN_RECORD <= length <= min(size, MAX_RECORD):
            return None
        found = self.record_at(size - length)
        if found is None or found[2] != length:
            return None
        return Tail(size, found[0] + 1, size - length, found[1])

    def find_tail(self, hint: Tail = EMPTY) -> Tail:
        """The end of the complete records. ``hint`` is an earlier tail of this file; the file only grows
        past it (torn tails are cut back to a record boundary, never below one).

        Raises CorruptLog if a damaged record has data after it."""
        size = self.size()
        if size == hint.end:
            return hint
        if size < hint.end:
            hint = EMPTY  # not the file the hint came from
        tail = self.last_record(size)
        if tail is not None and tail.next_sequence > hint.next_sequence:
            return tail
        cursor = Cursor(self, hint.end, hint.next_sequence)
        cursor.read(1 << 62, None)
        if cursor.last_offset is None:
            return Tail(cursor.pos, cursor.next_sequence, hint.last_offset, hint.last_time)
        return Tail(cursor.pos, cursor.next_sequence, cursor.last_offset, cursor.last_time)

    def check_damage(self, pos: int) -> bool:
        """For a record at ``pos`` that was found damaged or incomplete: True if it is intact now (a
        writer finished it, or repaired a torn tail and wrote anew), False if it is the end of the log
        (torn, or being written). Raises CorruptLog if intact records follow it.

        Damage is stable, races are not: a writer may cut a torn tail and write a new record while
        this looks, so damage is reported only if a second look, on a fresh size, sees it too."""
        verdict = self._damage(pos)
        if isinstance(verdict, str):
            verdict = self._damage(pos)
        if isinstance(verdict, str):
            raise self.corrupt(pos, verdict)
        return verdict

    def _damage(self, pos: int) -> bool | str:
        # The size is taken before anything is re-read, so bytes appended later cannot make an
        # unfinished record look as if more data followed it.
        size = self.size()
        if self.record_at(pos) is not None:
            return True
        head = self.pread(HEADER.size, pos)
        if len(head) < HEADER.size:
            return False
        _, length, _, _, _ = HEADER.unpack(head)
        if MIN_RECORD <= length <= MAX_RECORD:
            if pos + length < size:
                return "CRC mismatch in a record with more data after it"
            # Damaged last record, or one still being written; unless its length is what got damaged.
            last = self.last_record(size)
            if last is not None and last.last_offset is not None and last.last_offset > pos:
                return f"record length {length} runs past intact records (the last at {last.last_offset})"
            return False
        # A header that makes no sense: only zeros up to the end (space a crash left allocated) is a tail.
        if size - pos <= 16 * CHUNK and not self.pread(size - pos, pos).strip(b"\0"):
            return False
        return f"impossible record length {length}"


class Cursor:
    """Walks a log forward from a record boundary, stopping at its tail; raises CorruptLog on damage."""

    def __init__(self, log: LogFile, pos: int, next_sequence: int) -> None:
        self.log = log
        self.pos = pos
        self.next_sequence = next_sequence
        self.last_offset: int | None = None
        self.last_time: float | None = None
        self._buf = b""
        self._base = pos
        self._need = 0
        self._keys: dict[bytes, str] = {}

    def read(self, limit: int, out: list[ReceivedEvent] | None) -> int:
        """Parses up to ``limit`` records, appending them to ``out`` if given; returns how many.
        Fewer than ``limit`` means the tail was reached."""
        count = 0
        while count < limit:
            got, why = self._parse(limit - count, out)
            count += got
            if why == _FULL:
                break
            if why == _SEQUENCE:
                raise self.log.corrupt(self.pos, f"expected sequence number {self.next_sequence}")
            if why == _END and not self._refill():
                break
            if why == _BAD or (why == _PARTIAL and not self._refill()):
                if not self.log.check_damage(self.pos):
                    break
                self._buf, self._base = b"", self.pos  # intact now: read it afresh
        return count

    def _refill(self) -> bool:
        """Reads on from ``pos``; True if more bytes came than were buffered."""
        had = self._base + len(self._buf) - self.pos
        self._buf = self.log.pread(max(CHUNK, self._need), self.pos)
        self._base = self.pos
        return len(self._buf) > had

    def _parse(self, limit: int, out: list[ReceivedEvent] | None) -> tuple[int, int]:
        buf, base = self._buf, self._base
        size = len(buf)
        view = memoryview(buf)
        unpack, crc32, keys, event = HEADER.unpack_from, zlib.crc32, self._keys, make_event
        head, shortest, longest = HEADER.size, MIN_RECORD, MAX_RECORD
        append = out.append if out is not None else None
        partition_id = self.log.partition_id
        i = self.pos - base
        sequence = self.next_sequence
        count, why, last = 0, _FULL, -1
        enqueued = 0.0
        while count < limit:
            if i + head > size:
                why = _END if i == size else _PARTIAL
                self._need = head
                break
            crc, length, seq, enqueued_at, key_length = unpack(buf, i)
            if length < shortest or length > longest:
                why = _BAD
                break
            j = i + length
            if j > size:
                why, self._need = _PARTIAL, length
                break
            if crc32(view[i + 4 : j]) != crc:
                why = _BAD
                break
            if seq != sequence:
                why = _SEQUENCE
                break
            if append is not None:
                k = i + head
                amqp = b""
                if key_length & FORMAT_2 and key_length != NO_KEY:  # format 2: the AMQP sections follow the key
                    key_length &= ~FORMAT_2
                    b = k if key_length == NO_KEY_2 else k + key_length
                    key = None if key_length == NO_KEY_2 else buf[k:b].decode("utf-8", "replace")
                    (amqp_length,) = AMQP_LENGTH.unpack_from(buf, b)
                    amqp, b = buf[b + 4 : b + 4 + amqp_length], b + 4 + amqp_length
                elif key_length == NO_KEY:
                    key, b = None, k
                else:
                    b = k + key_length
                    raw = buf[k:b]
                    key = keys.get(raw)
                    if key is None:
                        if len(keys) > 4096:
                            keys.clear()
                        key = keys[raw] = raw.decode("utf-8", "replace")
                append(event(partition_id, seq, str(base + i), enqueued_at, key, buf[b : j - 4], amqp))
            last, enqueued = i, enqueued_at
            sequence += 1
            count += 1
            i = j
        if count:
            self.last_offset, self.last_time = base + last, enqueued
        self.pos, self.next_sequence = base + i, sequence
        return count, why
