"""The rules over a run's evidence, each a generator of problems (one line each; none: it held).

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
6. **A store outage moves nothing.** Moves are changes of a partition's owner in the sampled
   ownership records (``ownership_moves``), counted from a fault's start to the end of its phase
   (when the fleet had recovered). After an outage of at most ``SHORT_OUTAGE`` expiries with every
   worker alive: no move and no event handled twice. After a longer one: no partition moves more
   than once (and, by rule 1, nothing is lost).
7. **A bad record costs only itself.** After one partition's ownership record is corrupted (an
   unknown owner, a garbage ETag, ``last_modified`` in the future or not a number), no other
   partition moves, and that one is never left unprocessed for more than one expiry.
8. **The console degrades.** Polled all the while, ``/metrics`` answers 200 and ``/api/state`` 200
   or 503: never a 500 nor no answer at all; and during every store outage ``/metrics`` shows
   ``leaseboard_store_up 0`` at least once.
9. **Time comes from the store.** Every event in the console's log is stamped within ``CLOCK_SLACK``
   seconds of the real time it happened in (the run's wall-clock span: the store runs on this
   host), whatever the reporter's own clock says, so none of a worker whose clock is 3 minutes off
   lands minutes away from its neighbours in the log.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import pairwise

from tests.chaos.cycles import slowest
from tests.chaos.evidence import CheckpointSample, Evidence, Fault, Handling, Probe

SHORT_OUTAGE = 3.0  # expiries: a store outage at most this long, every worker alive, moves nothing

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


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive sequence numbers one owner handled on one partition."""

    partition: str
    owner: str
    first: int
    last: int
    started: float
    ended: float


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
        faults = _unplanned(evidence, first.owner) + [f for f in evidence.taken_over if first.owner in f.victims]
        # A fault that lasts (a store link flapping for 12 s) may strike at any moment of its span: what
        # its victim handled until one expiry after its end may be lost with a checkpoint that failed.
        explained = any(
            first.at <= max(f.started, f.ended) + evidence.expiry + evidence.slack
            and repeat.at >= f.started - evidence.slack
            and first.sequence > history.at_or_before(first.partition, f.started)
            for f in faults
        )
        if not explained:
            why = "no unplanned failure of it in between" if not faults else "not inside a failure's window"
            yield (
                f"partition {first.partition} event {first.sequence}: handled by {first.owner} at {first.at:.2f} "
                f"and again by {repeat.owner} at {repeat.at:.2f}: {why}{_nearest(faults, first, history)}"
            )


def _nearest(faults: list[Fault], first: Handling, history: CheckpointHistory) -> str:
    """The first owner's unplanned failure nearest ``first`` and why it does not explain the repeat:
    a failed run's first line then says what to look at (CI keeps little of a long report)."""
    if not faults:
        return ""
    f = min(faults, key=lambda f: min(abs(first.at - f.started), abs(first.at - max(f.started, f.ended))))
    point = history.at_or_before(first.partition, f.started)
    return (
        f" (nearest: {f.kind} of {', '.join(sorted(f.victims))} from {f.started:.2f} to {max(f.started, f.ended):.2f}, "
        f"checkpoint {point} at its start)"
    )


# 5. resume at the latest checkpoint ------------------------------------------------------------


def resumes(evidence: Evidence, runs: list[Run]) -> Iterator[str]:
    """Runs that started below a checkpoint already stored. Where the previous owner's last checkpoint
    can land after a claim (``Evidence.late_checkpoints``), only one stored before the claim counts:
    before the last ownership sample showing another holder (CI, Blob: w5-0 claimed partition 2 by
    expiry and read checkpoint 744, then the previous owner's 768, fenced by a read before the claim,
    landed before w5-0's first event; 745..768 were handled twice, as rule 4 allows)."""
    history = CheckpointHistory(evidence.checkpoint_samples)
    for run in runs:
        latest = history.before(run.partition, run.started)
        if run.first - 1 < latest and evidence.late_checkpoints:
            latest = history.before(run.partition, _held_by_another(evidence, run))
        if run.first - 1 < latest:
            yield (
                f"partition {run.partition}: {run.owner} started at event {run.first} although checkpoint "
                f"{latest} was already stored"
            )


