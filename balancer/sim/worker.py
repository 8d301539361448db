"""One simulated worker's side of the schedule: what the runtime's processor keeps to drive its
coordinator (``workers.runtime.processor``), on simulated time.

Like the processor it asks ``balancer.schedule.next_due`` when to read, renew and wake, from the
last cycle's report, the news heard since that cycle's read, whether it polls while waiting (no
release notices: the Blob store without a channel layer) and the coordinator's ``quiet_until`` and
``next_renewal``; it sleeps until the answer, and a notice ends the sleep as it ends the processor's:
a release or an operator's control (``wake``) always, a join (``news``) only a quiet wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from balancer.errors import StoreUnavailable
from balancer.notices import Released, concerns, wakes
from balancer.protocol import CycleReport
from balancer.schedule import BACKOFF_MAX, Due, Inputs, Last, next_due


class Scheduled(Protocol):
    """What the schedule asks of a coordinator (``balancer.protocol.Balancer`` has it)."""

    def quiet_until(self, interval: float | None = None) -> float | None: ...

    def next_renewal(self) -> float | None: ...

    async def partitions_changed(self) -> bool: ...


class SimWorker:
    """The schedule's state of one simulated worker (see the module docstring)."""

    def __init__(
        self,
        owner_id: str,
        coordinator: Scheduled,
        *,
        interval: float,
        jitter: float,
        poll_waiting: bool,
        rng: random.Random,
        now: Callable[[], float],
    ) -> None:
        self.owner_id = owner_id
        self.coordinator = coordinator
        self.interval, self.jitter, self.poll_waiting = interval, jitter, poll_waiting
        self._rng = rng
        self._now = now
        self.last: CycleReport | None = None  # the last cycle's report (None: it failed)
        self.cycles = 0  # successful cycles
        self.start_failures = 0  # failed cycles before the first successful one
        self.heard = False  # news heard since the last cycle's read was sent
        self.quiet = False  # the wait under way is a quiet one: news ends it
        self._woken = asyncio.Event()

    async def run(
        self,
        cycle: Callable[[], Awaitable[CycleReport]],
        renew: Callable[[], Awaitable[None]],
        until: Callable[[float], Awaitable[bool]],
    ) -> None:
        """Cycle, then wait as the schedule says, renewing where a lease falls due before the next read
        and looking at the partitions in a quiet wait, for ever (until cancelled): the runtime's
        ``EventProcessor.run``. ``until(at)`` waits until ``at`` or a notice (True)."""
        while True:
            report = None
            with contextlib.suppress(StoreUnavailable):  # as the runtime: try again at the next read
                report = await cycle()
            self.cycled(report)
            due = self.due()
            self.quiet, read_at = due.quiet, due.read_at
            while not await until(due.wake_at) and (due.renews or due.looks):
                if due.renews:
                    await renew()
                if due.looks and await self.coordinator.partitions_changed():
                    break  # partitions added (or gone): news, read now
                due = self.due(read_at)
            self.quiet = False

    def wake(self) -> None:
        """A release notice (or an operator's rebalance): the next cycle now."""
        self._woken.set()

    def news(self) -> None:
        """A notice naming no partition: ends a quiet wait; else the next cycle reads it anyway."""
        self.heard = True
        if self.quiet:
            self.wake()

    def hear(self, notice: Released) -> None:
        """A notice from the store's channel, as ``workers.releases.Notices`` hands it on."""
        if wakes(notice):  # a release, an operator's control
            self.wake()
        else:  # a join
            self.news()

    def cycled(self, report: CycleReport | None) -> None:
        """A cycle ended (``report`` None: it failed)."""
        self.last = report
        if report is not None:
            self.cycles += 1
        elif self.cycles == 0:
            self.start_failures += 1

    def due(self, read_at: float | None = None) -> Due:
        """What is due next (``read_at``: between cycles, the read already decided)."""
        coordinator = self.coordinator
        draws = (0.5, 0.5) if read_at is not None else (self._rng.random(), self._rng.random())
        given = Inputs(
            now=self._now(),
            interval=self.interval,
            jitter=self.jitter,
            draws=draws,
            last=None if self.last is None else Last.of(self.last),
            cycles=self.cycles,
            start_failures=self.start_failures,
            backoff_max=max(self.interval, BACKOFF_MAX),
            poll_waiting=self.poll_waiting,
            news=self.heard,
            quiet_until=coordinator.quiet_until(self.interval),
            next_renewal=coordinator.next_renewal(),
            read_at=read_at,
            quiet=self.quiet,
        )
        return next_due(given)

    async def wait(self, at: float) -> bool:
        """Until ``at``, or until woken; True when woken (a wake-up that came meanwhile counts)."""
        woken = self._woken
        if not woken.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), max(0.0, at - self._now()))
        was = woken.is_set()
        woken.clear()
        return was


def deliver(notice: Released, workers: Iterable[SimWorker], latency: float | None) -> None:
    """``notice`` reaches each of ``workers`` it concerns ``latency`` seconds from now, as a store's
    channel carries it (None: no notices), a release as a wake-up, a join or a control as news."""
    if latency is None:
        return
    loop = asyncio.get_running_loop()
    for worker in workers:
        if concerns(notice, notice.ref, worker.owner_id):
            loop.call_later(latency, worker.hear, notice)
