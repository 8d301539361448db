"""The invariant checker: what must hold after a fault-injection run, however the faults fell.

The evidence is on one clock, the machine's monotonic clock (``CLOCK_MONOTONIC`` is shared by every
process, and a SIGSTOP or a skewed wall clock does not move it): what each worker recorded as it
handled an event (``recording``), the checkpoints and ownership records the test read from the
store while the run went on, what the producer wrote and when, and the faults the test injected.

The rules, each broken one reported as one line:

1. **Coverage.** Every produced event was handled at least once; a malformed one was set aside
   (dead-lettered), a good one never was.
2. **Checkpoints.** No sampled checkpoint is lower than an earlier sample of its partition, and
   after the final drain each partition's checkpoint is its last event.
3. **One owner at a time.** Two workers' runs on one partition overlap in time only while the
   earlier one is inside a lease expiry after an unplanned failure of its own (killed, stopped, cut
   off from its store, its record corrupted); never around a planned move.
4. **Duplicates from the failure window only.** An event handled again was first handled by a
   worker that then failed unplanned, and lies after the last checkpoint taken before that
   failure. Every duplicate is counted.
5. **Resume at the latest checkpoint.** A worker starting on a partition starts right after a
   checkpoint at least as new as any the store showed before its first event there.

Figures per phase (one line per fault): events produced and handled in it, duplicates handled in
it, and the longest time a partition had no live owner according to the store.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise


@dataclass(frozen=True, slots=True)
class Handling:
    """One event handed to a worker's handler (recorded before the handler returned)."""

    partition: str
    sequence: int
    owner: str
    at: float
    malformed: bool = False


@dataclass(frozen=True, slots=True)
class Fault:
    """An injected fault: who it struck, from when to when. Planned ones (SIGTERM, a worker
    joining) must move partitions without a single duplicate."""

    kind: str
    started: float
    ended: float
    victims: frozenset[str]
    planned: bool = False


@dataclass(frozen=True, slots=True)
class Lease:
    owner: str
    last_modified: float | None  # the store's clock


@dataclass(frozen=True, slots=True)
class OwnershipSample:
    at: float  # local monotonic time the listing returned
    now: float  # the store's clock then
    partitions: tuple[str, ...]  # the hub's partitions then
    leases: dict[str, Lease]


@dataclass(frozen=True, slots=True)
class CheckpointSample:
    at: float  # local monotonic time the listing returned
    checkpoints: dict[str, int]


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    started: float
    ended: float


@dataclass
class Evidence:
    expiry: float
    produced: dict[str, list[tuple[float, bool]]]  # partition -> [(written at, malformed)], index = sequence
    handlings: list[Handling]
    dead_letters: set[tuple[str, int]]
    checkpoint_samples: list[CheckpointSample]
    ownership_samples: list[OwnershipSample]
    faults: list[Fault]
    phases: list[Phase]
    final_checkpoints: dict[str, int]
    slack: float = 0.5  # seconds allowed on every comparison of times taken by different processes


