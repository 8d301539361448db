"""The embedded hub's log files: several processes at once, torn tails, corruption."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.hub.embedded import CorruptLog, EmbeddedHub
from workers.hub.log import MIN_RECORD, encode
from workers.sources.base import Position, ReceivedEvent

from .hubfiles import log_path, read_all

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[EmbeddedHub]:
    with EmbeddedHub(tmp_path, "sensors", partitions=4) as opened:
        yield opened


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
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


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


# The fork is the point of the test (a child forked by a worker with the log open); Python 3.12+ warns
# about any fork of a process with threads, which pytest's own machinery has.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
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
