"""The five time spans of ``001_552f7490fd2b6e08.txt``, the race's wait formula, and measured load.

The wait formula. 001 states it twice, and the two statements disagree:

- owner (already processing the partition): "held partitions times the delay *minus half* of
  this delay", then "(So basically (held - 1) * delay)";
- anyone else: "held partitions *plus one* times the delay", then "((held + 0.5) * delay)".

Read either way with matching terms, the pairs are (n - 1, n + 1) and (n - 1/2, n + 1/2). With
the owner holding n_o partitions (the challenged one included) and a challenger n_c, the
challenger wins when its wait is shorter, i.e. when n_o - n_c exceeds the sum of the two offsets:

- (n - 1/2, n + 1/2): sum 1. At n_o - n_c = 1 the waits are *equal*: with 7 partitions on two
  nodes (4 and 3, the balanced state) every challenge is a coin toss decided by scheduler
  jitter, the winner ends up with 4 and the next challenge tosses again: partitions jump between
  nodes for ever, which is exactly what 001 set out to avoid.
- (n - 1, n + 1): sum 2. The tie moves to n_o - n_c = 2 (say 4 and 2), a state that *should*
  move; it does only on a lucky toss, so imbalance lingers and a move needs several challenges.
- (n - 1, n + 1/2) — the two parenthesised forms — and (n - 1/2, n + 1) — the two prose forms:
  sum 3/2. A challenger wins exactly when n_o - n_c >= 2, i.e. exactly when moving the
  partition makes the two counts closer, and never when the counts differ by one or less, and
  every comparison is decided by at least half a delay, never by a tie. That keeps a single
  partition on its node (owner 0 vs others d/2) and spreads load to within one.

We use (n - 1, n + 1/2): the owner counts what it would hold *without* the challenged partition,
the challenger adds half a partition of hysteresis. That pair carries over to measured load
unchanged (the load-weighted variant, 001's last paragraph): the owner subtracts the challenged
partition's own measured weight, which it knows because it processes it; the challenger, which
does not, adds the fixed half. (The prose pair would need the challenger to add the challenged
partition's weight, which only the owner can measure.)

Waits are capped below the minimum lease grab time: a racer whose HSETNX came after the winner
cleared its grab mark would win a second race nobody else is running. A node that would wait
longer than the cap cannot win anyway against anyone who waits less, so it waits the cap (the
owner one delay less, so that among saturated nodes the owner still wins) and a racer that wakes
past the cap (an event loop stalled) does not try at all.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RaceTimes:
    """001's five spans (seconds), with its defaults where it gives them and ours where it does not.

    - ``normal_lease``: 001 uses 60 s. Every partition is challenged about once per this span.
    - ``maximum_lease``: "significantly longer than the normal lease time": 90 s. A grab mark
      older than this is a winner that died mid-race; it is cleared. Also the bound on how long a
      killed node's partitions wait: the next challenge (within a normal lease time) plus the
      maximum shutdown time fits inside it.
    - ``maximum_shutdown``: how long a winner waits for the loser's "allocated" notice: 20 s,
      more than the runtime's default graceful stop of a pump (10 s). Also the local lease: a node
      that has not reached the store for this long stops processing, so a node cut off from Redis
      (which cannot hear that it lost) never overlaps a winner by more than this.
    - ``minimum_lease_grab``: "less than the normal lease time": 30 s, half of it. Must outlast
      the longest race (see the cap below).
    - ``leases_held_delay``: 001 works "in the 100 to 500 millisecond range": 250 ms. Half of it is
      the margin that decides every race, so it must dwarf pub/sub delivery and scheduling jitter.

    ``jitter``: each node's grab timer fires after ``normal_lease * (1 + U(0, jitter))``, so that
    usually one node publishes a challenge and the others, hearing it, reset theirs.
    """

    normal_lease: float = 60.0
    maximum_lease: float = 90.0
    maximum_shutdown: float = 20.0
    minimum_lease_grab: float = 30.0
    leases_held_delay: float = 0.25
    jitter: float = 0.05

    def __post_init__(self) -> None:
        spans = (self.normal_lease, self.maximum_lease, self.maximum_shutdown, self.minimum_lease_grab)
        if min(*spans, self.leases_held_delay) <= 0 or not 0 <= self.jitter < 1:
            raise ValueError(f"every race span must be > 0 and jitter in [0, 1): {self}")
        if self.minimum_lease_grab >= self.normal_lease:
            raise ValueError(
                f"the minimum lease grab time ({self.minimum_lease_grab:g}s) must be less than the normal "
                f"lease time ({self.normal_lease:g}s)"
            )
        if self.leases_held_delay * 4 > self.wait_cap:
            raise ValueError(
                f"the current-leases-held delay ({self.leases_held_delay:g}s) leaves room for fewer than 4 "
                f"partitions per node before the minimum lease grab time ({self.minimum_lease_grab:g}s)"
            )
        # A grab mark lives from the win (at most wait_cap after the challenge) until the winner has
        # started, which takes at most the maximum shutdown time, and at least minimum_lease_grab.
        longest_mark = self.wait_cap + max(self.minimum_lease_grab, self.maximum_shutdown)
        if self.maximum_lease <= max(self.normal_lease * (1 + self.jitter), longest_mark):
            raise ValueError(
                f"the maximum lease time ({self.maximum_lease:g}s) must be longer than the normal lease time "
                f"with jitter ({self.normal_lease * (1 + self.jitter):g}s) and than a grab mark can live "
                f"({longest_mark:g}s)"
            )

    @property
    def wait_cap(self) -> float:
        """The longest any racer waits before its HSETNX (see the module docstring)."""
        return 0.8 * self.minimum_lease_grab

    @classmethod
    def scaled(cls, normal_lease: float, leases_held_delay: float | None = None) -> RaceTimes:
        """The defaults' proportions around another normal lease time (for tests and the simulator)."""
        base = cls()
        ratio = normal_lease / base.normal_lease
        delay = leases_held_delay if leases_held_delay is not None else base.leases_held_delay * min(1.0, ratio * 4)
        return cls(
            normal_lease=normal_lease,
            maximum_lease=base.maximum_lease * ratio,
            maximum_shutdown=base.maximum_shutdown * ratio,
            minimum_lease_grab=base.minimum_lease_grab * ratio,
            leases_held_delay=delay,
        )