@dataclass(frozen=True, slots=True)
class Figures:
    phase: str
    produced: int
    handled: int
    duplicates: int
    longest_unowned: float

    def line(self, store: str) -> str:
        return (
            f"{store:<10} {self.phase:<16} produced {self.produced:>6}  handled {self.handled:>6}  "
            f"duplicates {self.duplicates:>5}  longest unowned {self.longest_unowned:5.1f}s"
        )


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    figures: list[Figures] = field(default_factory=list)
    duplicates: int = 0


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive sequence numbers one owner handled on one partition."""

    partition: str
    owner: str
    first: int
    last: int
    started: float
    ended: float


MAX_REPORTED = 5  # violations of one rule listed before "... and N more"


def check(evidence: Evidence) -> Report:
    """Every rule over ``evidence``; the report lists what broke and the figures per phase."""
    report = Report()
    again = repeats(evidence.handlings)
    report.duplicates = len(again)
    report.violations += _limited("coverage", coverage(evidence))
    report.violations += _limited("checkpoints", checkpoint_order(evidence))
    runs = list(owner_runs(evidence.handlings, gap=max(1.0, evidence.expiry / 3)))
    report.violations += _limited("one owner at a time", overlaps(evidence, runs))
    report.violations += _limited("duplicates", unexplained(evidence, again))
    report.violations += _limited("resume", resumes(evidence, runs))
    timeline = Timeline(evidence, again, unowned_intervals(evidence))
    report.figures = [timeline.figures(phase) for phase in evidence.phases]
    return report


def _limited(rule: str, problems: Iterable[str]) -> list[str]:
    found = list(problems)
    shown = [f"{rule}: {p}" for p in found[:MAX_REPORTED]]
    if len(found) > MAX_REPORTED:
        shown.append(f"{rule}: ... and {len(found) - MAX_REPORTED} more")
    return shown


# 1. coverage -----------------------------------------------------------------------------------


def coverage(evidence: Evidence) -> Iterator[str]:
    handled: dict[tuple[str, int], bool] = {}
    for h in evidence.handlings:
        handled[(h.partition, h.sequence)] = h.malformed
    for pid, events in sorted(evidence.produced.items(), key=lambda kv: int(kv[0])):
        missing = [s for s in range(len(events)) if (pid, s) not in handled]
        if missing:
            yield f"partition {pid}: {len(missing)} of {len(events)} events never handled (first {missing[:5]})"
        for sequence, (_, malformed) in enumerate(events):
            aside = (pid, sequence) in evidence.dead_letters
            if malformed and (pid, sequence) in handled and not aside:
                yield f"partition {pid}: malformed event {sequence} was handled but never set aside"
            if not malformed and aside:
                yield f"partition {pid}: good event {sequence} was set aside as a dead letter"


# 2. checkpoints --------------------------------------------------------------------------------


def checkpoint_order(evidence: Evidence) -> Iterator[str]:
    highest: dict[str, tuple[int, float]] = {}
    for sample in evidence.checkpoint_samples:
        for pid, sequence in sample.checkpoints.items():
            seen = highest.get(pid)
            if seen is not None and sequence < seen[0]:
                yield (
                    f"partition {pid}: checkpoint went back from {seen[0]} (t={seen[1]:.2f}) to {sequence} "
                    f"(t={sample.at:.2f})"
                )
            if seen is None or sequence > seen[0]:
                highest[pid] = (sequence, sample.at)
    for pid, events in sorted(evidence.produced.items(), key=lambda kv: int(kv[0])):
        final = evidence.final_checkpoints.get(pid)
        if final != len(events) - 1:
            yield f"partition {pid}: final checkpoint {final}, but its last event is {len(events) - 1}"


# runs and repeats ------------------------------------------------------------------------------


def owner_runs(handlings: Iterable[Handling], gap: float = 1.0) -> Iterator[Run]:
    """Each owner's runs per partition: broken wherever the next number is not the previous + 1, or
    more than ``gap`` seconds passed between two of its handlings (the producer writes every 20 ms:
    the owner was not handling the partition then). Without the second rule, an owner that got a
    partition back from a worker killed before its first checkpoint, and so resumed right where it
    had stopped, would look as if it had handled it all along, beside the other worker."""
    by_key: dict[tuple[str, str], list[Handling]] = defaultdict(list)
    for h in handlings:
        by_key[(h.partition, h.owner)].append(h)
    for (pid, owner), items in by_key.items():
        items.sort(key=lambda h: h.at)
        start = items[0]
        previous = start
        for h in items[1:]:
            if h.sequence != previous.sequence + 1 or h.at - previous.at > gap:
                yield Run(pid, owner, start.sequence, previous.sequence, start.at, previous.at)
                start = h
            previous = h
        yield Run(pid, owner, start.sequence, previous.sequence, start.at, previous.at)


def repeats(handlings: Iterable[Handling]) -> list[tuple[Handling, Handling]]:
    """(the previous handling, the repeat) for every event handled more than once, in time order."""
    by_event: dict[tuple[str, int], list[Handling]] = defaultdict(list)
    for h in handlings:
        by_event[(h.partition, h.sequence)].append(h)
    out = []
    for items in by_event.values():
        if len(items) > 1:
            items.sort(key=lambda h: h.at)
            out += list(pairwise(items))
    return out


def _unplanned(evidence: Evidence, owner: str) -> list[Fault]:
    return [f for f in evidence.faults if not f.planned and owner in f.victims]


# 3. one owner at a time ------------------------------------------------------------------------


def overlaps(evidence: Evidence, runs: list[Run]) -> Iterator[str]:
    by_partition: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_partition[run.partition].append(run)
    for pid, items in by_partition.items():
        items.sort(key=lambda r: r.started)
        for i, first in enumerate(items):
            for second in items[i + 1 :]:
                if second.started >= first.ended:
                    break
                if second.owner == first.owner:
                    continue
                start, end = second.started, min(first.ended, second.ended)
                excused = any(
                    f.started - evidence.slack <= start and end <= f.started + evidence.expiry + evidence.slack
                    for f in _unplanned(evidence, first.owner)
                )
                if not excused:
                    yield (
                        f"partition {pid}: {first.owner} (events {first.first}..{first.last}) and {second.owner} "
                        f"(events {second.first}..{second.last}) handled it at the same time for "
                        f"{end - start:.2f}s with no unplanned failure of {first.owner} to excuse it"
                    )


# 4. duplicates ---------------------------------------------------------------------------------


class CheckpointHistory:
    """The highest checkpoint each partition had been sampled at, by time (bisected, not scanned:
    a long run has tens of thousands of samples and duplicates)."""

    def __init__(self, samples: list[CheckpointSample]) -> None:
        self._times: dict[str, list[float]] = defaultdict(list)
        self._highest: dict[str, list[int]] = defaultdict(list)
        for sample in samples:
            for pid, sequence in sample.checkpoints.items():
                highest = self._highest[pid]
                self._times[pid].append(sample.at)
                highest.append(max(sequence, highest[-1]) if highest else sequence)

    def at_or_before(self, pid: str, moment: float) -> int:
        """The highest checkpoint of ``pid`` sampled at or before ``moment`` (-1 if none)."""
        i = bisect_right(self._times.get(pid, []), moment)
        return self._highest[pid][i - 1] if i else -1

    def before(self, pid: str, moment: float) -> int:
        """The highest checkpoint of ``pid`` sampled strictly before ``moment`` (-1 if none)."""
        i = bisect_left(self._times.get(pid, []), moment)
        return self._highest[pid][i - 1] if i else -1


def unexplained(evidence: Evidence, again: list[tuple[Handling, Handling]]) -> Iterator[str]:
    history = CheckpointHistory(evidence.checkpoint_samples)
    for first, repeat in again:
        faults = _unplanned(evidence, first.owner)
        explained = any(
            first.at <= f.started + evidence.expiry + evidence.slack
            and repeat.at >= f.started - evidence.slack
            and first.sequence > history.at_or_before(first.partition, f.started)
            for f in faults
        )
        if not explained:
            why = "no unplanned failure of it in between" if not faults else "not inside a failure's window"
            yield (
                f"partition {first.partition} event {first.sequence}: handled by {first.owner} at {first.at:.2f} "
                f"and again by {repeat.owner} at {repeat.at:.2f}: {why}"
            )


# 5. resume at the latest checkpoint ------------------------------------------------------------


def resumes(evidence: Evidence, runs: list[Run]) -> Iterator[str]:
    history = CheckpointHistory(evidence.checkpoint_samples)
    for run in runs:
        latest = history.before(run.partition, run.started)
        if run.first - 1 < latest:
            yield (
                f"partition {run.partition}: {run.owner} started at event {run.first} although checkpoint "
                f"{latest} was already stored"
            )


# figures ---------------------------------------------------------------------------------------


def unowned_intervals(evidence: Evidence) -> list[tuple[str, float, float]]:
    """(partition, from, to): times a partition had no live owner by the store's records and clock.

    Between two samples a lease is taken to run out when its record says it does (converted to the
    local clock through the earlier sample), so a store outage with no samples is not counted as
    ownership; a partition that appears (added mid-run) is unowned from its first sample on.
    """
    out: list[tuple[str, float, float]] = []
    since: dict[str, float] = {}
    previous: OwnershipSample | None = None
    for sample in evidence.ownership_samples:
        for pid in sample.partitions:
            lease = sample.leases.get(pid)
            owned = _live(lease, sample.now, evidence.expiry)
            if owned and pid in since:
                out.append((pid, since.pop(pid), sample.at))
            elif owned and previous is not None:
                gap = _gap(previous, pid, sample, evidence.expiry)
                if gap is not None:
                    out.append((pid, *gap))
            elif not owned and pid not in since:
                since[pid] = _lapsed(previous, pid, sample, evidence.expiry)
        previous = sample
    if previous is not None:
        out += [(pid, start, previous.at) for pid, start in since.items()]
    return out


def _live(lease: Lease | None, now: float, expiry: float) -> bool:
    return lease is not None and bool(lease.owner) and lease.last_modified is not None and (
        now - lease.last_modified <= expiry
    )


def _lapsed(previous: OwnershipSample | None, pid: str, sample: OwnershipSample, expiry: float) -> float:
    """When ``pid``'s lease ran out, at the latest ``sample.at``."""
    if previous is None or pid not in previous.partitions:
        return sample.at
    lease = previous.leases.get(pid)
    if lease is None or not _live(lease, previous.now, expiry):
        return previous.at
    assert lease.last_modified is not None
    runs_out = previous.at + (lease.last_modified + expiry - previous.now)
    return min(sample.at, max(previous.at, runs_out))


