"""Reading an embedded hub's partition: where a reader starts (``start_of``) and the reader itself
(``HubReader``). Readers never lock; what they see past the last complete record is "not yet
written" (``workers.hub.log``). ``browse`` is ``EmbeddedHub.browse``: a bounded read from a position
given by sequence number, offset or time, for the console's event browser."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from workers.hub.log import MAX_RECORD, MIN_RECORD, TRAILER, CorruptLog, Cursor, LogFile, Tail
from workers.sources.arrivals import WatchedReader
from workers.sources.base import Browsed, Position, ReceivedEvent, Start

log = logging.getLogger("workers.hub.embedded")  # the hub's logger: its lines keep the name they had


class ReadRefused(ConnectionError):
    """A read the hub refused: the fault drill ``EmbeddedHub.refuse`` (a link that keeps failing)."""


@dataclass(frozen=True, slots=True)
class Drills:
    """The files of a partition's fault drills (``EmbeddedHub.wedge`` and ``refuse``); "" for none."""

    wedge: str = ""
    refuse: str = ""


class HubReader(WatchedReader):
    """Reads one partition forward from a resolved position. Not thread-safe; one per pump.
    ``notify(wake)``: ``wake()`` when the log is written (``workers.sources.arrivals``)."""

    def __init__(self, log_file: LogFile, pos: int, next_sequence: int, drills: Drills | None = None) -> None:
        self._log, self.watched_path = log_file, log_file.path
        self._cursor = Cursor(log_file, pos, next_sequence)
        # Fault drills: a wedge file whose time is past this reader's opening says the hub stopped
        # answering this reader's link (it gives nothing, without failing or closing); a refuse file
        # (naming this process, or none) that every read fails.
        self._drills, self._opened = drills or Drills(), time.time_ns()

    def _wedged(self) -> bool:
        try:
            return bool(self._drills.wedge) and os.stat(self._drills.wedge).st_mtime_ns >= self._opened
        except FileNotFoundError:
            return False

    def _refused(self) -> bool:
        if not self._drills.refuse:
            return False
        try:
            with open(self._drills.refuse, encoding="ascii") as drill:
                named = drill.read().strip()
        except FileNotFoundError:
            return False
        return not named or named == str(os.getpid())

    @property
    def next_sequence_number(self) -> int:
        return self._cursor.next_sequence

    def receive(self, max_events: int) -> list[ReceivedEvent]:
        """Up to ``max_events`` next events in sequence order; [] when none are there yet. Raises
        CorruptLog at a damaged record (once the intact events before it have been handed over),
        ReadRefused in the drill ``EmbeddedHub.refuse``, ValueError if closed or ``max_events`` < 1."""
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events must be a whole number of at least 1, got {max_events!r}")
        if self._log.fd < 0:
            raise ValueError(f"reader of partition {self._log.partition_id} is closed")
        if self._refused():
            raise ReadRefused(f"the hub refused the read of partition {self._log.partition_id} (a fault drill)")
        if self._wedged():
            return []
        out: list[ReceivedEvent] = []
        try:
            self._cursor.read(max_events, out)
        except CorruptLog:
            if not out:
                raise
            # Hand over the intact events before the damage; the next call stops at it again.
        return out

    def nothing_new(self) -> bool:
        """True when the log holds no byte past the last event read (one ``fstat``: cheap enough for
        the event loop). An idle pump asks this at its safety read instead of reading in its thread."""
        if self._log.fd < 0 or self._refused():
            return False  # a refused reader reads, and fails
        return os.fstat(self._log.fd).st_size <= self._cursor.pos or self._wedged()

    def close(self) -> None:
        self.unwatch()
        self._log.close()


