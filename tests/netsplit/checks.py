"""What the network-partition suite checks beyond the chaos suite's invariants.

``recovery``: after every heal, every partition is owned by a worker that runs, and the counts are
balanced, within the expiry plus two intervals (the bound a healed worker needs: its leases, if any
survived, are renewed at its next cycle; if they lapsed, a rejoining worker is a member at its first
heartbeat and gets its share by handoff within an interval more). Judged on the observer's samples
of the store (every 50 ms), so the figure it reports is good to a sample. The bound judged adds
``RECONNECT`` for the connections the cut left hanging, and counts the two intervals as the cycles
the workers really ran (``cycles``, from their logs): on a saturated machine a store can take a
second to answer a cycle, and each of the two cycles a recovery waits for is then that much longer.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.chaos.cycles import Cycle, slowest
from tests.chaos.evidence import Evidence, OwnershipSample
from tests.netsplit.cluster import NetFleet

SAMPLE_SLACK = 0.2  # seconds: the sampling period and a store round trip
OVERLAP_SLACK = 0.05  # seconds: two handlers' readings of the clock around one handoff
# Seconds a connection left hanging by the cut takes to come back after the heal: the next TCP
# retransmission of a request sent into the cut (its backoff doubles while the cut lasts), or the
# Event Hubs client's reconnect backoff. Not the balancer's doing, so added to its bound; the
# figures printed show which heals needed it (``recovery`` against expiry + 2 intervals).
RECONNECT = 2.0
JITTER = 0.1  # the workers' spread of their interval (``workers.runtime.processor``'s default)


@dataclass(frozen=True, slots=True)
class Recovery:
    kind: str
    seconds: float | None  # from the heal until balanced; None: never within the run
    slowest: float = 0.0  # the longest cycle (its own seconds and its loop's lateness) meanwhile


def bound(fleet: NetFleet, slowest: float = 0.0) -> float:
    """The seconds a recovery may take: the expiry, two cycles (each an interval at most ``JITTER``
    longer, after a cycle that took ``slowest``), the reconnection and a sample."""
    return fleet.expiry + 2 * (fleet.interval * (1 + JITTER) + slowest) + RECONNECT + SAMPLE_SLACK


def overlaps(evidence: Evidence, slack: float = OVERLAP_SLACK) -> list[str]:
    """Never two owners at once: per partition, no two workers' tenures overlap in time beyond ``slack``.

    A tenure is one worker's continuous reading of a partition: its handlings there in sequence order,
    each the next sequence number after the one before (a worker that resumes elsewhere, after a gap,
    starts a new tenure), and each less than an expiry after the one before unless no other worker
    handled the partition in between (a worker that lost the partition to one that was then cut off
    before its checkpoint resumes at the very next sequence number: a new tenure too). Its window runs
    from its first handling to its last, each time the handler's own reading of the machine's monotonic
    clock as it got the event (network namespaces share that clock). So this proves, to within
    ``slack``, that no worker handled an event of a partition while another was between two
    consecutive events of its own reading there, less than an expiry apart: a worker cut off stops
    before its lease can have expired in the store, and the next owner starts only after that. (That
    no worker handled outside its leases, a stolen one's fence included, is the store history's to prove:
    ``history.handled_outside``.)"""
    problems = []
    by_key: dict[tuple[str, str], list[tuple[int, float]]] = {}
    moments: dict[str, list[tuple[float, str]]] = {}  # partition -> (time, owner) of every handling, sorted
    for h in evidence.handlings:
        by_key.setdefault((h.partition, h.owner), []).append((h.sequence, h.at))
        moments.setdefault(h.partition, []).append((h.at, h.owner))
    for found in moments.values():
        found.sort()

    def another_between(pid: str, owner: str, after: float, before: float) -> bool:
        found = moments[pid]
        low = bisect.bisect_right(found, (after, "\uffff"))
        high = bisect.bisect_left(found, (before, ""))
        return any(other != owner for _, other in found[low:high])

    tenures: dict[str, list[tuple[float, float, str, int, int]]] = {}  # partition -> (first, last, owner, from, to)
    for (pid, owner), handled in by_key.items():
        handled.sort()
        start = handled[0]
        previous = start
        for current in [*handled[1:], None]:
            if (
                current is None
                or current[0] != previous[0] + 1
                or (current[1] - previous[1] > evidence.expiry and another_between(pid, owner, previous[1], current[1]))
            ):
                tenures.setdefault(pid, []).append((start[1], previous[1], owner, start[0], previous[0]))
                if current is not None:
                    start = current
            if current is not None:
                previous = current
    for pid, spans in sorted(tenures.items()):
        spans.sort()
        for i, (first, last, owner, low, high) in enumerate(spans):
            for other_first, other_last, other, o_low, o_high in spans[i + 1 :]:
                if other_first > last - slack:
                    break
                if other != owner and min(last, other_last) - other_first > slack:
                    problems.append(
                        f"partition {pid}: {owner} read {low}..{high} from {first:.3f} to {last:.3f} while {other} "
                        f"read {o_low}..{o_high} from {other_first:.3f} to {other_last:.3f}"
                    )
    return problems[:20]


HUB_CUTS = frozenset({"cut-hub", "isolated"})  # faults that cut their victims off from the hub


def crash_loops(fleet: NetFleet, evidence: Evidence) -> list[str]:
    """The chaos suite's crash-loop check, with one allowance: a worker cut off from the hub has its
    readers fail (and restart from their checkpoints) while it is cut; that is not a crash loop."""
    from tests.chaos.test_chaos import crash_loops as chaos_crash_loops

    cut_from_hub = {owner for f in evidence.faults if f.kind in HUB_CUTS for owner in f.victims}
    return [
        problem
        for problem in chaos_crash_loops(fleet)
        if not (": a pump failed " in problem and problem.split(":")[0] in cut_from_hub)
    ]


def _running_at(fleet: NetFleet, at: float) -> set[str]:
    return {w.owner for w in fleet.workers.values() if w.started <= at and (w.ended is None or w.ended > at)}


def _balanced(sample: OwnershipSample, live: set[str], expiry: float) -> bool:
    owners = {
        pid: lease.owner
        for pid, lease in sample.leases.items()
        if lease.owner and lease.last_modified is not None and abs(sample.now - lease.last_modified) <= expiry
    }
    if set(owners) != set(sample.partitions) or not set(owners.values()) <= live or not live:
        return False
    counts = [list(owners.values()).count(o) for o in live]
    return max(counts) - min(counts) <= 1


def recovery(fleet: NetFleet, evidence: Evidence, kinds: set[str], ran: Iterable[Cycle] = ()) -> list[Recovery]:
    """For every fault of ``kinds``, how long from its heal until ownership was balanced again, and the
    slowest of the cycles ``ran`` begun and ended meanwhile (until the run's end when never)."""
    ran = list(ran)
    found = []
    for fault in evidence.faults:
        if fault.kind not in kinds:
            continue
        seconds = None
        for sample in evidence.ownership_samples:
            if sample.at >= fault.ended and _balanced(sample, _running_at(fleet, sample.at), evidence.expiry):
                seconds = sample.at - fault.ended
                break
        until = float("inf") if seconds is None else fault.ended + seconds
        # Cycles begun after the heal: one sent into the cut waits for the reconnection (``RECONNECT``).
        found.append(Recovery(fault.kind, seconds, slowest(ran, fault.ended, until)))
    return found


def recovery_problems(fleet: NetFleet, found: list[Recovery]) -> list[str]:
    return [
        f"{r.kind}: ownership balanced {'never' if r.seconds is None else f'{r.seconds:.1f}s'} after the heal "
        f"(bound: expiry + 2 cycles of the interval and the slowest meanwhile, {r.slowest:.2f}s, + {RECONNECT:g}s "
        f"to reconnect = {bound(fleet, r.slowest):.1f}s)"
        for r in found
        if r.seconds is None or r.seconds > bound(fleet, r.slowest)
    ]


def worker_lines(root: Path, violations: list[str], limit: int = 120) -> list[str]:
    """What the workers logged about the partitions named in ``violations``, for the report of a
    failed run: a run under ``ci-under-load`` leaves nothing else behind (its clone is deleted).
    Per worker named there (every worker when none is: ``w24-0`` logs to ``root/w24.log``), its last
    ``limit`` lines that name one of those partitions as a word, warn or report an error (not the
    per-cycle DEBUG lines read by ``cycles``: "2 store requests" names no partition)."""
    text = " ".join(violations)
    owners = sorted(set(re.findall(r"\b(w\d+)-\d+\b", text)))
    if not owners:  # an event lost names no worker: any of them may have skipped it
        owners = sorted(path.stem for path in root.glob("w*.log") if re.fullmatch(r"w\d+", path.stem))
    pids = sorted(set(re.findall(r"\bpartition (\d+)\b", text)))
    named = re.compile(r"(?<![\d.:,])(" + "|".join(pids) + r")(?![\d.,])") if pids else None
    out: list[str] = []
    for owner in owners:
        path = root / f"{owner}.log"
        if not path.exists():
            continue
        lines = [
            line
            for line in path.read_text(errors="replace").splitlines()
            if " WARNING " in line
            or " ERROR " in line
            or (named is not None and named.search(line) and " DEBUG " not in line)
        ]
        out.append(f"--- {path.name}: {len(lines)} lines about partitions {', '.join(pids) or '-'}, warnings or errors")
        out.extend(f"    {line}" for line in lines[-limit:])
    return out


def sequence_jumps(root: Path) -> list[str]:
    """A reader that skipped events: every pump's "sequence numbers jump" error (``workers.runtime.sequence``)
    in the workers' logs. The hub here keeps every event, so a jump is a reader's or a pump's bug."""
    out = []
    for path in sorted(root.glob("w*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if "sequence numbers jump" in line:
                out.append(f"reader: {path.stem}: {line.split(' ', 2)[-1]}")
    return out
