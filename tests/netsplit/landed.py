"""What the landing files prove, judged against the store's history (issue 19, item 3).

The landing files are records the workers cannot change after the fact: each names its writer (owner
and tenure, in its Parquet metadata), holds the sequence numbers it landed, and carries the time the
kernel stamped as it was written (``st_mtime``, the machine's wall clock, which is the stores' clock
here). ``landing.read_landing`` reads them; the rules:

- ``unsigned``: every file names a writer of the fleet.
- ``landed_outside``: every file was written inside a tenure the store's history gives its writer on
  that partition (``history.tenures``), to within the history's resolution and ``slack``: so no
  worker landed a partition's events while another held its lease.
- ``stale_pumps``: no writer's tenure (one pump) lands on both sides of another owner's lease on
  that partition (a pump that outlived its partition's loss, its owner having claimed it back).
- ``lost``: every event produced (and not set aside as malformed) is in a landing file.
- ``duplicates``: an event in the files of two writers was processed twice. Each must have a cause:
  a fault that struck its first writer (a cut from the store, a kill or a stop, never a planned move),
  with the first file written before the heal, the second after the cut began, and no checkpoint
  covering the event in the store's history before the cut began (so the first writer was cut off
  after processing it and before its checkpoint). A handoff taken over after its timeout is a moment,
  not a span: its owner, too slow to hand over, still holds its lease and goes on until that runs
  out, so its first file may come up to one ``expiry`` after the steal (as the chaos checker's rule
  4 allows for every fault). A lease its owner did not renew in time (an ``expire`` in the event log:
  its store requests hung on a starved machine) is a cause too, the first file before the expiry. One
  without a cause, or an event landed twice by
  one writer, fails the run.

``per_nemesis`` gives the figures of each phase: events produced, lost, processed twice (counted
against the fault that caused them), the longest time any partition went without an event
processed, the longest overlap of two leases in the store's history (0 but for a steal, whose new owner is fenced) and
the time to balance after the heal.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

from tests.chaos.evidence import EXPIRED, TAKEN_OVER, Fault, Handling, Phase
from tests.netsplit.history import History, Tenure, by_partition, clock, tenures
from tests.netsplit.landing import LandedFile

# Faults that can cut a worker off after processing and before its checkpoint: a cut from the store
# (alone, with everything, the store from everyone, flapping, with a stop), a kill or a stop, or a
# handoff taken over after its timeout or a lease that ran out unrenewed (``evidence.taken_over``: the
# owner too slow to hand over or to renew).
CAUSES = frozenset(
    {"cut-store", "isolated", "store-cut", "flapping", "cut-store+sigstop", "sigkill", "sigstop", TAKEN_OVER, EXPIRED}
)


@dataclass(frozen=True, slots=True)
class Duplicate:
    partition: str
    sequence: int
    first: LandedFile
    again: LandedFile
    cause: Fault | None


def unsigned(files: Iterable[LandedFile], owners: Iterable[str]) -> list[str]:
    """Files naming no writer, or a writer outside the fleet (``owners``)."""
    fleet = set(owners)
    problems = []
    for f in files:
        if not f.owner or not f.tenure:
            problems.append(f"landing: {f.partition}/{f.name} names no writer")
        elif f.owner not in fleet:
            problems.append(f"landing: {f.partition}/{f.name} names writer {f.owner!r}, no worker of the fleet")
    return problems


def _tenures(history: History, expiry: float) -> dict[tuple[str, str], list[Tenure]]:
    out: dict[tuple[str, str], list[Tenure]] = {}
    for writes in by_partition(history.writes).values():
        for tenure in tenures(writes, expiry, history.late_ends):
            out.setdefault((tenure.partition, tenure.owner), []).append(tenure)
    return out


def landed_outside(history: History, files: Iterable[LandedFile], expiry: float, slack: float = 0.0) -> list[str]:
    """Files written outside every tenure the store's history gives their writer on their partition."""
    held = _tenures(history, expiry)
    allowed = history.resolution + slack
    problems = []
    for f in sorted(files, key=lambda f: (f.partition, f.written)):
        own = held.get((f.partition, f.owner), [])
        if any(t.began(history) - allowed <= f.written <= t.end + allowed for t in own):
            continue
        near = min(own, key=lambda t: min(abs(t.start - f.written), abs(t.end - f.written)), default=None)
        where = (
            f"its nearest tenure there ran {clock(near.start)} to {clock(near.end)}"
            if near
            else "the store never gave it that partition"
        )
        problems.append(
            f"landing: {f.owner} wrote {f.partition}/{f.name} (sequence {min(f.sequences)}..{max(f.sequences)}) at "
            f"{clock(f.written)}, outside every lease the store gave it there ({where}; allowed {allowed:g}s)"
        )
    return problems


