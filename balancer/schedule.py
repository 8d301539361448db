"""When a worker reads, renews and wakes: one pure function, ``next_due``, that the runtime's processor
(``workers.runtime.processor``) and the simulator (``balancer.sim``) both drive their coordinators by.

Everything comes in as an argument (``Inputs``: the clock, the interval, the jitter and the random draws
that spread it, the last cycle's outcome, whether news was heard, the coordinator's ``quiet_until`` and
``next_renewal``) and a ``Due`` comes out; nothing here reads a clock or ``random``, sleeps or calls a
store. The driver keeps its timers and wake-ups and sleeps until ``Due.wake_at``; there it runs a
renewal step when ``Due.renews``, else the cycle, and asks again.

The rules, in order:

- stopping: nothing more is due (``Due.stop``);
- before the first successful cycle, after failed ones: the interval doubling per failure, at most
  ``backoff_max`` (a fleet started before its store does not hammer it);
- "soon" (``soon_after``): a quarter interval, at most a second, after the announcing first cycle (so
  simultaneous starters have all announced themselves) and, when polling (``poll_waiting``: no release
  notices reach this worker), while a handoff to it is pending;
- a quiet wait: after a steady cycle that changed nothing, where notices cross processes and no news
  came since its read, until the coordinator's ``quiet_until`` (less up to the jitter: never later),
  when that is longer than one interval; news ends it (``Due.quiet``). At 1024 partitions and 64
  workers an idle fleet's CPU was mostly its steady cycles; at a 2 s interval and a 10 s expiry this
  reads every 3.5 s;
- else one interval; every wait but the quiet one is spread by ``interval * (1 ± jitter)``;
- no later than the last cycle's ``recheck_at``: a partition it wants but left free (released by a
  worker that left, ``cooperative.vacated_for``) may be claimed then;
- a renewal step comes first when the coordinator has a lease due (``next_renewal``) before the read;
- during a quiet wait the driver looks at the hub's partitions (``Balancer.partitions_changed``: the
  partition source, no store request) every interval: no store's channel tells of partitions added,
  and a fleet waiting quietly would otherwise find them only at its next read (53 s at 30 s / 180 s).
  A change is news: the worker reads at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

SOON_SHARE, SOON_MAX = 0.25, 1.0  # "soon": a quarter interval, at most a second
BACKOFF_DOUBLINGS = 30  # 2 ** 30 intervals: far past any backoff_max, and no overflow
BACKOFF_MAX = 30.0  # seconds: the usual longest wait between failed first cycles (or one interval, if longer)


class Reported(Protocol):
    """What the schedule reads of a cycle's report (``balancer.protocol.CycleReport``)."""

    @property
    def announced(self) -> bool: ...
    @property
    def waiting(self) -> tuple[str, ...]: ...
    @property
    def planned(self) -> bool: ...
    @property
    def gained(self) -> tuple[object, ...]: ...
    @property
    def lost(self) -> tuple[object, ...]: ...
    @property
    def recheck_at(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Last:
    """The outcome of the last cycle that ran: the part of its report the schedule depends on."""

    announced: bool = False  # the worker's first cycle, which only announced it
    waiting: bool = False  # a handoff to this worker is pending
    steady: bool = False  # it skipped its plan and changed nothing (no gain, no loss, no wait)
    recheck_at: float | None = None  # a partition it left free may be claimed then: read no later

    @classmethod
    def of(cls, report: Reported) -> Last:
        changed = report.planned or bool(report.gained or report.lost or report.waiting)
        steady = not changed and report.recheck_at is None
        recheck = report.recheck_at
        return cls(announced=report.announced, waiting=bool(report.waiting), steady=steady, recheck_at=recheck)


@dataclass(frozen=True, slots=True)
class Inputs:
    """What the schedule is decided from. Times are on the coordinator's monotonic clock."""

    now: float
    interval: float
    jitter: float = 0.0  # the share each wait is spread by, in [0, 1)
    # Two uniform draws in [0, 1): the first spreads the wait for the read, the second the quiet wait.
    draws: tuple[float, float] = (0.5, 0.5)
    last: Last | None = None  # the last cycle's outcome; None: it failed (or none ran yet)
    cycles: int = 0  # successful cycles so far
    start_failures: int = 0  # cycles failed before the first successful one
    backoff_max: float = BACKOFF_MAX  # seconds: the longest wait between failed first cycles
    poll_waiting: bool = True  # no release notices reach this worker: it polls while a handoff is pending
    news: bool = False  # a notice naming no partition (a join, a control) came since the last read was sent
    quiet_until: float | None = None  # the coordinator's ``quiet_until(interval)``
    next_renewal: float | None = None  # the coordinator's ``next_renewal()`` (None: no renewal steps)
    stopping: bool = False
    # The read already decided (between cycles, as renewal steps are run); None: decide it now.
    read_at: float | None = None
    quiet: bool = False  # with ``read_at``: the wait under way is a quiet one (it looks at the partitions)


@dataclass(frozen=True, slots=True)
class Due:
    """When the next read, renewal step and wake-up are due."""

    read_at: float  # the next cycle
    renew_at: float | None = None  # a renewal step due before that read, else None
    quiet: bool = False  # the wait for ``read_at`` is a quiet one: news ends it
    stop: bool = False  # stopping: nothing is due
    look_at: float | None = None  # a quiet wait's look at the partitions before that read, else None

    @property
    def wake_at(self) -> float:
        """When the driver wakes next: a renewal step or a look if one comes first, else the read."""
        return min(t for t in (self.read_at, self.renew_at, self.look_at) if t is not None)

    @property
    def renews(self) -> bool:
        """The wake-up at ``wake_at`` is for a renewal step (then ask again), not for the cycle."""
        return self.renew_at is not None and self.renew_at == self.wake_at

    @property
    def looks(self) -> bool:
        """The wake-up at ``wake_at`` is for a look at the partitions (then ask again), not for the cycle."""
        return self.look_at is not None and self.look_at == self.wake_at


def soon_after(last: Last, interval: float, *, poll_waiting: bool = True) -> float | None:
    """The delay before the next cycle when ``last`` calls for one sooner than ``interval``, else None."""
    if last.announced or (poll_waiting and last.waiting):
        return min(interval * SOON_SHARE, SOON_MAX)
    return None


def spread(seconds: float, jitter: float, draw: float) -> float:
    """``seconds`` spread by ±``jitter`` of itself, by a uniform ``draw`` in [0, 1)."""
    return seconds * (1 + jitter * (2 * draw - 1))


def quiet_delay(given: Inputs) -> float | None:
    """The quiet wait after a steady cycle (see the module's rules), or None: no quiet wait."""
    last = given.last
    if given.poll_waiting or given.news or last is None or not last.steady or given.quiet_until is None:
        return None
    if soon_after(last, given.interval, poll_waiting=False) is not None:
        return None
    delay = (given.quiet_until - given.now) * (1 - given.jitter * given.draws[1])
    return delay if delay > given.interval else None


def read_delay(given: Inputs) -> tuple[float, bool]:
    """The delay until the next cycle from ``given.now``, and whether the wait is a quiet one."""
    base = given.interval
    if given.cycles == 0 and given.start_failures:
        doublings = min(given.start_failures - 1, BACKOFF_DOUBLINGS)
        base = min(given.interval * 2**doublings, given.backoff_max)
    elif given.last is not None:
        sooner = soon_after(given.last, given.interval, poll_waiting=given.poll_waiting)
        quiet = None if sooner is not None else quiet_delay(given)
        if quiet is not None:
            return quiet, True
        base = sooner or base
    return spread(base, given.jitter, given.draws[0]), False


def next_due(given: Inputs) -> Due:
    """When the next read, renewal step and wake-up are due (see the module's rules).

    With ``given.read_at`` set (between cycles), the read stays where it was decided and only the
    renewal step and the look are decided again (after a step, ``next_renewal`` has moved on; a look
    is one interval after the last wake-up); ``given.quiet`` then says whether the wait is quiet."""
    if given.stopping:
        return Due(read_at=given.now, stop=True)
    quiet = given.quiet
    read_at = given.read_at
    if read_at is None:
        delay, quiet = read_delay(given)
        read_at = given.now + delay
        recheck = None if given.last is None else given.last.recheck_at
        if recheck is not None and recheck < read_at:  # a partition left free may be claimed then
            read_at, quiet = max(given.now, recheck), False
    renew_at = given.next_renewal
    if renew_at is not None and renew_at >= read_at:
        renew_at = None  # the cycle renews it (or the step after it)
    look_at = given.now + given.interval if quiet else None
    if look_at is not None and look_at >= read_at:
        look_at = None  # the read sees them
    return Due(read_at=read_at, renew_at=renew_at, quiet=quiet, look_at=look_at)
