"""When the checkpointed event of a partition was enqueued: the other half of lag in seconds.

A checkpoint holds a sequence number and an offset, not a time, so the time is read from the
source and remembered per partition. Reads go forward from the last event found: ``Position.after
(known, its offset)`` is a seek on the embedded hub and an offset position on Event Hubs, and what
is read between two samples is what the workers checkpointed in between. Only the first read of a
partition, or one after a checkpoint went backwards, starts from a sequence number (a scan from
the start of the log on the embedded hub; a sequence position on Event Hubs).

Every call runs on a thread (the readers are synchronous) and is bounded by ``budget`` seconds per
round: what is not found in time keeps its last value and is tried again next round.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from workers.sources.base import EventSource, Position, ReceivedEvent

log = logging.getLogger(__name__)

READ_BATCH = 500
EMPTY_READS = 20  # a source that delivers in the background (Event Hubs) may return nothing at first


@dataclass(frozen=True, slots=True)
class Found:
    sequence_number: int
    offset: str
    enqueued_time: float


class EnqueuedTimes:
    """Remembers, per partition, the enqueued time of the last event looked up."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._known: dict[str, Found] = {}
        self._first: dict[str, Found] = {}  # the first retained event, asked for as sequence number -1
        self._clock = clock

    def cached(self, partition_id: str, sequence_number: int) -> float | None:
        """The remembered enqueued time of event ``sequence_number`` (-1: the first retained one)."""
        if sequence_number < 0:
            first = self._first.get(partition_id)
            return first.enqueued_time if first is not None else None
        found = self._known.get(partition_id)
        return found.enqueued_time if found is not None and found.sequence_number == sequence_number else None

    def lookup(self, source: EventSource, wanted: dict[str, int], budget: float) -> dict[str, float]:
        """Enqueued times of ``wanted`` (partition id -> sequence number, or -1 for the first retained
        event) found within ``budget`` seconds.

        A partition whose event cannot be read (retention removed it, the source failed) is left
        out; the failure is logged at DEBUG, it is an ordinary state of a live hub.
        """
        deadline = self._clock() + budget
        out: dict[str, float] = {}
        for pid, sequence in wanted.items():
            hit = self.cached(pid, sequence)
            if hit is not None:
                out[pid] = hit
                continue
            if self._clock() > deadline:
                continue
            try:
                event = self._read(source, pid, sequence)
            except Exception as exc:  # a foreign system: whatever it raises, the lag in events still shows
                log.debug("enqueued time of partition %s event %d unavailable: %s", pid, sequence, exc)
                continue
            if event is not None:
                self._remember(pid, sequence, event)
                out[pid] = event.enqueued_time
        return out

    def event(self, source: EventSource, partition_id: str, sequence_number: int) -> ReceivedEvent | None:
        """The event ``sequence_number`` of a partition (None if it is not there), remembered."""
        event = self._read(source, partition_id, sequence_number)
        if event is not None:
            self._remember(partition_id, sequence_number, event)
        return event

    def forget(self, partition_id: str) -> None:
        self._known.pop(partition_id, None)
        self._first.pop(partition_id, None)

    def _remember(self, pid: str, asked: int, event: ReceivedEvent) -> None:
        found = Found(event.sequence_number, event.offset, event.enqueued_time)
        if asked < 0:
            self._first[pid] = found
        else:
            self._known[pid] = found

    def _read(self, source: EventSource, pid: str, sequence: int) -> ReceivedEvent | None:
        known = self._known.get(pid)
        if sequence < 0:
            start = Position.earliest()
        elif known is not None and known.sequence_number < sequence:
            start = Position.after(known.sequence_number, known.offset)
        else:
            start = Position.after(sequence - 1) if sequence > 0 else Position.earliest()
        reader = source.reader(pid, start)
        try:
            empty = 0
            while empty < EMPTY_READS:
                events = reader.receive(READ_BATCH)
                if not events:
                    empty += 1
                    time.sleep(0.005 * empty)
                    continue
                empty = 0
                for event in events:
                    if sequence < 0 or event.sequence_number == sequence:
                        return event
                    if event.sequence_number > sequence:
                        return None  # retention removed it
        finally:
            reader.close()
        return None