def race_wait(held: float, challenged: float | None, times: RaceTimes) -> float:
    """Seconds to wait before the HSETNX of a race.

    ``held``: this node's load (partitions processing or starting, or their summed weights).
    ``challenged``: the challenged partition's weight if this node is processing it (the owner),
    None otherwise. Owner: ``(held - challenged) * d`` — ``(n - 1) * d`` when counting; others:
    ``(held + 1/2) * d``. See the module docstring for why this reading.
    """
    d = times.leases_held_delay
    if challenged is not None:
        return min(max(0.0, held - challenged) * d, times.wait_cap - d)
    return min((held + 0.5) * d, times.wait_cap)


@dataclass
class LoadWeights:
    """The load-weighted variant: a partition weighs its measured events per second over ``unit``.

    ``processed(pid)`` is how many events this node has handled on ``pid`` so far (a counter that
    may restart from 0 when its pump restarts). Rates are smoothed over ``smoothing`` seconds. A
    partition weighs at least ``floor`` (an idle partition is not free to hold: without a floor,
    idle nodes would tie at 0 and every partition of an idle hub could end up on one node).
    Counting partitions is the case ``floor = 1`` with no load.
    """

    processed: Callable[[str], int]
    unit: float = 100.0
    floor: float = 0.1
    smoothing: float = 30.0
    rates: dict[str, float] = field(default_factory=dict)
    _seen: dict[str, tuple[float, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.unit <= 0 or self.floor <= 0 or self.smoothing <= 0:
            raise ValueError("unit, floor and smoothing must be > 0")

    def sample(self, pids: Iterable[str], now: float) -> None:
        """Update the rates of ``pids`` from their counters at monotonic time ``now``."""
        keep = set(pids)
        for pid in list(self._seen):
            if pid not in keep:
                del self._seen[pid]
                self.rates.pop(pid, None)
        for pid in keep:
            count = self.processed(pid)
            before = self._seen.get(pid)
            self._seen[pid] = (now, count)
            if before is None or now <= before[0]:
                continue
            elapsed = now - before[0]
            done = count - before[1] if count >= before[1] else count  # the pump restarted
            alpha = 1 - math.exp(-elapsed / self.smoothing)
            previous = self.rates.get(pid, done / elapsed)
            self.rates[pid] = previous + alpha * (done / elapsed - previous)

    def weight(self, pid: str) -> float:
        return max(self.rates.get(pid, 0.0) / self.unit, self.floor)


class GrabTimers:
    """One timer per partition (001 step 1), in a heap: ``set`` moves a timer, ``pop_due`` returns
    the partitions whose timer has fired (each must be ``set`` again), ``next_at`` the earliest."""

    def __init__(self) -> None:
        self._at: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []

    def __contains__(self, pid: object) -> bool:
        return pid in self._at

    def at(self, pid: str) -> float | None:
        return self._at.get(pid)

    def set(self, pid: str, at: float) -> None:
        self._at[pid] = at
        heapq.heappush(self._heap, (at, pid))

    def pop_due(self, now: float) -> list[str]:
        due = []
        while self._heap and self._heap[0][0] <= now:
            at, pid = heapq.heappop(self._heap)
            if self._at.get(pid) == at:  # else a later set() replaced this entry
                due.append(pid)
        return due

    def next_at(self) -> float | None:
        while self._heap and self._at.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None
