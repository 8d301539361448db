"""Readers that stop answering without failing (issue 35): a pump that hands nothing over for a bound
while the hub holds events past what it handed over.

A reader's link can hang without an error: the hub stops answering one partition's link and keeps
it open, and the pump waits for ever while its lease is renewed, so nobody else takes the partition
(the silent stall of Microsoft's processors). It waits in its read (a reader whose read blocks) or
idle (the Event Hubs reader, whose read returns what the SDK's long poll queued: nothing, and whose
wake-up never comes). ``WedgeWatch`` looks at the running pumps with every cycle and renewal step: a
pump with no handler call in hand that has handed nothing over across looks ``bound`` seconds apart
(so found within the bound and one look) is asked about, with a deadline: the hub's properties of
that partition, one question at a time on a thread of the watch's own (pumps in a read first, then
the longest idle: an idle fleet asks the hub at most once a look, not once a partition). If events
wait behind it (the last enqueued sequence number past the last one handed over) and it is still
where it was at the next look (a pump woken just as the hub answered has read them by then), the
pump is wedged, and the caller restarts it as a failing reader (``stuck.ReaderWatch``: restarted
first, released for another worker once it has kept failing for ``LEASEBOARD_READER_STUCK``). A
partition with nothing waiting is not wedged, however long it waits: it is asked about again only
after another bound. A hub that does not answer the question is the hub watch's (``hubwatch.py``).

Looks come with the worker's cycles and renewal steps, seconds apart in a quiet fleet, which made a
wedge found up to two looks late (4.3-10.6 s after the wedge at a 4 s bound in the chaos suite). So
the watch also looks on a timer of its own (given ``sleep`` and ``pumps``): while a pump it has seen
hand events over is watched, every quarter bound (its last move known to that), at the moment it
reaches the bound, and ``CONFIRM`` after an answer that events wait behind it. A partition found
with nothing waiting is watched on the timer no more until it moves again, so an idle fleet asks the
hub no more often than before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from balancer.aio import off_loop
from workers.runtime.pump import Sleep
from workers.runtime.timer import OneTimer
from workers.sources.base import PartitionProperties

log = logging.getLogger("leaseboard.worker")
CONFIRM = 0.25  # seconds from an answer that events wait to the look that confirms the pump is still there


class Reading(Protocol):
    """What the watch reads of a pump (``PartitionPump``)."""

    reading_since: float | None

    @property
    def stopping(self) -> bool: ...

    @property
    def paused(self) -> bool: ...

    def calling(self) -> tuple[object, float] | None: ...

    def handed(self) -> int | None:
        """The last sequence number handed over, else the checkpoint its pump started after."""
        ...


class WedgeWatch:
    """Pumps that hand nothing over while events wait. ``properties`` asks the hub about one partition
    (blocking: run on the watch's thread, given up after ``answer_within`` seconds); ``wedged(pid,
    since)`` is called on the event loop for each pump found wedged, ``since`` when it stopped moving."""

    def __init__(
        self,
        bound: float,
        properties: Callable[[str], PartitionProperties],
        clock: Callable[[], float],
        wedged: Callable[[str, float], None],
        answer_within: float = 5.0,
        *,
        sleep: Sleep | None = None,
        pumps: Callable[[], Mapping[str, Reading]] | None = None,
        stopped: Callable[[], bool] = lambda: False,
    ) -> None:
        self.bound = bound
        self._properties = properties
        self._clock = clock
        self._wedged = wedged
        self._answer_within = answer_within
        self._moving: set[str] = set()  # seen handing events over since last found with nothing waiting
        self._timer: OneTimer | None = None
        if sleep is not None and pumps is not None:
            self._timer = OneTimer(clock, sleep, stopped, lambda: self.look(pumps()), "wedge watch")
        # partition -> (the last sequence it handed over, when first seen there): a pump that moves
        # hands events over; whether it is in a read or idle at a look does not count (a wedged pump
        # woken by every write to its log reads, gets nothing, and idles again, between any two looks)
        self._seen: dict[str, tuple[int | None, float]] = {}
        self._asking: dict[str, asyncio.Task[None]] = {}
        # One question at a time, on a daemon thread of its own: a hub that hangs holds that thread
        # (past the deadline, until its client gives up), never a shared executor nor the exit.
        self._thread: asyncio.Future[PartitionProperties] | None = None
        # Found with events waiting behind them: wedged if still where they were at the next look (a
        # pump woken just as the hub answered has handed them over by then).
        self._suspects: dict[str, tuple[int | None, float]] = {}

    def look(self, pumps: Mapping[str, Reading]) -> None:
        """Ask about one pump (in a read first, else the longest still) that handed nothing over for
        ``bound`` seconds or more (0: never), if no question is under way; forget the others."""
        if self.bound <= 0:
            return
        now = self._clock()
        suspects, self._suspects = self._suspects, {}
        for pid, (handed, since) in suspects.items():
            pump = pumps.get(pid)
            if pump is not None and pump.handed() == handed and not pump.stopping and not pump.paused:
                self._seen.pop(pid, None)
                self._moving.discard(pid)
                self._wedged(pid, since)
        due: list[tuple[bool, float, str, Reading, int | None]] = []
        for pid, pump in pumps.items():
            if pump.stopping or pump.paused or pump.calling() is not None:
                self._seen.pop(pid, None)
                continue
            handed = pump.handed()
            seen = self._seen.get(pid)
            if seen is None or seen[0] != handed:  # counted from this look: it may have moved just before
                if seen is not None:
                    self._moving.add(pid)
                seen = self._seen[pid] = (handed, now)
            if now - seen[1] >= self.bound:
                due.append((pump.reading_since is None, seen[1], pid, pump, handed))
        for pid in [p for p in self._seen if p not in pumps]:
            del self._seen[pid]
        self._moving &= self._seen.keys()
        if due and not self._asking and (self._thread is None or self._thread.done()):
            _, _, pid, pump, handed = min(due, key=lambda item: item[:2])  # in a read first, oldest first
            task = asyncio.get_running_loop().create_task(self._ask(pid, pump, handed), name=f"wedged? {pid}")
            self._asking[pid] = task
        reached = [self._seen[p][1] + self.bound for p in self._moving]
        self._arm(min([t for t in reached if t > now], default=now + self.bound / 4) if reached else None, now)

    def _arm(self, at: float | None, now: float) -> None:
        """The timer's next look: at ``at`` (None: none), and a quarter bound from ``now`` at the latest."""
        if self._timer is not None:
            self._timer.arm(None if at is None else min(at, now + self.bound / 4), or_sooner=True)

    async def _ask(self, pid: str, pump: Reading, handed: int | None) -> None:
        self._thread = off_loop(self._properties, pid, name="wedged")
        self._thread.add_done_callback(lambda done: done.cancelled() or done.exception())  # ends unawaited
        try:
            found = await asyncio.wait_for(asyncio.shield(self._thread), self._answer_within)
        except Exception as exc:  # the hub did not answer: the hub watch's business
            log.debug("partition %s: the hub's properties could not be read (%s)", pid, exc)
            self._seen[pid] = (handed, self._clock())  # asked again after another bound
            return
        finally:
            self._asking.pop(pid, None)
        waiting = found.last_enqueued_sequence_number > (-1 if handed is None else handed)
        seen = self._seen.get(pid)
        if waiting and pump.handed() == handed and not pump.stopping:
            self._suspects[pid] = (handed, seen[1] if seen else self._clock())
            self._arm(self._clock() + CONFIRM, self._clock())
        else:
            self._seen[pid] = (handed, self._clock())
            if not waiting:
                self._moving.discard(pid)  # idle, not wedged: watched on the timer again once it moves

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for task in self._asking.values():
            task.cancel()
        self._asking.clear()
