"""Figures per phase (one line per fault): events produced and handled in it, duplicates handled in
it, ownership moves in it, and the longest time a partition had no live owner according to the store.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from tests.chaos.evidence import Evidence, Handling, Lease, OwnershipSample, Phase


@dataclass(frozen=True, slots=True)
class Figures:
    phase: str
    produced: int
    handled: int
    duplicates: int
    longest_unowned: float
    moves: int = 0

    def line(self, store: str) -> str:
        return (
            f"{store:<10} {self.phase:<16} produced {self.produced:>6}  handled {self.handled:>6}  "
            f"duplicates {self.duplicates:>5}  moves {self.moves:>3}  longest unowned {self.longest_unowned:5.1f}s"
        )


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
    """Owned: a record naming an owner, modified within the expiry by the store's clock (a record
    modified further ahead of that clock than the expiry is as good as expired: nobody renews it)."""
    return (
        lease is not None
        and bool(lease.owner)
        and lease.last_modified is not None
        and (abs(now - lease.last_modified) <= expiry)
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
        self,
        evidence: Evidence,
        again: list[tuple[Handling, Handling]],
        unowned: list[tuple[str, float, float]],
        moves: list[float] | None = None,
    ) -> None:
        self.produced = sorted(at for events in evidence.produced.values() for at, _ in events)
        self.handled = sorted(h.at for h in evidence.handlings)
        self.repeats = sorted(repeat.at for _, repeat in again)
        self.unowned = unowned
        self.moves = sorted(moves or [])

    def figures(self, phase: Phase) -> Figures:
        def count(times: list[float]) -> int:
            return bisect_left(times, phase.ended) - bisect_left(times, phase.started)

        longest = max(
            (
                min(end, phase.ended) - max(start, phase.started)
                for _, start, end in self.unowned
                if start < phase.ended and end > phase.started
            ),
            default=0.0,
        )
        return Figures(
            phase.name,
            count(self.produced),
            count(self.handled),
            count(self.repeats),
            max(longest, 0.0),
            count(self.moves),
        )
