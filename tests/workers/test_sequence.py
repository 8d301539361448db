"""workers.runtime.sequence: what a pump makes of the sequence numbers its reader hands it."""

from __future__ import annotations

import logging

import pytest

from workers.runtime.config import PumpStats
from workers.runtime.sequence import SequenceGuard
from workers.sources.base import ReceivedEvent


def events(*numbers: int) -> list[ReceivedEvent]:
    return [ReceivedEvent("7", n, str(n * 100), 0.0, None, b"{}") for n in numbers]


def test_events_of_one_read_out_of_order_are_put_back_in_order_and_none_is_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stats = PumpStats()
    guard = SequenceGuard("partition 7 (w2-0)", stats)
    guard.after(1981)
    kept = guard.contiguous(events(1982, 1984, 1983, 1985))
    assert [e.sequence_number for e in kept] == [1982, 1983, 1984, 1985]
    assert stats.gaps == 0 and guard.expected == 1986
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "out of order (1982, 1984, 1983, 1985)" in warning.getMessage()


def test_a_repeat_is_skipped_and_a_jump_still_counts_as_lost_data() -> None:
    stats = PumpStats()
    guard = SequenceGuard("partition 7", stats)
    assert [e.sequence_number for e in guard.contiguous(events(0, 1, 2))] == [0, 1, 2]
    assert [e.sequence_number for e in guard.contiguous(events(2, 3))] == [3]  # 2 again: a repeat
    assert [e.sequence_number for e in guard.contiguous(events(5, 6))] == [5, 6]  # 4 never came
    assert stats.gaps == 1 and guard.expected == 7
