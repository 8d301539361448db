"""The embedded hub: Event Hubs semantics, positions, bad input (``test_hub_log.py``: several
processes at once, torn tails, corruption)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.hub.embedded import MAX_BODY, EmbeddedHub
from workers.hub.reader import ReadRefused
from workers.sources.base import Position, ReceivedEvent

from .hubfiles import read_all

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[EmbeddedHub]:
    with EmbeddedHub(tmp_path, "sensors", partitions=4) as opened:
        yield opened


# -- semantics ---------------------------------------------------------------------------------------


def test_a_new_hub_has_the_asked_partitions_and_an_existing_one_keeps_its_count(tmp_path: Path) -> None:
    assert EmbeddedHub(tmp_path, "h", partitions=3).partition_ids() == ("0", "1", "2")
    assert EmbeddedHub(tmp_path, "h", partitions=16).partition_ids() == ("0", "1", "2")
    assert EmbeddedHub.exists(tmp_path, "h") and not EmbeddedHub.exists(tmp_path, "other")


def test_sequence_numbers_are_contiguous_per_partition_and_offsets_match_the_reads(hub: EmbeddedHub) -> None:
    sent: dict[str, list[ReceivedEvent]] = {}
    for i in range(300):
        event = hub.send(f"event {i}".encode() * (i % 5), partition_key=f"home-{i % 37:05d}")
        sent.setdefault(event.partition_id, []).append(event)
    for batch_size in (1, 5, 50):
        for event in hub.send_batch([b"b"] * batch_size, partition_key="home-00001"):
            sent.setdefault(event.partition_id, []).append(event)
    assert len(sent) == 4
    for pid, events in sent.items():
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert read_all(hub, pid) == events
        properties = hub.properties(pid)
        assert properties.last_enqueued_sequence_number == len(events) - 1
        assert properties.last_enqueued_offset == events[-1].offset
        assert properties.last_enqueued_time == events[-1].enqueued_time
        assert not properties.is_empty


def test_a_batch_lands_in_one_partition_with_contiguous_numbers(hub: EmbeddedHub) -> None:
    hub.send(b"first", partition_id="2")
    batch = hub.send_batch([b"a", b"b", b"c"], partition_id="2")
    assert [(e.partition_id, e.sequence_number) for e in batch] == [("2", 1), ("2", 2), ("2", 3)]
    assert [e.body for e in read_all(hub, "2")] == [b"first", b"a", b"b", b"c"]
    assert hub.send_batch([], partition_id="2") == []


def test_an_empty_partition_says_so(hub: EmbeddedHub) -> None:
    properties = hub.properties("3")
    assert properties.is_empty and properties.begin_sequence_number == 0
    assert properties.last_enqueued_sequence_number == -1
    assert properties.last_enqueued_offset is None and properties.last_enqueued_time is None
    assert hub.reader("3", Position(latest=True)).receive(10) == []


def test_keys_map_to_partitions_stably_across_processes_and_spread_over_all(hub: EmbeddedHub) -> None:
    homes = [f"home-{i:05d}" for i in range(1000)]
    here = [hub.partition_for_key(home) for home in homes]
    script = (
        "import json, sys; from pathlib import Path; from workers.hub.embedded import EmbeddedHub;"
        "hub = EmbeddedHub(Path(sys.argv[1]), 'sensors');"
        "print(json.dumps([hub.partition_for_key(f'home-{i:05d}') for i in range(1000)]))"
    )
    child = subprocess.run(
        [sys.executable, "-c", script, str(hub.path.parent)],
        cwd=REPO,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(child.stdout) == here
    assert min(Counter(here).values()) > 200  # 1000 homes over 4 partitions, roughly even
    # Pinned so a change of hash function (which would move every home) cannot pass unnoticed.
    assert (here[0], here[42], here[999]) == ("2", "2", "2")
    assert {hub.send(b"x", partition_key="home-00042").partition_id for _ in range(5)} == {"2"}


def test_a_key_with_a_partition_id_goes_to_that_partition_and_is_kept(hub: EmbeddedHub) -> None:
    other = str((int(hub.partition_for_key("k")) + 1) % 4)
    event = hub.send(b"x", partition_key="k", partition_id=other)
    assert (event.partition_id, event.partition_key) == (other, "k")
    assert [(e.partition_key, e.body) for e in read_all(hub, other)] == [("k", b"x")]


def test_neither_key_nor_id_goes_round_robin(hub: EmbeddedHub) -> None:
    assert [hub.send(b"x").partition_id for _ in range(6)] == ["0", "1", "2", "3", "0", "1"]
    assert hub.send(b"x", partition_key=None, partition_id=None).partition_key is None


def test_enqueued_time_is_the_hub_clock_and_never_goes_back_in_a_partition(tmp_path: Path) -> None:
    times = iter([1000.0, 1010.0, 990.0])
    hub = EmbeddedHub(tmp_path, "h", partitions=1, clock=lambda: next(times))
    assert [hub.send(b"x").enqueued_time for _ in range(3)] == [1000.0, 1010.0, 1010.0]
    assert [e.enqueued_time for e in read_all(hub, "0")] == [1000.0, 1010.0, 1010.0]


def test_keys_and_bodies_come_back_as_sent(hub: EmbeddedHub) -> None:
    body = bytes(range(256)) * 3
    sent = hub.send(body, partition_key="maison-à-Zürich")
    other = hub.send(b"", partition_id=sent.partition_id)
    received = read_all(hub, sent.partition_id)
    assert received == [sent, other]
    assert received[0].partition_key == "maison-à-Zürich" and received[1].partition_key is None


# -- positions --------------------------------------------------------------------------------------


@pytest.fixture
def twenty(hub: EmbeddedHub) -> list[ReceivedEvent]:
    return [hub.send(f"event {i}".encode(), partition_id="1") for i in range(20)]


def test_reading_after_a_sequence_and_offset_resumes_right_after_it(
    hub: EmbeddedHub, twenty: list[ReceivedEvent]
) -> None:
    assert read_all(hub, "1", Position.after(7, twenty[7].offset)) == twenty[8:]
    assert read_all(hub, "1", Position.after(0, twenty[0].offset)) == twenty[1:]
    assert read_all(hub, "1", Position.after(19, twenty[19].offset)) == []


def test_a_stale_offset_falls_back_to_the_sequence_number(hub: EmbeddedHub, twenty: list[ReceivedEvent]) -> None:
    assert read_all(hub, "1", Position.after(7, twenty[3].offset)) == twenty[8:]  # another event's offset
    assert read_all(hub, "1", Position.after(7, "5")) == twenty[8:]  # not a record boundary
    assert read_all(hub, "1", Position.after(7, "999999")) == twenty[8:]  # past the end
    assert read_all(hub, "1", Position.after(7)) == twenty[8:]
    assert read_all(hub, "1", Position(offset=twenty[7].offset)) == twenty[8:]


def test_a_position_beyond_the_end_or_at_no_event_is_refused(hub: EmbeddedHub, twenty: list[ReceivedEvent]) -> None:
    with pytest.raises(ValueError, match="cannot start after sequence number 20, the last event is 19"):
        hub.reader("1", Position.after(20, twenty[19].offset))
    with pytest.raises(ValueError, match="no event starts at offset 5"):
        hub.reader("1", Position(offset="5"))
    with pytest.raises(ValueError, match="offset must be a string of digits"):
        hub.reader("1", Position(offset="abc"))
    with pytest.raises(ValueError, match="at least -1"):
        hub.reader("1", Position.after(-2))


def test_earliest_reads_from_zero_and_latest_only_new_events(hub: EmbeddedHub, twenty: list[ReceivedEvent]) -> None:
    assert read_all(hub, "1", Position.earliest()) == twenty
    assert read_all(hub, "1", Position(offset="-1")) == twenty  # Event Hubs' "start of stream"
    assert read_all(hub, "1", Position.after(-1)) == twenty
    latest = hub.reader("1", Position(latest=True))
    at_latest = hub.reader("1", Position(offset="@latest"))
    assert latest.receive(100) == [] and at_latest.receive(100) == []
    new = hub.send(b"new", partition_id="1")
    assert latest.receive(100) == [new] and at_latest.receive(100) == [new]


def test_a_reader_follows_the_log_as_it_grows(hub: EmbeddedHub) -> None:
    reader = hub.reader("0", Position.earliest())
    seen: list[ReceivedEvent] = []
    for round_ in range(5):
        sent = hub.send_batch([f"{round_}-{i}".encode() for i in range(round_ * 3 + 1)], partition_id="0")
        seen.extend(reader.receive(1000))
        assert seen[-1] == sent[-1]
    assert [e.sequence_number for e in seen] == list(range(len(seen)))


# -- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda h: h.send(b"x", partition_id="4"), ValueError, r"no partition '4'; its ids are '0'..'3'"),
        (lambda h: h.send(b"x", partition_id="01"), ValueError, "no partition '01'"),
        (lambda h: h.send(b"x", partition_id="-1"), ValueError, "no partition '-1'"),
        (lambda h: h.send(b"x", partition_id=1), TypeError, "partition ids are strings"),
        (lambda h: h.reader("9", Position.earliest()), ValueError, "no partition '9'"),
        (lambda h: h.reader("0", 5), TypeError, "position must be a workers.sources.base.Position"),
        (lambda h: h.properties("x"), ValueError, "no partition 'x'"),
        (lambda h: h.send("text"), TypeError, r"got str; encode it first"),
        (lambda h: h.send(42), TypeError, "event bodies are bytes, got int"),
        (lambda h: h.send_batch([b"ok", None]), TypeError, "got NoneType"),
        (lambda h: h.send_batch(b"abc"), TypeError, "sequence of bodies"),
        (lambda h: h.send(b"x" * (MAX_BODY + 1)), ValueError, "over the limit of 1048576"),
        (lambda h: h.send(b"x", partition_key=7), TypeError, "partition_key must be a string"),
        (lambda h: h.send(b"x", partition_key="k" * 257), ValueError, "partition_key is 257 bytes"),
        (lambda h: h.add_partitions(3), ValueError, "has 4 partitions; partitions can be added, never removed"),
        (lambda h: h.add_partitions(0), ValueError, "between 1 and 100000"),
        (lambda h: h.add_partitions(5.0), TypeError, "whole number"),
        (lambda h: h.reader("0", Position.earliest()).receive(0), ValueError, "max_events"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(
    hub: EmbeddedHub, call: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        call(hub)  # type: ignore[operator]
    assert all(hub.properties(pid).is_empty for pid in hub.partition_ids())
    assert hub.partition_ids() == ("0", "1", "2", "3")


@pytest.mark.parametrize(
    ("name", "partitions", "error"),
    [
        ("sensors", 0, ValueError),
        ("sensors", -3, ValueError),
        ("sensors", "4", TypeError),
        ("sensors", True, TypeError),
        ("a/b", 4, ValueError),
        ("..", 4, ValueError),
        ("", 4, ValueError),
    ],
)
def test_a_bad_name_or_partition_count_is_refused(tmp_path: Path, name: str, partitions: int, error: type) -> None:
    with pytest.raises(error):
        EmbeddedHub(tmp_path, name, partitions=partitions)
    assert list(tmp_path.iterdir()) == []


def test_a_body_of_exactly_the_limit_is_accepted(hub: EmbeddedHub) -> None:
    event = hub.send(b"x" * MAX_BODY, partition_id="0")
    assert read_all(hub, "0") == [event]


def test_a_closed_reader_refuses_to_receive(hub: EmbeddedHub) -> None:
    reader = hub.reader("0", Position.earliest())
    reader.close()
    with pytest.raises(ValueError, match="closed"):
        reader.receive(1)


def test_a_wedged_partition_s_open_readers_give_nothing_and_new_ones_read(hub: EmbeddedHub) -> None:
    # The fault drill of the chaos suite's "wedged-reader": the hub stops answering the links open now.
    hub.send(b'{"n": 0}', partition_id="2")
    before, other = hub.reader("2", Position.earliest()), hub.reader("1", Position.earliest())
    assert [e.sequence_number for e in before.receive(10)] == [0]
    hub.wedge("2")
    hub.send(b'{"n": 1}', partition_id="2")
    hub.send(b'{"n": 2}', partition_id="1")
    assert before.receive(10) == [] and before.nothing_new()  # open before: silent, not failing
    assert [e.sequence_number for e in other.receive(10)] == [0]  # another partition reads as always
    after = hub.reader("2", Position.after(0))
    assert [e.sequence_number for e in after.receive(10)] == [1] and after.nothing_new()
    hub.unwedge("2")
    assert [e.sequence_number for e in before.receive(10)] == [1]  # answering again, where it was
    with pytest.raises(ValueError, match="partition"):
        hub.wedge("9")
    for reader in (before, other, after):
        reader.close()


def test_a_refused_partition_fails_every_read_in_the_process_it_names_until_admitted(hub: EmbeddedHub) -> None:
    # The fault drill of the chaos suite's "failing-reader": one worker's link to a partition keeps failing.
    hub.send(b'{"n": 0}', partition_id="2")
    open_before = hub.reader("2", Position.earliest())
    hub.refuse("2", os.getpid())
    with pytest.raises(ReadRefused, match="partition 2"):
        open_before.receive(10)
    assert not open_before.nothing_new()  # a refused reader reads (and fails), it does not sit idle
    opened_after = hub.reader("2", Position.earliest())
    with pytest.raises(ReadRefused):
        opened_after.receive(10)
    other = hub.reader("1", Position.earliest())
    assert other.receive(10) == []  # another partition reads as always
    hub.refuse("2", os.getpid() + 1)  # another process's link: this one reads
    assert [e.sequence_number for e in open_before.receive(10)] == [0]
    hub.refuse("2")  # every process
    with pytest.raises(ReadRefused):
        opened_after.receive(10)
    hub.admit("2")
    assert [e.sequence_number for e in opened_after.receive(10)] == [0]
    hub.admit("2")  # admitting twice is harmless
    with pytest.raises(ValueError, match="partition"):
        hub.refuse("9")
    for reader in (open_before, opened_after, other):
        reader.close()
