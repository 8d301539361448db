"""Sequence numbers of one partition, as a pump receives them: repeats dropped, jumps reported.

Sequence numbers must be contiguous per partition. A jump means events were lost (retention ran
out before they were read, or a reader bug): it is logged as an error and counted in
``leaseboard_sequence_gaps_total``; processing goes on from the event that arrived. A repeat (a
reader that delivered an event twice) is skipped with a warning. Events of one read that came out
of order are put back in order first (logged as a warning): an event that arrived after a later
one would otherwise pass for a repeat and never be handled (the Event Hubs SDK's keep-alive thread
once did that: ``workers.sources.eventhubs.sdk``).
"""

from __future__ import annotations

import logging
from itertools import pairwise

import workers.metrics as metrics
from workers.runtime.config import PumpStats
from workers.sources.base import ReceivedEvent

log = logging.getLogger("leaseboard.pump")


class SequenceGuard:
    """The next sequence number one pump expects, once known (``after``, or the first event read)."""

    def __init__(self, label: str, stats: PumpStats) -> None:
        self.expected: int | None = None
        self._label = label
        self._stats = stats

    def after(self, sequence_number: int) -> None:
        """Expect the event after ``sequence_number`` next (the checkpoint the pump resumes from)."""
        self.expected = sequence_number + 1

    def contiguous(self, events: list[ReceivedEvent]) -> list[ReceivedEvent]:
        """``events`` without repeats; a jump in sequence numbers is logged and counted as lost data."""
        expected = self.expected
        if expected is not None and events:
            # The usual case, checked in C rather than event by event: exactly the next numbers.
            numbers = [event.sequence_number for event in events]
            if numbers == list(range(expected, expected + len(numbers))):
                self.expected = expected + len(numbers)
                return events
        numbers = [event.sequence_number for event in events]
        if any(later < earlier for earlier, later in pairwise(numbers)):
            log.warning(
                "%s: reader delivered sequence numbers out of order (%s); put back in order", self._label, _few(numbers)
            )
            events = sorted(events, key=lambda event: event.sequence_number)
        kept = []
        for event in events:
            expected = self.expected
            if expected is not None and event.sequence_number < expected:
                log.warning("%s: reader repeated sequence number %d; skipped", self._label, event.sequence_number)
                continue
            if expected is not None and event.sequence_number > expected:
                missing = event.sequence_number - expected
                log.error(
                    "%s: sequence numbers jump from %d to %d: %d events were never received (lost data)",
                    self._label,
                    expected - 1,
                    event.sequence_number,
                    missing,
                )
                metrics.SEQUENCE_GAPS.inc()
                self._stats.gaps += 1
            self.expected = event.sequence_number + 1
            kept.append(event)
        return kept


def _few(numbers: list[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:8])
    return shown + (f", ... ({len(numbers)} in all)" if len(numbers) > 8 else "")