def stale_pumps(history: History, files: Iterable[LandedFile], expiry: float, slack: float = 0.0) -> list[str]:
    """Writers (owner and tenure token: one pump) whose files on a partition straddle another owner's
    tenure there: a pump that went on after its partition was taken, from a stale position, even if its
    owner claimed the partition back meanwhile. (A file written inside the other's tenure is
    ``landed_outside``'s; this finds the pump whose files are each inside a lease of its owner.)"""
    allowed = history.resolution + slack
    per = {pid: tenures(writes, expiry, history.late_ends) for pid, writes in by_partition(history.writes).items()}
    spans: dict[tuple[str, str, str], list[int]] = {}
    for f in files:
        found = per.get(f.partition, [])
        inside = [
            i
            for i, t in enumerate(found)
            if t.owner == f.owner and t.began(history) - allowed <= f.written <= t.end + allowed
        ]
        if inside:
            # The latest of them: a lease taken from its owner runs on, by the rule, until its last
            # renewal would have expired, so the owner's next tenure (it took the partition back
            # meanwhile) can begin inside it; a new pump's first file there is that tenure's.
            spans.setdefault((f.partition, f.owner, f.tenure), []).append(max(inside))
    problems = []
    for (pid, owner, token), indices in sorted(spans.items(), key=lambda kv: (_key(kv[0][0]), kv[0][1:])):
        found = per[pid]
        between = [t for t in found[min(indices) : max(indices) + 1] if t.owner != owner]
        if between:
            other, first, last = between[0], found[min(indices)], found[max(indices)]
            problems.append(
                f"landing: partition {pid}: {owner} landed with one pump (tenure {token}) from {clock(first.start)} "
                f"to {clock(last.end)}, across the lease of {other.owner} ({clock(other.start)} to "
                f"{clock(other.end)}): a pump that went on after its partition was taken"
            )
    return problems


def lost(
    produced: Mapping[str, Sequence[object]], dead: set[tuple[str, int]], files: Iterable[LandedFile]
) -> list[str]:
    """Per partition, the events produced (sequence = index in ``produced``) that no file holds and
    that were not set aside (``dead``), as ranges."""
    landed: dict[str, set[int]] = {}
    for f in files:
        landed.setdefault(f.partition, set()).update(f.sequences)
    problems = []
    for pid, events in sorted(produced.items()):
        missing = [s for s in range(len(events)) if s not in landed.get(pid, set()) and (pid, s) not in dead]
        if missing:
            problems.append(f"landing: partition {pid}: {len(missing)} events never landed: {_ranges(missing)}")
    return problems


def _ranges(numbers: list[int]) -> str:
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    shown = ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in runs[:8])
    return shown + (f" and {len(runs) - 8} more runs" if len(runs) > 8 else "")


def duplicates(
    files: Iterable[LandedFile],
    faults: Iterable[Fault],
    history: History,
    offset: float,
    slack: float = 0.0,
    expiry: float = 0.0,
) -> tuple[list[Duplicate], list[str]]:
    """Every event landed by more than one writer, each with its cause (None: no fault explains it),
    and the problems: a duplicate without a cause, an event landed twice by one writer.

    ``offset`` puts the faults' monotonic times on the files' and the store's clock (wall = monotonic +
    offset); ``slack`` is allowed on each comparison (the error of ``offset``, the sampling of a fault)."""
    holders: dict[tuple[str, int], list[LandedFile]] = {}
    for f in files:
        for sequence in f.sequences:
            holders.setdefault((f.partition, sequence), []).append(f)
    points: dict[str, list[tuple[float, int]]] = {}
    for point in history.checkpoints:
        points.setdefault(point.partition, []).append((point.at, point.sequence))
    covered_by: dict[str, tuple[list[float], list[int]]] = {}
    for pid, found in points.items():
        found.sort()
        highest, running = [], -1
        for _, sequence in found:
            running = max(running, sequence)
            highest.append(running)
        covered_by[pid] = ([at for at, _ in found], highest)
    causes = sorted((f for f in faults if not f.planned and f.kind in CAUSES), key=lambda f: f.started)

    def checkpointed_before(pid: str, sequence: int, at: float) -> bool:
        times, highest = covered_by.get(pid, ([], []))
        i = bisect.bisect_left(times, at)
        return i > 0 and highest[i - 1] >= sequence

    found_duplicates: list[Duplicate] = []
    problems: list[str] = []
    for (pid, sequence), where in sorted(holders.items(), key=lambda kv: (_key(kv[0][0]), kv[0][1])):
        if len(where) < 2:
            continue
        where.sort(key=lambda f: f.written)
        first = where[0]
        writers = {first.writer}
        for again in where[1:]:
            if again.writer in writers:
                problems.append(
                    f"landing: partition {pid}: {again.owner} landed sequence {sequence} twice in one "
                    f"tenure ({again.tenure}): {first.name} and {again.name}"
                )
                continue
            writers.add(again.writer)
            cause = next(
                (
                    f
                    for f in causes
                    if first.owner in f.victims
                    and first.written <= f.ended + offset + slack + (expiry if f.kind == TAKEN_OVER else 0.0)
                    and again.written >= f.started + offset - slack
                    and not checkpointed_before(pid, sequence, f.started + offset - slack)
                ),
                None,
            )
            found_duplicates.append(Duplicate(pid, sequence, first, again, cause))
    unexplained = [d for d in found_duplicates if d.cause is None]
    for d in unexplained[:10]:
        problems.append(
            f"landing: partition {d.partition}: sequence {d.sequence} processed twice with no fault to explain it: "
            f"landed by {d.first.owner} at {clock(d.first.written)} ({d.first.name}) and again by {d.again.owner} at "
            f"{clock(d.again.written)} ({d.again.name}); no cut, kill or stop of {d.first.owner} between them found it "
            f"processed and not checkpointed"
        )
    if len(unexplained) > 10:
        problems.append(f"landing: and {len(unexplained) - 10} more duplicates without a cause")
    return found_duplicates, problems


