"""The embedded hub: Event Hubs semantics, several processes at once, torn tails, corruption, bad input."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.hub.embedded import MAX_BODY, CorruptLog, EmbeddedHub
from workers.hub.log import MIN_RECORD, encode
from workers.sources.base import Position, ReceivedEvent

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[EmbeddedHub]:
    with EmbeddedHub(tmp_path, "sensors", partitions=4) as opened:
        yield opened


def read_all(hub: EmbeddedHub, partition_id: str, position: Position | None = None) -> list[ReceivedEvent]:
    reader = hub.reader(partition_id, position or Position.earliest())
    events: list[ReceivedEvent] = []
    while batch := reader.receive(7):  # small batches cross buffer refills
        events.extend(batch)
    reader.close()
    return events


def log_path(hub: EmbeddedHub, partition_id: str) -> Path:
    return hub.path / f"{partition_id}.log"


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
        cwd=REPO, env={**os.environ, "PYTHONHASHSEED": "12345"}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(child.stdout) == here
    assert min(Counter(here).values()) > 200  # 1000 homes over 4 partitions, roughly even
    # Pinned so a change of hash function (which would move every home) cannot pass unnoticed.
    assert (here[0], here[42], here[999]) == ("2", "3", "3")
    assert {hub.send(b"x", partition_key="home-00042").partition_id for _ in range(5)} == {"3"}


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


# -- several processes ------------------------------------------------------------------------------

WRITER = """
import sys
from pathlib import Path
from workers.hub.embedded import EmbeddedHub
root, name, me, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
hub = EmbeddedHub(Path(root), name, partitions=2)
print("ready", flush=True)
sys.stdin.readline()
i = 0
while i < n:
    # Now and then a big event, so readers meet records that are still being written.
    bodies = [f"{me}-{j}".encode() + b"." * (200_000 if j % 500 == 7 else 0) for j in range(i, min(n, i + 1 + i % 3))]
    if len(bodies) == 1:
        hub.send(bodies[0], partition_id="0")
    else:
        hub.send_batch(bodies, partition_id="0")
    i += len(bodies)
"""

READER = """
import json, sys, time
from pathlib import Path
from workers.hub.embedded import EmbeddedHub
from workers.sources.base import Position
root, name, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
reader = EmbeddedHub(Path(root), name, partitions=2).reader("0", Position.earliest())
print("ready", flush=True)
seen = []
deadline = time.monotonic() + 60
while len(seen) < total and time.monotonic() < deadline:
    got = reader.receive(500)
    seen.extend([e.sequence_number, int(e.offset), e.body.split(b".")[0].decode()] for e in got)
    if not got:
        time.sleep(0.001)
