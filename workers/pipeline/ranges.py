"""Exactly-once counting with state O(partitions): per partition, the sequence ranges already counted.

Sequence numbers are contiguous per partition, and the landing names each file by its partition and
the sequence range of the handler call that wrote it (``<partition>/<first>-<last>.parquet``,
``workers.landing``): the file holds every well-formed event of that range (a malformed one is set
aside, and would be again). So once a file is counted, every event of its range is counted, and the
pipeline's state is, per partition, the union of the ranges of the files counted so far: one interval
per partition in the steady state, a few more while a late file leaves a gap. Not a key per event.

Per micro-batch, from the file names alone (no Spark work): ``plan`` says which counted intervals
the batch's files touch (their rows are dropped), whether the batch's own files overlap each other
(then its rows are deduplicated by key), and what the counted ranges are after the batch. The job
commits those in the same database transaction as the batch's summary (``summary.apply``), so a
replayed batch is planned again from the same state and drops the same rows.

Every way a duplicate arrives is a file whose range meets a counted range or another file of its
batch: a worker killed before its checkpoint (the next owner lands the range again, maybe cut
differently), a file landed again with another range, a checkpoint reset by an operator (a replay
of old ranges), two owners after a stall (both land), late or out-of-order files (a gap that the
late file fills). A file whose name is not a landing range (or a batch whose file list cannot be
read) makes the batch fall back to the exact slow path: every counted interval is excluded, rows
are deduplicated by key and the batch's ranges come from its data (``transforms.islands``).

Pure Python: the property tests run it against a plain reference without Spark.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import unquote, urlparse

Interval = tuple[int, int]  # first and last sequence number, both included
Ranges = dict[str, list[Interval]]  # partition id -> sorted, disjoint, non-adjacent intervals


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """``intervals`` as sorted, disjoint intervals; touching ones (5-9 and 10-12) become one."""
    out: list[Interval] = []
    for first, last in sorted(intervals):
        if out and first <= out[-1][1] + 1:
            if last > out[-1][1]:
                out[-1] = (out[-1][0], last)
        else:
            out.append((first, last))
    return out


def add(counted: Mapping[str, Sequence[Interval]], more: Mapping[str, Iterable[Interval]]) -> Ranges:
    """The union of two range tables."""
    out = {p: list(v) for p, v in counted.items()}
    for partition, intervals in more.items():
        out[partition] = merge([*out.get(partition, []), *intervals])
    return {p: v for p, v in out.items() if v}


def touching(intervals: Sequence[Interval], first: int, last: int) -> list[Interval]:
    """The intervals of sorted, disjoint ``intervals`` that share a number with first..last."""
    start = bisect.bisect_left(intervals, (first, first))
    if start and intervals[start - 1][1] >= first:
        start -= 1
    out = []
    for interval in intervals[start:]:
        if interval[0] > last:
            break
        if interval[1] >= first:
            out.append(interval)
    return out


def contains(intervals: Sequence[Interval], number: int) -> bool:
    return bool(touching(intervals, number, number))


def size(counted: Mapping[str, Sequence[Interval]]) -> int:
    """Intervals in the table: the state's size."""
    return sum(len(v) for v in counted.values())


def covered(counted: Mapping[str, Sequence[Interval]]) -> int:
    """Sequence numbers the table covers."""
    return sum(last - first + 1 for v in counted.values() for first, last in v)


def dumps(counted: Mapping[str, Sequence[Interval]]) -> str:
    return json.dumps({p: [list(i) for i in v] for p, v in sorted(counted.items())}, separators=(",", ":"))


def loads(text: str) -> Ranges:
    return {str(p): [(int(a), int(b)) for a, b in v] for p, v in json.loads(text).items()}


@dataclass(frozen=True, slots=True)
class LandedFile:
    partition: str
    first: int
    last: int


def landed_file(uri: str) -> LandedFile | None:
    """The partition and range a landing file's path names (``.../<partition>/<first>-<last>.parquet``)."""
    path = PurePosixPath(unquote(urlparse(uri).path))
    first, sep, last = path.name.removesuffix(".parquet").partition("-")
    if not path.name.endswith(".parquet") or not sep or not first.isdigit() or not last.isdigit():
        return None
    if int(first) > int(last) or not path.parent.name:
        return None
    return LandedFile(path.parent.name, int(first), int(last))


@dataclass(frozen=True, slots=True)
class Plan:
    """What a batch does about duplicates (see the module's docstring)."""

    exclude: Ranges  # counted intervals: rows inside them were counted by an earlier batch
    dedupe: bool  # rows may repeat within the batch: keep one per (partition, sequence number)
    after: Ranges | None  # the counted ranges once this batch is counted; None: add the batch's data islands

    def keep(self, rows: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        """The rows (partition, sequence number) of the batch that get counted, in order (the reference
        semantics of ``transforms.drop_counted`` plus the dedupe)."""
        out, seen = [], set()
        for partition, number in rows:
            if contains(self.exclude.get(partition, []), number):
                continue
            if self.dedupe:
                if (partition, number) in seen:
                    continue
                seen.add((partition, number))
            out.append((partition, number))
        return out


def plan(
    counted: Mapping[str, Sequence[Interval]], files: Sequence[str] | None, unreadable: Iterable[str] = ()
) -> Plan:
    """The plan of a batch of ``files`` (URIs; None if unknown) given the ``counted`` ranges. Files in
    ``unreadable`` (paths or URIs Spark skips) add no range: their events are not counted."""
    named = [landed_file(uri) for uri in files] if files is not None else None
    if named is None or any(f is None for f in named):
        return Plan({p: list(v) for p, v in counted.items() if v}, True, None)
    bad = {str(PurePosixPath(unquote(urlparse(u).path))) for u in unreadable}
    good = [
        f
        for f, uri in zip(named, files or [], strict=True)
        if f is not None and str(PurePosixPath(unquote(urlparse(uri).path))) not in bad
    ]
    exclude: dict[str, set[Interval]] = {}
    by_partition: dict[str, list[Interval]] = {}
    for f in good:
        hits = touching(counted.get(f.partition, []), f.first, f.last)
        if hits:
            exclude.setdefault(f.partition, set()).update(hits)
        by_partition.setdefault(f.partition, []).append((f.first, f.last))
    dedupe = any(_overlap(v) for v in by_partition.values())
    return Plan({p: sorted(v) for p, v in exclude.items()}, dedupe, add(counted, by_partition))


def _overlap(intervals: list[Interval]) -> bool:
    ordered = sorted(intervals)
    return any(b[0] <= a[1] for a, b in itertools.pairwise(ordered))
