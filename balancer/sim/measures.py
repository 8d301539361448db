"""What the simulator measures: who processed which partition when, and the fewest moves possible.

Pure functions and one small recorder; no clock of their own (times are passed in).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from balancer.strategies.weights import STEP, best_move


@dataclass
class Processing:
    """Intervals during which a worker processed a partition (handed events to its handler)."""

    open: dict[str, dict[str, float]] = field(default_factory=dict)  # worker -> pid -> since
    closed: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # pid -> intervals

    def start(self, worker: str, pid: str, at: float) -> None:
        self.open.setdefault(worker, {}).setdefault(pid, at)

    def stop(self, worker: str, pid: str, at: float) -> None:
        since = self.open.get(worker, {}).pop(pid, None)
        if since is not None and at > since:
            self.closed.setdefault(pid, []).append((since, at))

    def of(self, worker: str) -> list[str]:
        """The partitions ``worker`` is processing now."""
        return list(self.open.get(worker, ()))

    def close_all(self, at: float) -> None:
        for worker, pids in self.open.items():
            for pid in list(pids):
                self.stop(worker, pid, at)


def _coverage(intervals: Iterable[tuple[float, float]], start: float, end: float) -> list[tuple[float, int]]:
    """The number of simultaneous intervals over [start, end], as (from, count) steps."""
    edges: list[tuple[float, int]] = []
    for a, b in intervals:
        a, b = max(a, start), min(b, end)
        if b > a:
            edges += [(a, 1), (b, -1)]
    edges.sort()
    steps, depth = [(start, 0)], 0
    for at, delta in edges:
        depth += delta
        steps.append((at, depth))
    steps.append((end, depth))
    return steps


def overlap_seconds(processing: Processing, start: float, end: float) -> float:
    """Seconds, summed over partitions, during which two or more workers processed the same one."""
    total = 0.0
    for intervals in processing.closed.values():
        steps = _coverage(intervals, start, end)
        total += sum(b - a for (a, depth), (b, _) in itertools.pairwise(steps) if depth >= 2)
    return total


def longest_unprocessed(processing: Processing, pids: Iterable[str], start: float, end: float) -> float:
    """The longest stretch within [start, end] during which some partition had nobody processing it."""
    longest = 0.0
    for pid in pids:
        steps = _coverage(processing.closed.get(pid, []), start, end)
        gap_from: float | None = None
        for at, depth in steps:
            if depth == 0 and gap_from is None:
                gap_from = at
            elif depth > 0 and gap_from is not None:
                longest = max(longest, at - gap_from)
                gap_from = None
        if gap_from is not None:
            longest = max(longest, end - gap_from)
    return longest


def min_moves(
    holders: Mapping[str, str | None], eligible: Collection[str], pins: Mapping[str, str] | None = None
) -> int:
    """The fewest live-to-live moves that reach balance from ``holders``.

    ``holders`` maps every partition to its live holder (None: free, or held by a dead worker;
    taking those is no move). ``eligible`` are the workers that should end up sharing the load
    (drained workers are live holders that are not eligible). A partition must move if its holder
    is not eligible or it is pinned to someone else; then each eligible worker's load (pinned
    partitions included) must come within ``P // N .. P // N + 1``, the ``P % N`` most loaded
    workers keeping the extra one, and every partition above a worker's target is one more move.
    """
    pins = pins or {}
    if not eligible:
        return 0
    load = dict.fromkeys(eligible, 0)
    forced = 0
    for pid, holder in holders.items():
        pin = pins.get(pid) if pins.get(pid) in load else None
        if holder is not None and (holder not in load or (pin is not None and pin != holder)):
            forced += 1
        if pin is not None:
            load[pin] += 1
        elif holder in load:
            load[holder] += 1
    floor, extra = divmod(len(holders), len(load))
    ranked = sorted(load.values(), reverse=True)
    surplus = sum(max(0, c - (floor + 1 if rank < extra else floor)) for rank, c in enumerate(ranked))
    return forced + surplus


def load_spread(loads: Iterable[float]) -> float:
    """The most loaded worker's load over the mean load (1.0: even; 1.0 too when nothing is loaded)."""
    values = list(loads)
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0


def _number(value: float, digits: int) -> float | int:
    rounded = round(value, digits)
    return int(rounded) if rounded == int(rounded) else rounded


def spread(values: Sequence[float], digits: int = 3) -> dict[str, float | int | None]:
    """``{"median", "max"}`` of ``values``, whole numbers as ints (None for both when there are none)."""
    if not values:
        return {"median": None, "max": None}
    return {"median": _number(statistics.median(values), digits), "max": _number(max(values), digits)}


def loads_of(held: Mapping[str, Sequence[str]], rates: Mapping[str, float]) -> dict[str, float]:
    """Events per second each worker holds, given the partitions it holds and every partition's rate."""
    return {w: sum(rates[p] for p in ps) for w, ps in held.items()}


def even_by_load(held: Mapping[str, Sequence[str]], rates: Mapping[str, float]) -> bool:
    """No move of one partition to the least loaded worker evens a pair by half a typical
    partition's rate (the load-weighted plan's own rule, judged by the true rates)."""
    typical = sorted(rates.values())[len(rates) // 2]
    held_lists = {w: list(ps) for w, ps in held.items()}
    return best_move(list(held), loads_of(held, rates), held_lists, dict(rates), STEP * typical) is None