print(json.dumps(seen))
"""


def python(script: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_two_writer_processes_share_a_partition_without_duplicates_and_a_third_reads_all(tmp_path: Path) -> None:
    per_writer = 6000
    reader = python(READER, tmp_path, "h", 2 * per_writer)
    writers = [python(WRITER, tmp_path, "h", name, per_writer) for name in ("a", "b")]
    try:
        for child in (reader, *writers):
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        for writer in writers:
            assert writer.stdin is not None
            writer.stdin.write("go\n")
            writer.stdin.flush()
        for writer in writers:
            assert writer.wait(timeout=60) == 0
        out, _ = reader.communicate(timeout=60)
    finally:
        for child in (reader, *writers):
            child.kill()
            child.wait()
    seen = json.loads(out)
    assert [sequence for sequence, _, _ in seen] == list(range(2 * per_writer))
    bodies = [body for _, _, body in seen]
    assert sorted(bodies) == sorted(f"{w}-{i}" for w in "ab" for i in range(per_writer))
    for name in "ab":  # each writer's own events stay in its order
        assert [b for b in bodies if b[0] == name] == [f"{name}-{i}" for i in range(per_writer)]
    switches = sum(1 for x, y in itertools.pairwise(bodies) if x[0] != y[0])
    assert switches > 2, "the writers did not overlap, so the test proved nothing"
    hub = EmbeddedHub(tmp_path, "h")
    assert [[e.sequence_number, int(e.offset), e.body.split(b".")[0].decode()] for e in read_all(hub, "0")] == seen


def _write_after(hub: EmbeddedHub, barrier: Any, name: str, count: int) -> None:
    barrier.wait()
    for i in range(count):
        hub.send(f"{name}-{i}".encode(), partition_id="0")


def test_a_forked_child_does_not_share_its_parents_partition_lock(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, "h", partitions=1)
    hub.send(b"opened before the fork", partition_id="0")
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(2)
    child = context.Process(target=_write_after, args=(hub, barrier, "child", 3000))
    child.start()
    _write_after(hub, barrier, "parent", 3000)
    child.join(timeout=60)
    assert child.exitcode == 0
    events = read_all(EmbeddedHub(tmp_path, "h"), "0")
    assert [e.sequence_number for e in events] == list(range(6001))
    assert len({e.body for e in events}) == 6001


def test_partitions_added_while_a_reader_runs_are_seen_and_the_reader_goes_on(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, "h", partitions=2)
    reader = hub.reader("0", Position.earliest())
    before = hub.send(b"before", partition_id="0")
    assert reader.receive(10) == [before]
    other = EmbeddedHub(tmp_path, "h")  # another process, as far as the files are concerned
    other.add_partitions(5)
    assert hub.partition_ids() == ("0", "1", "2", "3", "4")
    after = other.send(b"after", partition_id="0")
    assert reader.receive(10) == [after]
    new = hub.send(b"in a new partition", partition_id="4")
    assert (new.sequence_number, read_all(other, "4")) == (0, [new])
    assert other.properties("3").is_empty
    other.add_partitions(5)  # the same count: nothing to do
    assert EmbeddedHub(tmp_path, "h", partitions=1).partition_ids() == hub.partition_ids()


# -- crashes and damage -----------------------------------------------------------------------------

TEN = [f"event {i}".encode() for i in range(10)]


def damage_cut_body(path: Path, last: ReceivedEvent) -> None:
    os.truncate(path, path.stat().st_size - 5)


def damage_cut_header(path: Path, last: ReceivedEvent) -> None:
    os.truncate(path, int(last.offset) + 10)


def damage_flip_last_record(path: Path, last: ReceivedEvent) -> None:
    data = bytearray(path.read_bytes())
    data[-8] ^= 0xFF
    path.write_bytes(bytes(data))


def damage_zeros_after_a_crash(path: Path, last: ReceivedEvent) -> None:
    os.truncate(path, int(last.offset))
    with path.open("ab") as f:
        f.write(bytes(4096))


@pytest.mark.parametrize(
    "damage", [damage_cut_body, damage_cut_header, damage_flip_last_record, damage_zeros_after_a_crash]
)
def test_a_torn_tail_is_invisible_to_readers_and_cut_by_the_next_writer(tmp_path: Path, damage: object) -> None:
    survivor = EmbeddedHub(tmp_path, "h", partitions=1)
    sent = [survivor.send(body) for body in TEN[:9]]
    sent.append(EmbeddedHub(tmp_path, "h").send(TEN[9]))  # the writer that dies in this write
    path = log_path(survivor, "0")
    damage(path, sent[-1])  # type: ignore[operator]

    hub = EmbeddedHub(tmp_path, "h")  # a process that opens the hub after the crash
    follower = hub.reader("0", Position.after(5, sent[5].offset))
    assert read_all(hub, "0") == sent[:9]
    assert follower.receive(100) == sent[6:9] and follower.receive(100) == []
    assert hub.properties("0").last_enqueued_sequence_number == 8
    assert hub.properties("0").last_enqueued_offset == sent[8].offset

    repaired = survivor.send(b"after the crash")
    assert (repaired.sequence_number, repaired.offset) == (9, sent[9].offset)
    assert follower.receive(100) == [repaired]
    assert read_all(hub, "0") == [*sent[:9], repaired]
    assert hub.send(b"and on").sequence_number == 10
    assert path.stat().st_size == int(sent[9].offset) + 2 * MIN_RECORD + len(b"after the crash") + len(b"and on")


def test_a_record_being_written_is_not_seen_until_it_is_complete(hub: EmbeddedHub) -> None:
    first = hub.send(b"first", partition_id="0")
    reader = hub.reader("0", Position.after(0, first.offset))
    record = encode(1, 1234.5, b"home-00001", b"y" * 300_000)
    written = 0
    with log_path(hub, "0").open("ab") as log:
        for cut in (7, 150_000, len(record)):  # as another process's write becomes visible
            log.write(record[written:cut])
            log.flush()
            written = cut
            complete = cut == len(record)
            assert [e.sequence_number for e in reader.receive(10)] == ([1] if complete else [])
            assert hub.properties("0").last_enqueued_sequence_number == (1 if complete else 0)


def test_a_writer_that_remembers_a_longer_log_than_is_left_rereads_it(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, "h", partitions=1)
    sent = [hub.send(body) for body in TEN]
    os.truncate(log_path(hub, "0"), int(sent[9].offset) + 7)  # cut below what this writer knows
    assert hub.send(b"again").sequence_number == 9
    assert [e.body for e in read_all(hub, "0")] == [*TEN[:9], b"again"]


def test_a_corrupt_record_in_the_middle_is_reported_with_hub_partition_and_offset(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, "h", partitions=1)
    sent = [hub.send(body) for body in TEN]
    path = log_path(hub, "0")
    data = bytearray(path.read_bytes())
    data[int(sent[1].offset) - 3] ^= 0x01  # a bit of event 0's body
    data[int(sent[4].offset) - 3] ^= 0x01  # and of event 3's
    path.write_bytes(bytes(data))
    reader = hub.reader("0", Position.earliest())
    message = f"embedded hub 'h' partition 0 is corrupt at offset {sent[0].offset}: CRC mismatch"
    with pytest.raises(CorruptLog, match=message):
        reader.receive(100)
    with pytest.raises(CorruptLog):  # still there: nothing is skipped
        reader.receive(100)
    later = hub.reader("0", Position.after(1, sent[1].offset))
    assert later.receive(100) == sent[2:3]  # the intact events before the damage come first
    with pytest.raises(CorruptLog, match=f"at offset {sent[3].offset}") as raised:
        later.receive(100)
    assert (raised.value.hub, raised.value.partition_id, raised.value.offset) == ("h", "0", int(sent[3].offset))


def test_a_damaged_length_with_intact_records_after_it_is_corruption_not_a_tail(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, "h", partitions=1)
    sent = [hub.send(body) for body in TEN]
    path = log_path(hub, "0")
    data = bytearray(path.read_bytes())
    at = int(sent[6].offset)
    data[at + 4 : at + 8] = (len(data) - at + 100).to_bytes(4, "little")  # claims to run past the end
    path.write_bytes(bytes(data))
    reader = hub.reader("0", Position.after(5, sent[5].offset))
    with pytest.raises(CorruptLog, match=f"at offset {at}: record length .* runs past intact records"):
        reader.receive(100)
    fresh = EmbeddedHub(tmp_path, "h")
    fresh.send(b"more")  # the file still ends in an intact record: nothing is cut
    assert path.stat().st_size > len(data)


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
        (lambda h: h.send(b"x", partition_key="k", partition_id="0"), ValueError, "not both"),
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
    [("sensors", 0, ValueError), ("sensors", -3, ValueError), ("sensors", "4", TypeError),
     ("sensors", True, TypeError), ("a/b", 4, ValueError), ("..", 4, ValueError), ("", 4, ValueError)],
)  # fmt: skip
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
