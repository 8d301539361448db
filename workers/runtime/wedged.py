"""Readers that stop answering without failing (issue 35): a read that has not returned for a bound
while the hub holds events past what the pump handed over.

A reader's link can hang without an error: the hub stops answering one partition's link and keeps
it open, and the pump waits in its read for ever while its lease is renewed, so nobody else takes
the partition (the silent stall of Microsoft's processors). ``WedgeWatch`` looks at the running
pumps with every cycle and renewal step: a pump inside a read (``PartitionPump.reading_since``) with
no handler call in hand that has handed nothing over across looks ``bound`` seconds apart (so
found within the bound and one look) is asked about once, on a
thread of its own, with a deadline: the hub's properties of that partition. If events wait behind
it (the last enqueued sequence number past the last one handed over) the pump is wedged, and the
caller restarts it as a failing reader (``stuck.ReaderWatch``: restarted first, released for
another worker once it has kept failing for ``LEASEBOARD_READER_STUCK``). A partition with nothing
waiting is not wedged, however long its read: it is asked about again only after another bound.
A hub that does not answer the question is the hub watch's business (``hubwatch.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from workers.sources.base import PartitionProperties

log = logging.getLogger("leaseboard.worker")


class Reading(Protocol):
    """What the watch reads of a pump (``PartitionPump``)."""

    reading_since: float | None

    @property
    def stopping(self) -> bool: ...

    @property
    def paused(self) -> bool: ...

    def in_hand(self) -> object | None: ...

    def handed(self) -> int | None:
        """The last sequence number handed over, else the checkpoint its pump started after."""
        ...


class WedgeWatch:
    """Pumps stuck in a read while events wait. ``properties`` asks the hub about one partition
    (blocking: run on a thread, given up after ``answer_within`` seconds); ``wedged(pid, since)`` is
    called on the event loop for each pump found wedged, ``since`` when its read began."""

    def __init__(
        self,
        bound: float,
        properties: Callable[[str], PartitionProperties],
        clock: Callable[[], float],
        wedged: Callable[[str, float], None],
        answer_within: float = 5.0,
    ) -> None:
        self.bound = bound
        self._properties = properties
        self._clock = clock
        self._wedged = wedged
        self._answer_within = answer_within
        # partition -> (its read's start and the last sequence handed over, when first seen so): a
        # read that hands events over (a sync pump's read and handling in one call) is moving
        self._seen: dict[str, tuple[tuple[float, int | None], float]] = {}
        self._asking: dict[str, asyncio.Task[None]] = {}

    def look(self, pumps: Mapping[str, Reading]) -> None:
        """Ask about every pump in a read that has handed nothing over for ``bound`` seconds or more (0:
        never), one question a partition at a time; forget the partitions no longer reading."""
        if self.bound <= 0:
            return
        now = self._clock()
        for pid, pump in pumps.items():
            since = pump.reading_since
            if since is None or pump.stopping or pump.paused or pump.in_hand() is not None:
                self._seen.pop(pid, None)
                continue
            mark = (since, pump.handed())
            seen = self._seen.get(pid)
            if seen is None or seen[0] != mark:  # counted from this look: it may have moved just before
                seen = self._seen[pid] = (mark, now)
            if now - seen[1] < self.bound or pid in self._asking:
                continue
            task = asyncio.get_running_loop().create_task(self._ask(pid, pump, mark), name=f"wedged? {pid}")
            self._asking[pid] = task
        for pid in [p for p in self._seen if p not in pumps]:
            del self._seen[pid]

    async def _ask(self, pid: str, pump: Reading, mark: tuple[float, int | None]) -> None:
        try:
            found = await asyncio.wait_for(asyncio.to_thread(self._properties, pid), self._answer_within)
        except Exception as exc:  # the hub did not answer: the hub watch's business
            log.debug("partition %s: the hub's properties could not be read (%s)", pid, exc)
            self._seen[pid] = (mark, self._clock())  # asked again after another bound
            return
        finally:
            self._asking.pop(pid, None)
        handed = mark[1]
        waiting = found.last_enqueued_sequence_number > (-1 if handed is None else handed)
        if waiting and (pump.reading_since, pump.handed()) == mark and not pump.stopping:
            self._seen.pop(pid, None)
            self._wedged(pid, mark[0])
        else:
            self._seen[pid] = (mark, self._clock())

    def cancel(self) -> None:
        for task in self._asking.values():
            task.cancel()
        self._asking.clear()