def _gap(previous: OwnershipSample, pid: str, sample: OwnershipSample, expiry: float) -> tuple[float, float] | None:
    """(from, to) if ``pid`` was owned at both samples but the earlier lease ran out before the
    later one was written (no sample in between saw it: the store was down)."""
    before, after = previous.leases.get(pid), sample.leases.get(pid)
    if after is None or after == before or not _live(before, previous.now, expiry):
        return None
    assert before is not None and before.last_modified is not None and after.last_modified is not None
    runs_out = previous.at + (before.last_modified + expiry - previous.now)
    written = sample.at - (sample.now - after.last_modified)
    return (runs_out, written) if written > runs_out else None


class Timeline:
    """Times of production, handling and repeats, sorted once, so each phase counts by bisection."""

    def __init__(
        self, evidence: Evidence, again: list[tuple[Handling, Handling]], unowned: list[tuple[str, float, float]]
    ) -> None:
        self.produced = sorted(at for events in evidence.produced.values() for at, _ in events)
        self.handled = sorted(h.at for h in evidence.handlings)
        self.repeats = sorted(repeat.at for _, repeat in again)
        self.unowned = unowned

    def figures(self, phase: Phase) -> Figures:
        def count(times: list[float]) -> int:
            return bisect_left(times, phase.ended) - bisect_left(times, phase.started)

        longest = max(
            (min(end, phase.ended) - max(start, phase.started) for _, start, end in self.unowned
             if start < phase.ended and end > phase.started),
            default=0.0,
        )  # fmt: skip
        return Figures(phase.name, count(self.produced), count(self.handled), count(self.repeats), max(longest, 0.0))
