"""One node of the lease race as every part of it sees it: who it is, what it holds, how busy it is.

``RaceNode`` is the state the parts of ``RaceCoordinator`` share (``challenge`` fires grab timers,
``steps`` runs races, ``leases`` keeps the ownership records, ``subscription`` hears the
notifications). It does no I/O: each part reads it and changes only what its own job changes.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from balancer.model import HubRef, OwnershipRecord
from balancer.race.times import LoadWeights, RaceTimes, race_wait

log = logging.getLogger("balancer.race.coordinator")  # every part of a node logs as the coordinator

# Times closer than this count as now: asyncio runs a timer that is due within its clock resolution
# at once, and a wait for less than one float step of the clock would never end.
EPSILON = 1e-6


@dataclass(eq=False)
class RaceNode:
    """Who this node is, what it holds, and what it last read of the race and of the operators."""

    ref: HubRef
    owner_id: str
    times: RaceTimes
    rng: random.Random
    clock: Callable[[], float]  # wall clock, for the events' ``at``
    monotonic: Callable[[], float]  # every span of the race is measured on it
    load: LoadWeights | None = None  # None: a partition weighs one
    owned: dict[str, OwnershipRecord] = field(default_factory=dict)  # processing, with the record held
    handing_off: set[str] = field(default_factory=set)  # lost a race, shutting down (step 3b)
    starting: set[str] = field(default_factory=set)  # won, not processing yet (step 4)
    drained: bool = False
    pins: dict[str, str] = field(default_factory=dict)  # partition -> the only node that may take it
    known: frozenset[str] = frozenset()  # the hub's partitions at the last cycle (empty before it)
    grab_seen: dict[str, str] | None = None  # the grab hash as last read (and kept up locally)
    stopped: bool = False
    _waiters: set[asyncio.Future[None]] = field(default_factory=set, init=False, repr=False)  # race waits

    def processing(self, pid: str) -> bool:
        """True while this node processes ``pid`` and has not lost it."""
        return pid in self.owned and pid not in self.handing_off

    def unknown(self, pid: str) -> bool:
        """True for a partition the hub does not have (as of the last cycle)."""
        return bool(self.known) and pid not in self.known

    def load_now(self) -> float:
        """``n`` of the wait formula: partitions processing (not being handed off) or won and
        starting; or, load-weighted, their weights (a starting partition weighs the floor)."""
        mine = [p for p in self.owned if p not in self.handing_off] + sorted(self.starting)
        if self.load is None:
            return float(len(mine))
        return sum(self.load.weight(p) if p in self.owned else self.load.floor for p in mine)

    def wait(self, pid: str, owner: bool, pinned_here: bool) -> float:
        """Seconds to wait from a challenge of ``pid`` before the HSETNX (``race_wait``)."""
        if pinned_here:
            return 0.0
        challenged = (self.load.weight(pid) if self.load is not None else 1.0) if owner else None
        return race_wait(self.load_now(), challenged, self.times)

    async def sleep_unless_load_drops(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if this node's load drops meanwhile (a loss shortens waits)."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(seconds, _resolve, woken)
        self._waiters.add(woken)
        try:
            await woken
        finally:
            timer.cancel()
            self._waiters.discard(woken)

    def load_dropped(self) -> None:
        """Wake every race waiting: with less held, its wait may be over."""
        for waiter in self._waiters:
            _resolve(waiter)


class Outages:
    """What of one node is failing now, each logged once when it starts and once when it ends."""

    def __init__(self, owner_id: str) -> None:
        self._owner_id = owner_id
        self._failing: set[str] = set()

    def failed(self, what: str, exc: BaseException) -> None:
        if what not in self._failing:
            self._failing.add(what)
            log.warning("%s: race %s failed: %s: %s; retrying", self._owner_id, what, type(exc).__name__, exc)

    def recovered(self, what: str) -> None:
        if what in self._failing:
            self._failing.discard(what)
            log.warning("%s: race %s works again", self._owner_id, what)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
