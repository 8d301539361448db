"""``EmbeddedHub.browse``: a bounded read from a sequence number, an offset or a time, inclusive, that
stops at ``until``, at the end or at the byte bound, and fails as the hub's readers do."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dashboard.dead import with_properties
from workers.hub import reader
from workers.hub.embedded import EmbeddedHub
from workers.hub.reader import ReadRefused
from workers.sources.base import Start


def numbers(
    hub: EmbeddedHub, start: Start, most: int = 100, budget: int = 1 << 20, until: int | None = None
) -> list[int]:
    return [b.event.sequence_number for b in hub.browse("0", start, most, budget, until=until)]


def test_a_browse_starts_at_the_event_named_and_stops_at_until_the_end_or_the_bound(tmp_path: Path) -> None:
    times = iter(float(t) for t in range(1000, 1010))
    with EmbeddedHub(tmp_path, "h", partitions=1, clock=lambda: next(times)) as hub:
        sent = [hub.send(b"x" * 10, partition_id="0") for _ in range(10)]  # enqueued at 1000, 1001, ...
        assert numbers(hub, Start(sequence_number=0)) == list(range(10))
        assert numbers(hub, Start(sequence_number=4), most=3) == [4, 5, 6]
        assert numbers(hub, Start(sequence_number=4), until=5) == [4, 5]
        assert numbers(hub, Start(sequence_number=10)) == []
        assert numbers(hub, Start(offset=sent[7].offset)) == [7, 8, 9]
        assert numbers(hub, Start(enqueued_time=1002.5)) == list(range(3, 10))
        assert numbers(hub, Start(enqueued_time=1003.0)) == list(range(3, 10))
        assert numbers(hub, Start(enqueued_time=2000.0)) == []
        assert numbers(hub, Start(sequence_number=0), budget=25) == [0, 1, 2]  # the third crossed 25 bytes
        assert all(b.properties is None for b in hub.browse("0", Start(), 2, 100))


def test_a_browse_refuses_what_names_no_event_and_fails_as_a_refused_read(tmp_path: Path) -> None:
    with EmbeddedHub(tmp_path, "h", partitions=2) as hub:
        hub.send_batch([b"a", b"b"], partition_id="0")
        with pytest.raises(ValueError, match="no event starts at offset 1"):
            hub.browse("0", Start(offset="1"), 5, 100)
        with pytest.raises(ValueError, match="cannot start after sequence number 4"):
            hub.browse("0", Start(sequence_number=5), 5, 100)
        with pytest.raises(ValueError, match="has no partition '2'"):
            hub.browse("2", Start(), 5, 100)
        hub.refuse("0")
        with pytest.raises(ReadRefused):
            hub.browse("0", Start(), 5, 100)
        hub.admit("0")
        assert [b.event.body for b in hub.browse("0", Start(), 5, 100)] == [b"a", b"b"]


@pytest.mark.parametrize("back_walk", [0, 3, 10_000])
def test_the_walk_back_from_the_tail_and_the_scan_from_the_start_find_the_same_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, back_walk: int
) -> None:
    monkeypatch.setattr(reader, "BACK_WALK", back_walk)
    with EmbeddedHub(tmp_path, "h", partitions=1) as hub:
        bodies = [bytes([i]) * (1 + 37 * i) for i in range(12)]
        amqp = [with_properties(b, {"i": i}) if i % 3 == 0 else b"" for i, b in enumerate(bodies)]
        hub.send_batch(bodies, partition_id="0", amqp=amqp)  # both record formats, of many sizes
        for first in range(12):
            got = hub.browse("0", Start(sequence_number=first), 100, 1 << 20)
            assert [b.event.body for b in got] == bodies[first:]
            assert [b.event.sequence_number for b in got] == list(range(first, 12))