def _held_by_another(evidence: Evidence, run: Run) -> float:
    """When an ownership sample last showed ``run``'s partition held by another worker than its owner
    (or by nobody) before ``run`` started: its owner's claim came after that (-inf: no such sample)."""
    found = -math.inf
    for sample in evidence.ownership_samples:
        if sample.at >= run.started:
            break
        lease = sample.leases.get(run.partition)
        if lease is None or lease.owner != run.owner:
            found = sample.at
    return found


# 6. moves, and store outages -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Move:
    """A partition's ownership record naming ``target`` where it had last named ``source``."""

    partition: str
    at: float  # the sample that first showed it
    source: str
    target: str


def ownership_moves(evidence: Evidence) -> list[Move]:
    """Every change of owner in the sampled records, in time order. Only the fleet's workers count
    (``evidence.workers``; any non-empty owner when it is empty): a release, a lease that expired
    and was renewed by its holder, or a record naming a stranger (a corrupted one) is no move by
    itself; the next worker named after it moves the partition if it is not the one named before."""
    last: dict[str, str] = {}
    out = []
    for sample in evidence.ownership_samples:
        for pid, lease in sample.leases.items():
            owner = lease.owner
            if not owner or (evidence.workers and owner not in evidence.workers):
                continue
            before = last.get(pid)
            if before is not None and before != owner:
                out.append(Move(pid, sample.at, before, owner))
            last[pid] = owner
    return out


def fault_window(evidence: Evidence, fault: Fault) -> tuple[float, float]:
    """From the fault's start to the end of the phase it struck in (the fleet had recovered then)."""
    for phase in evidence.phases:
        if phase.started - evidence.slack <= fault.started <= phase.ended:
            return fault.started, phase.ended
    last = max((s.at for s in evidence.ownership_samples), default=fault.ended)
    return fault.started, max(fault.ended, last)


def when(evidence: Evidence, at: float) -> str:
    """``at`` for a reader: the phase it fell in and how far into it."""
    for phase in evidence.phases:
        if phase.started <= at <= phase.ended:
            return f"{phase.name} +{at - phase.started:.1f}s"
    return f"t={at:.1f}"


def _examples(moves: list[Move], evidence: Evidence, shown: int = 3) -> str:
    text = ", ".join(f"{m.partition}: {m.source}->{m.target} at {when(evidence, m.at)}" for m in moves[:shown])
    return text + (", ..." if len(moves) > shown else "")


def outages(evidence: Evidence, moves: list[Move], again: list[tuple[Handling, Handling]]) -> Iterator[str]:
    expiry = evidence.expiry
    for fault in evidence.faults:
        if fault.kind != "outage":
            continue
        start, end = fault_window(evidence, fault)
        lasted = fault.ended - fault.started
        others = [f for f in evidence.faults if f is not fault and start <= f.started <= end]
        if any(f.victims & fault.victims for f in others):  # not every worker stayed alive: rules 3 and 4 judge
            continue
        moved = [m for m in moves if start <= m.at <= end]
        what = f"store outage of {lasted:.1f}s at {when(evidence, start)}"
        if lasted <= SHORT_OUTAGE * expiry:
            if moved:
                partitions = len({m.partition for m in moved})
                yield (
                    f"{what} (at most {SHORT_OUTAGE:g}x the expiry of {expiry:g}s, every worker alive): {len(moved)} "
                    f"move(s) of {partitions} partition(s), want none ({_examples(moved, evidence)})"
                )
            twice = sorted((repeat for _, repeat in again if start <= repeat.at <= end), key=lambda h: h.at)
            if twice:
                first = twice[0]
                yield (
                    f"{what} (every worker alive): {len(twice)} event(s) handled twice, want none (first: partition "
                    f"{first.partition} event {first.sequence} again by {first.owner} at {when(evidence, first.at)})"
                )
        else:
            per = Counter(m.partition for m in moved)
            again_moved = sorted((pid for pid, n in per.items() if n > 1), key=int)
            if again_moved:
                counts = ", ".join(f"{pid} ({per[pid]} moves)" for pid in again_moved)
                yield f"{what} (longer than {SHORT_OUTAGE:g}x the expiry): moved more than once: partition {counts}"


# 7. a bad record costs only itself -------------------------------------------------------------