def _key(pid: str) -> tuple[int, str]:
    return (int(pid), pid) if pid.isdigit() else (1 << 30, pid)


@dataclass(frozen=True, slots=True)
class Figures:
    phase: str
    produced: int
    lost: int
    twice: int
    unprocessed: float  # seconds: the longest any partition went without a new event processed
    overlap: float  # seconds: the longest two leases of one partition overlapped in the store's history
    balanced: float | None  # seconds from the heal to balance; None: no heal in the phase, or never

    def line(self) -> str:
        balance = "-" if self.balanced is None else f"{self.balanced:.1f}s"
        return (
            f"{self.phase:<18} produced {self.produced:>5}, lost {self.lost}, processed twice {self.twice:>3}, "
            f"longest unprocessed {self.unprocessed:5.2f}s, longest overlap {self.overlap:.3f}s, "
            f"balanced after the heal {balance}"
        )


def per_nemesis(
    phases: Iterable[Phase],
    produced: Mapping[str, Sequence[tuple[float, bool]]],
    dead: set[tuple[str, int]],
    files: Iterable[LandedFile],
    handlings: Iterable[Handling],
    found: Iterable[Duplicate],
    history: History,
    expiry: float,
    offset: float,
    balanced: Mapping[Fault, float | None],
) -> list[Figures]:
    """The figures of each phase (times: monotonic, except the store's and the files', which are the
    wall clock: wall = monotonic + ``offset``). A duplicate counts in the phase its cause started in."""
    landed: set[tuple[str, int]] = {(f.partition, s) for f in files for s in f.sequences}
    first_handled: dict[tuple[str, int], float] = {}
    for h in handlings:
        key = (h.partition, h.sequence)
        if key not in first_handled or h.at < first_handled[key]:
            first_handled[key] = h.at
    moments: dict[str, list[float]] = {}
    for (pid, _), at in first_handled.items():
        moments.setdefault(pid, []).append(at)
    for found_times in moments.values():
        found_times.sort()
    duplicates_of = list(found)
    changes: list[tuple[float, float]] = []  # (start of a tenure, how far it overlapped the one before)
    for writes in by_partition(history.writes).values():
        for before, after in pairwise(tenures(writes, expiry, history.late_ends)):
            if before.owner != after.owner:
                changes.append((after.start, max(0.0, before.end - after.start)))
    out = []
    for phase in phases:
        start, end = phase.started, phase.ended
        made = [
            (pid, s)
            for pid, events in produced.items()
            for s, (at, bad) in enumerate(events)
            if start <= at < end and not bad
        ]
        gone = sum(1 for key in made if key not in landed and key not in dead)
        twice = sum(1 for d in duplicates_of if d.cause is not None and start <= d.cause.started < end)
        longest = 0.0
        for times in moments.values():
            inside = [start, *times[bisect.bisect_left(times, start) : bisect.bisect_right(times, end)], end]
            longest = max(longest, max(b - a for a, b in pairwise(inside)))
        overlap = max((o for at, o in changes if start + offset <= at < end + offset), default=0.0)
        heals = [seconds for fault, seconds in balanced.items() if start <= fault.started < end]
        balance = None if not heals or any(s is None for s in heals) else max(s for s in heals if s is not None)
        out.append(Figures(phase.name, len(made), gone, twice, longest, overlap, balance))
    return out
