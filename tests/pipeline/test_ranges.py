"""The counted-range dedupe (``workers.pipeline.ranges``) in plain Python against a plain reference.

A landing is a random sequence of files in the order the file source lists them: partitions'
ranges cut anyhow, landed again (a worker killed before its checkpoint, two owners after a stall,
a replay after a checkpoint reset), overlapping, out of order, with gaps (malformed events, late
files), some unreadable, some with a name that is not a range (the slow path). Batches are random
cuts of that sequence. Every distinct event of a readable file must be counted exactly once, and the
state must stay a few intervals per partition.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.pipeline import ranges

PARTITIONS = ("0", "1", "2")
EVENTS = 60  # sequence numbers 0..59 per partition


@dataclass(frozen=True)
class File:
    partition: str
    first: int
    last: int
    readable: bool
    named: bool  # False: a name that is not <first>-<last>.parquet

    def uri(self, n: int) -> str:
        name = f"{self.first:020d}-{self.last:020d}.parquet" if self.named else f"odd-{n}.parquet"
        return f"file:///landing/sensors/{self.partition}/{name}"


@st.composite
def landings(draw: st.DrawFn) -> tuple[list[File], list[int], set[tuple[str, int]]]:
    malformed = draw(st.sets(st.tuples(st.sampled_from(PARTITIONS), st.integers(0, EVENTS - 1)), max_size=8))
    files = []
    for _ in range(draw(st.integers(1, 25))):
        partition = draw(st.sampled_from(PARTITIONS))
        first = draw(st.integers(0, EVENTS - 1))
        last = draw(st.integers(first, min(first + 20, EVENTS - 1)))
        good = [n for n in range(first, last + 1) if (partition, n) not in malformed]
        if not good:
            continue  # the landing writes no file for a call of only malformed events
        readable = draw(st.booleans()) if draw(st.integers(0, 9)) == 0 else True
        named = draw(st.integers(0, 14)) != 0
        files.append(File(partition, good[0], good[-1], readable, named))  # named as the landing names it
    cuts = draw(st.lists(st.integers(1, 6), min_size=1, max_size=30))
    return files, cuts, malformed


def rows_of(f: File, malformed: set[tuple[str, int]]) -> list[tuple[str, int]]:
    return [(f.partition, n) for n in range(f.first, f.last + 1) if (f.partition, n) not in malformed]


def run(
    files: list[File], cuts: list[int], malformed: set[tuple[str, int]]
) -> tuple[list[tuple[str, int]], ranges.Ranges]:
    """The job's dedupe over the landing, batch by batch: the rows counted and the final state."""
    counted: ranges.Ranges = {}
    out: list[tuple[str, int]] = []
    listed: set[str] = set()
    arrivals = [(f.uri(n), f) for n, f in enumerate(files)]
    position, batch = 0, 0
    while position < len(arrivals):
        size = cuts[batch % len(cuts)]
        chunk = [(u, f) for u, f in arrivals[position : position + size] if u not in listed]  # a path once
        position, batch = position + size, batch + 1
        listed.update(u for u, _ in chunk)
        unique: list[tuple[str, File]] = []  # a path landed twice within a batch is listed once too (the first)
        for uri, f in chunk:
            if all(uri != u for u, _ in unique):
                unique.append((uri, f))
        uris = [u for u, _ in unique]
        bad = [u for u, f in unique if not f.readable]
        plan = ranges.plan(counted, uris, bad)
        rows = [r for u, f in unique if f.readable for r in rows_of(f, malformed)]
        kept = plan.keep(rows)
        replayed = ranges.plan(counted, uris, bad).keep(rows)  # a replay plans from the same state
        assert replayed == kept
        out.extend(kept)
        if plan.after is None:
            found: dict[str, list[ranges.Interval]] = {}  # what transforms.islands finds
            for p, n in kept:
                found.setdefault(p, []).append((n, n))
            counted = ranges.add(counted, found)
        else:
            counted = plan.after
    return out, counted


def reference(files: list[File], malformed: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """Every distinct event of a file the file source read (a path is listed once: the first landing of it)."""
    first_at: dict[str, File] = {}
    for n, f in enumerate(files):
        first_at.setdefault(f.uri(n), f)
    return {r for f in first_at.values() if f.readable for r in rows_of(f, malformed)}


@settings(max_examples=400, deadline=None)
@given(landings())
def test_every_event_of_a_readable_file_is_counted_exactly_once(
    landing: tuple[list[File], list[int], set[tuple[str, int]]],
) -> None:
    files, cuts, malformed = landing
    counted_rows, state = run(files, cuts, malformed)
    assert len(counted_rows) == len(set(counted_rows)), "an event was counted twice"
    assert set(counted_rows) == reference(files, malformed)
    for partition, intervals in state.items():
        assert intervals == ranges.merge(intervals), "the state is not sorted, disjoint intervals"
        assert all(ranges.contains(intervals, n) for p, n in counted_rows if p == partition)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PARTITIONS), st.integers(1, 30)), min_size=1, max_size=40), st.data())
def test_every_range_landed_at_least_once_leaves_one_interval_per_partition(
    calls: list[tuple[str, int]], data: st.DataObject
) -> None:
    # Consecutive handler calls per partition, some landed twice (cut differently), in a shuffled order.
    files: list[File] = []
    ends = dict.fromkeys(PARTITIONS, 0)
    for partition, length in calls:
        first = ends[partition]
        files.append(File(partition, first, first + length - 1, True, True))
        if data.draw(st.booleans()):
            again = data.draw(st.integers(max(0, first - 10), first + length - 1))
            files.append(File(partition, again, first + length - 1, True, True))
        ends[partition] = first + length
    order = data.draw(st.permutations(files))
    counted_rows, state = run(order, [data.draw(st.integers(1, 5))], set())
    assert len(counted_rows) == sum(ends.values()) == len(set(counted_rows))
    assert state == {p: [(0, end - 1)] for p, end in ends.items() if end}
    assert ranges.size(state) <= len(PARTITIONS)


def test_plan_drops_only_counted_intervals_the_batch_touches_and_dedupes_only_overlapping_files() -> None:
    counted = {"0": [(0, 99)], "1": [(0, 49), (60, 69)]}
    uri = "file:///l/h/{}/{:020d}-{:020d}.parquet".format
    plan = ranges.plan(counted, [uri("1", 40, 59), uri("2", 0, 9)])
    assert plan.exclude == {"1": [(0, 49)]}
    assert not plan.dedupe
    assert plan.after == {"0": [(0, 99)], "1": [(0, 69)], "2": [(0, 9)]}
    overlapping = ranges.plan(counted, [uri("2", 0, 9), uri("2", 5, 14)])
    assert overlapping.dedupe and overlapping.exclude == {}
    unknown = ranges.plan(counted, None)
    assert unknown.dedupe and unknown.after is None and unknown.exclude == counted
    assert ranges.loads(ranges.dumps(counted)) == counted
    assert ranges.landed_file("file:///l/h/3/x.parquet") is None