def bad_records(evidence: Evidence, moves: list[Move]) -> Iterator[str]:
    for fault in evidence.faults:
        if fault.kind != "corrupt" or not fault.partitions:
            continue
        start, end = fault_window(evidence, fault)
        others = [m for m in moves if start <= m.at <= end and m.partition not in fault.partitions]
        what = f"corrupt record of partition {', '.join(sorted(fault.partitions))} at {when(evidence, start)}"
        if others:
            partitions = len({m.partition for m in others})
            yield f"{what}: {partitions} other partition(s) moved, want none ({_examples(others, evidence)})"
        for pid in sorted(fault.partitions, key=int):
            times = sorted(h.at for h in evidence.handlings if h.partition == pid and start <= h.at <= end)
            since, gap = max(((a, b - a) for a, b in pairwise([start, *times, end])), key=lambda pair: pair[1])
            # A record that looks live (an unknown owner) is taken at the handoff timeout, one expiry,
            # and handled once it would have expired by the store's clock (a tick more on a coarse
            # one), at the claimer's next cycle (one interval more; Blob, with no notice, waits for it),
            # which a starved machine runs late: the slowest cycle meanwhile (``tests.chaos.cycles``).
            late = slowest(evidence.cycles, since, since + gap)
            bound = evidence.expiry + evidence.store_tick + evidence.interval + late
            if gap > bound + evidence.slack:
                tick = f" and one tick of the store's clock, {evidence.store_tick:g}s" if evidence.store_tick else ""
                cycle = f" and one interval, {evidence.interval:g}s" if evidence.interval else ""
                cycle += f" and the slowest cycle meanwhile, {late:.2f}s" if late else ""
                yield (
                    f"{what}: partition {pid} went unprocessed for {gap:.1f}s from {when(evidence, since)} "
                    f"(want at most one expiry, {evidence.expiry:g}s{tick}{cycle})"
                )


# 8. the console --------------------------------------------------------------------------------


def console_error(probe: Probe) -> bool:
    """No answer, a ``/metrics`` other than 200, or an ``/api/state`` other than 200 or 503."""
    if probe.status is None:
        return True
    return probe.status != 200 if probe.path == "/metrics" else probe.status not in (200, 503)


def console(evidence: Evidence) -> Iterator[str]:
    by_kind: dict[tuple[str, str], list[Probe]] = defaultdict(list)
    for probe in evidence.console:
        if console_error(probe):
            answer = "no answer" if probe.status is None else f"answered {probe.status}"
            by_kind[(probe.path, answer)].append(probe)
    for (path, answer), probes in sorted(by_kind.items()):
        first, last = probes[0], probes[-1]
        yield (
            f"{path} {answer} {len(probes)} time(s), from {when(evidence, first.at)} to {when(evidence, last.at)} "
            f"(first: {first.detail or '-'})"
        )


def store_down_shown(evidence: Evidence) -> Iterator[str]:
    if not evidence.console:
        return
    for fault in evidence.faults:
        if fault.kind != "outage":
            continue
        scrapes = [p for p in evidence.console if p.path == "/metrics" and fault.started <= p.at <= fault.ended]
        if not any(p.store_up == 0 for p in scrapes):
            answers = Counter("no answer" if p.status is None else str(p.status) for p in scrapes)
            seen = ", ".join(f"{answer} x{n}" for answer, n in sorted(answers.items())) or "none"
            what = f"store outage of {fault.ended - fault.started:.1f}s at {when(evidence, fault.started)}"
            yield f"{what}: /metrics never showed leaseboard_store_up 0 ({len(scrapes)} scrapes: {seen})"


# 9. time comes from the store ------------------------------------------------------------------

CLOCK_SLACK = 15.0  # seconds: publishing delay and the run's own edges, far below a 180 s skew


def event_clock(events: list[dict[str, object]], wall_from: float, wall_to: float) -> Iterator[str]:
    """Events stamped outside the run's wall-clock span (a reporter's own clock, not the store's)."""
    if not events:
        yield "event log: no balancer event reached the console (so nothing could be checked)"
    off = [e for e in events if not wall_from - CLOCK_SLACK <= float(e["at"]) <= wall_to + CLOCK_SLACK]  # type: ignore[arg-type]
    if off:
        first = off[0]
        yield (
            f"event log: {len(off)} of {len(events)} event(s) stamped outside the run's time "
            f"(first: {first['kind']} of partition {first['partition_id']} by {first['reporter']}, "
            f"{float(first['at']) - wall_to:+.0f}s after its end)"  # type: ignore[arg-type]
        )