def start_of(log_file: LogFile, position: Position, hint: Tail) -> tuple[int, int]:
    """(byte position, next sequence number) where a reader at ``position`` starts; ``hint`` is an
    earlier tail of the log. Raises ValueError for a position beyond the last event or naming no event."""
    offset, sequence = position.offset, position.sequence_number
    if offset == "@latest" or (offset is None and sequence is None and position.latest):
        tail = log_file.find_tail(hint)
        return tail.end, tail.next_sequence
    if offset == "-1" or (offset is None and sequence in (None, -1)):
        return 0, 0
    if sequence is not None and (isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < -1):
        raise ValueError(f"sequence number must be a whole number of at least -1, got {sequence!r}")
    where = f"hub {log_file.hub!r} partition {log_file.partition_id}"
    if offset is not None:
        if not isinstance(offset, str) or not offset.isdigit():
            raise ValueError(f"offset must be a string of digits, got {offset!r}")
        found = log_file.record_at(int(offset))
        if found is not None and sequence in (None, found[0]):
            return int(offset) + found[2], found[0] + 1
        if sequence is None:
            raise ValueError(f"{where}: no event starts at offset {offset}")
        log.info("%s: offset %s does not hold sequence number %d; scanning for it", where, offset, sequence)
    assert sequence is not None
    cursor = Cursor(log_file, 0, 0)
    cursor.read(sequence + 1, None)
    if cursor.next_sequence != sequence + 1:
        raise ValueError(
            f"{where}: cannot start after sequence number {sequence}, the last event is {cursor.next_sequence - 1}"
        )
    return cursor.pos, cursor.next_sequence


def browse(
    log_file: LogFile, start: Start, hint: Tail, drills: Drills, max_events: int, max_bytes: int, until: int | None
) -> list[Browsed]:
    """``EmbeddedHub.browse`` on ``log_file`` (closed when done): see ``workers.sources.base.Browsing``."""
    try:
        pos, next_sequence = _browse_start(log_file, start, hint)
    except BaseException:
        log_file.close()
        raise
    reader = HubReader(log_file, pos, next_sequence, drills)
    out: list[Browsed] = []
    read = 0
    try:
        while len(out) < max_events and read < max_bytes:
            if until is not None and reader.next_sequence_number > until:
                break
            events = reader.receive(1)  # one at a time: the byte bound stops the read, not a batch
            if not events:
                break
            read += len(events[0].body) + len(events[0].amqp)
            out.append(Browsed(events[0]))
    finally:
        reader.close()
    return out


def _browse_start(log_file: LogFile, start: Start, hint: Tail) -> tuple[int, int]:
    """(byte position, next sequence number) of the first event ``start`` names (inclusive)."""
    if start.offset is not None:
        if not start.offset.isdigit():
            raise ValueError(f"offset must be a string of digits, got {start.offset!r}")
        found = log_file.record_at(int(start.offset))
        if found is None:
            raise ValueError(f"partition {log_file.partition_id}: no event starts at offset {start.offset}")
        return int(start.offset), found[0]
    if start.enqueued_time is not None:
        # Enqueued times never go back within a partition: the first at or after the time is found
        # by a forward walk over the records' headers (a scan of the log, as a sequence number is).
        cursor = Cursor(log_file, 0, 0)
        while True:
            pos, sequence = cursor.pos, cursor.next_sequence
            if cursor.read(1, None) == 0 or (cursor.last_time or 0.0) >= start.enqueued_time:
                return pos, sequence
    sequence = start.sequence_number or 0
    if sequence <= 0:
        return 0, 0
    return _back_from_tail(log_file, sequence, hint) or start_of(log_file, Position.after(sequence - 1), hint)


BACK_WALK = 10_000  # records walked back from the tail at most before a scan from the start is cheaper


def _back_from_tail(log_file: LogFile, sequence: int, hint: Tail) -> tuple[int, int] | None:
    """Where event ``sequence`` starts, found by walking back from the tail through the records'
    trailing lengths (a browser's newest pages: a few reads, not a scan of the log); None when it is
    not within BACK_WALK of the tail or a record on the way is not intact."""
    tail = log_file.find_tail(hint)
    if not tail.next_sequence - BACK_WALK <= sequence < tail.next_sequence:
        return None
    pos, at = tail.end, tail.next_sequence
    while at > sequence:  # trailers only on the way: the record arrived at is checked whole
        (length,) = TRAILER.unpack(log_file.pread(TRAILER.size, pos - TRAILER.size))
        if not MIN_RECORD <= length <= min(pos, MAX_RECORD):
            return None
        pos, at = pos - length, at - 1
    found = log_file.record_at(pos)
    return (pos, at) if found is not None and found[0] == at else None
