"""The event processor of one worker: the coordinator's cycle on its own schedule, one pump per
owned partition, and the graceful stop.

When the worker reads (cycles), renews and wakes is decided by one pure function,
``balancer.schedule.next_due``, which the simulator drives its workers by too; this module asks it
and keeps the wake-ups (``wake()``, ``news()``) and the sleeps until its answer (each wait:
``waiting.py``). Its pumps are ``pumps.py``'s (started, stopped, looked at, one deadline timer), its
planned moves away ``handoffs.py``'s; ``runner.py`` runs a process's workers until a signal.

Lease renewal never waits behind event processing (the failure mode of ``001_552f7490fd2b6e08.txt``):
the cycle loop is its own task and awaits nothing but the store; pumps run beside it, their
reads and sync handlers in threads of their own. Between two cycles the loop wakes for renewal
steps, when the coordinator says a lease is due (``Balancer.next_renewal``: a fixed share of the
expiry after its last renewal, whatever the interval), and renews just those leases with the ETags
it holds, without a listing; a failed one is tried again after a short backoff while the lease
still holds. When a cycle fails (store down), the worker
keeps its pumps running for as long as its local lease deadline (``Balancer.holds``) allows and
tries again next interval; the outage is logged once, not once per cycle. Past the deadline its
pumps pause (``pump.py``): they keep their position and pending checkpoint and resume when a cycle
renews the lease. A pump is stopped only when its partition is no longer in ``owned`` (a cycle
found it in another worker's hands, or lost it in this cycle even if it claimed it back: the
pump ends without a checkpoint) or is being handed off.

Stopping (SIGTERM, SIGINT, or ``stop()``): the cycle loop ends, every pump finishes the event in
hand and writes a final checkpoint, then ``release_all`` hands the partitions back so other
workers take them at once instead of after expiry. Each step is bounded by ``shutdown_timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

import workers.metrics as metrics
from balancer.lease import EARLY
from balancer.protocol import Balancer, CheckpointStore, CycleReport, Driver
from balancer.schedule import BACKOFF_MAX, Due, Inputs, Last, next_due
from workers.handlers import Handler
from workers.runtime.config import PumpConfig, PumpStats
from workers.runtime.deadletters import DeadLetters
from workers.runtime.handoffs import Handoffs
from workers.runtime.outages import WorkerLogs
from workers.runtime.pump import PartitionPump, Sleep
from workers.runtime.pumps import Pumps
from workers.runtime.slowcycles import CycleWatch
from workers.runtime.stopping import stop_worker
from workers.runtime.waiting import Waits
from workers.sources.base import EventSource

log = logging.getLogger("leaseboard.worker")
START_BACKOFF_MAX = BACKOFF_MAX  # seconds: the longest wait between tries when the store is down at start


def _check_timing(coordinator: Balancer, interval: float, jitter: float) -> None:
    if interval <= 0 or not 0 <= jitter < 1:
        raise ValueError(f"interval must be > 0 and jitter in [0, 1), got {interval}, {jitter}")
    if coordinator.expiry <= interval:
        raise ValueError(f"lease expiry ({coordinator.expiry}s) must be longer than the interval ({interval}s)")


class EventProcessor:
    """One worker: one owner id, one coordinator, its pumps."""

    def __init__(
        self,
        coordinator: Balancer,
        *,
        checkpoints: CheckpointStore,
        source: EventSource,
        handler: Handler,
        interval: float,
        pump_config: PumpConfig | None = None,
        dead_letters: DeadLetters | None = None,
        jitter: float = 0.1,
        shutdown_timeout: float = 10.0,
        rng: random.Random | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        _check_timing(coordinator, interval, jitter)
        self.coordinator = coordinator
        self._checkpoints = checkpoints
        self._source = source
        self._handler = handler
        self.interval = interval
        self._jitter = jitter
        self._watch = CycleWatch(self.owner_id, self.interval)  # a cycle over half the interval is warned once
        self.shutdown_timeout = shutdown_timeout
        self._config = pump_config or PumpConfig()
        self.dead_letters = dead_letters or DeadLetters(self._config.dead_letter_dir)
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._waits = Waits()
        self._pumpset = self._build_pumps()
        # Why this worker stopped by itself (too many stuck handler calls abandoned), else None.
        self.failure: str | None = None
        self.cycles = 0  # successful cycles
        # Called when this worker's cycle saw an operator's rebalance request: run_workers wakes every
        # worker of the process (a request may reach only one of them through the store).
        self.on_rebalance: Callable[[], None] | None = None
        # While a handoff to this worker is pending, cycle every quarter interval (``balancer.protocol.soon``)
        # to claim soon after the release; False where the store's release notices wake it instead.
        self.poll_waiting = True
        # While nothing changes, wait for the coordinator's ``quiet_until`` instead of one interval (``_due``):
        # only where notices cross processes (``poll_waiting`` False), so news wakes this worker at once.
        self._quiet = False  # the wait under way is a quiet one: news (``news()``) ends it
        self._news = False  # news heard since the last cycle's read was sent: no quiet wait after it
        self._last: CycleReport | None = None  # the last cycle's report (None: it failed)
        # cycle() and release() both rewrite the coordinator's lease table across awaits: never at once.
        self._lock = asyncio.Lock()
        self._handoffs = Handoffs(coordinator, self._pumpset, lock=self._lock, wait=self._handoff_wait)
        # True once ``run()`` renews between cycles (``_until_cycle``); told to the coordinator with each
        # cycle and renewal step (``_driver``), as is this processor's handoff hook.
        self.renewal_steps = False
        # Before its first cycle a worker holds nothing, so it may back off: a fleet started
        # against a store that is not up yet does not hammer it. Once it holds leases it retries
        # every interval, to renew them the moment the store answers again.
        self.start_backoff_max = max(interval, START_BACKOFF_MAX)
        self._start_failures = 0
        self._logs = WorkerLogs.of(coordinator, interval, self.start_backoff_max)

    def _build_pumps(self) -> Pumps:
        return Pumps(  # its deadline timer sleeps with the worker's sleep of the moment
            self.coordinator,
            idle_seconds=self._config.idle_seconds,
            build=self._new_pump,
            sleep=lambda seconds: self._sleep(seconds),
            stopped=lambda: self.stopping,
            handler_timeout=self._config.handler_timeout,
            reader_stuck=self._config.reader_stuck,
            source=self._source,
            quiet=self.interval,
            wake=self.wake,
            reader_wedged=self._config.reader_wedged,
        )

    @property
    def owner_id(self) -> str:
        return self.coordinator.owner_id

    @property
    def _driver(self) -> Driver:
        """How this processor drives its coordinator: it hands planned moves off itself (``Handoffs``,
        unless the coordinator was built with a hook of its own) and, once ``run()`` has started,
        renews between cycles."""
        return Driver(on_handoff=self._handoffs.start, renewal_steps=self.renewal_steps)

    @property
    def _pumps(self) -> dict[str, tuple[PartitionPump, asyncio.Task[PumpStats]]]:
        """Each partition's pump and its task (``Pumps.running``)."""
        return self._pumpset.running

    @property
    def _to_release(self) -> set[str]:
        """Handoffs whose pumps have stopped, not released yet (``Handoffs.to_release``)."""
        return self._handoffs.to_release

    @property
    def history(self) -> dict[str, PumpStats]:
        """The last finished pump of each partition."""
        return self._pumpset.history

    @property
    def pumping(self) -> frozenset[str]:
        """Partitions with a pump that is running (or paused) and not stopping."""
        return self._pumpset.pumping

    @property
    def paused(self) -> frozenset[str]:
        """Partitions whose pump is paused: its lease may have run out, and it waits for a renewal."""
        return self._pumpset.paused

    def stats(self) -> dict[str, PumpStats]:
        """The stats of each partition's current pump, else of its last one."""
        return self._pumpset.stats()

    # the loop ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask ``run`` to stop gracefully (safe to call more than once)."""
        self._waits.stop()

    @property
    def stopping(self) -> bool:
        return self._waits.stopped

    def wake(self) -> None:
        """Run the next cycle now instead of at the end of the interval (an operator's rebalance)."""
        self._waits.wake()

    def news(self) -> None:
        """News (a notice naming no partition: another worker joined, or an operator changed a control):
        cycle now if this worker is waiting quietly, longer than the interval; else its next cycle,
        within the interval, reads it anyway."""
        self._news = True
        if self._quiet:
            self.wake()

    async def run(self) -> None:
        """Cycle every interval, renewing leases as they fall due in between, until ``stop()``; then stop
        pumps, checkpoint and release."""
        log.info("worker %s starts (interval %gs, expiry %gs)", self.owner_id, self.interval, self.coordinator.expiry)
        self.renewal_steps = True  # this loop renews between cycles (``_until_cycle``)
        try:
            while not self.stopping:
                await self.step()
                await self._until_cycle(self._next_delay())
                self._quiet = False
        finally:
            await self.shutdown()

    async def _until_cycle(self, seconds: float) -> None:
        """Wait ``seconds`` for the next cycle (or until ``stop()`` or ``wake()``), running a renewal step
        whenever the schedule (``balancer.schedule.next_due``) has a lease fall due meanwhile, and, in a
        quiet wait, looking at the hub's partitions every interval (a change ends the wait)."""
        clock = self.coordinator.monotonic
        read_at = clock() + seconds
        while True:
            due = self._due(read_at)
            if not (due.renews or due.looks):
                await self._wait(due.read_at - clock())
                return
            if await self._wait(due.wake_at - clock()):
                return  # stopped, or woken for a cycle now
            if clock() < due.wake_at - EARLY:
                return  # the sleep came back early (a test's sleep that only yields): cycle
            if due.renews:
                await self.renew()
            if due.looks and await self._partitions_changed():
                return  # partitions added (or gone): news, read now

    async def _partitions_changed(self) -> bool:
        """Whether the hub's partitions changed since the last cycle (``Balancer.partitions_changed``);
        False when the partition source fails (the next cycle reads it, and says so)."""
        try:
            return await self.coordinator.partitions_changed()
        except Exception:
            return False

    async def renew(self) -> CycleReport | None:
        """One renewal step: renew the leases due now (``Balancer.renew``), then stop the pumps of
        any lost and wake the others. None when the store failed (tried again after a backoff)."""
        try:
            async with self._lock:
                report = await self.coordinator.renew(self._driver)
        except Exception as exc:
            metrics.STORE_ERRORS.labels(operation="cycle").inc()
            self._logs.renewal.failed(exc)
            return None
        self._logs.renewal.ok()
        self._reconcile(frozenset(e.partition_id for e in report.lost), start=False)
        return report

    async def step(self) -> CycleReport | None:
        """One cycle, then pumps started for new partitions and stopped for lost ones.

        Returns the cycle's report, or None when the store failed (leases are kept; pumps of
        partitions past their local deadline pause until a cycle renews them).
        """
        report: CycleReport | None = None
        try:
            async with self._lock:
                self._news = False  # what is heard from now on may have come after this cycle's read
                report = await self.coordinator.cycle(self._driver)
        except Exception as exc:
            metrics.STORE_ERRORS.labels(operation="cycle").inc()
            if self.cycles == 0:
                self._start_failures += 1
                self._logs.start.failed(exc)
            else:
                self._logs.cycle.failed(exc)
        else:
            self._logs.start.ok()
            self._logs.cycle.ok()
            self.cycles += 1
            metrics.CYCLE_DURATION.observe(report.seconds)
            metrics.OWNERSHIP_ROWS_READ.inc(report.rows)
            if not report.planned:
                metrics.STEADY_CYCLES.inc()
            self._watch.judge(report)
            if report.rebalance and self.on_rebalance is not None:
                self.on_rebalance()
        self._reconcile(frozenset(e.partition_id for e in report.lost) if report is not None else frozenset())
        self._last = report
        return report

    def _next_delay(self) -> float:
        """The wait after a cycle until the next one (``balancer.schedule.next_due``); notes whether it
        is a quiet wait, which news ends (``news()``)."""
        due = self._due()
        self._quiet = due.quiet
        return due.read_at - self.coordinator.monotonic()

    def _due(self, read_at: float | None = None) -> Due:
        """What the schedule says is due next, given this worker's state (with ``read_at``: between
        cycles, the read already decided). The random draws spread the wait for a read."""
        coordinator = self.coordinator
        draws = (0.5, 0.5) if read_at is not None else (self._rng.random(), self._rng.random())
        last = None if self._last is None else Last.of(self._last)
        given = Inputs(
            now=coordinator.monotonic(),
            interval=self.interval,
            jitter=self._jitter,
            draws=draws,
            last=last,
            cycles=self.cycles,
            start_failures=self._start_failures,
            backoff_max=self.start_backoff_max,
            poll_waiting=self.poll_waiting,
            news=self._news,
            quiet_until=coordinator.quiet_until(self.interval),
            next_renewal=coordinator.next_renewal() if self.renewal_steps else None,
            stopping=self.stopping,
            read_at=read_at,
            quiet=self._quiet,
        )
        return next_due(given)

    async def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until ``stop()`` or ``wake()``, whichever comes first (``Waits.wait``).
        True when ``stop()`` or ``wake()`` ended it."""
        seconds = max(0.0, seconds)
        # An injected sleep (a test's) is called here, by the worker; the loop's own is a timer instead.
        sleeping = None if self._sleep is asyncio.sleep else self._sleep(seconds)
        return await self._waits.wait(seconds, sleeping, self._watch.waited)

    @property
    def _waiting(self) -> asyncio.Future[object] | None:
        """What the wait under way waits on (None: no wait under way)."""
        return self._waits.waiting

    def _reconcile(self, lost: frozenset[str] = frozenset(), *, start: bool = True) -> None:
        """The pumps after a cycle (``start``) or a renewal step: see ``Pumps.reconcile``."""
        self._pumpset.reconcile(lost, start=start, cycles=self.cycles)
        if self.failure is None and (failure := self._pumpset.too_many_abandoned(self._config)) is not None:
            self.failure = failure
            self.stop()

    def _handoff_wait(self) -> float:
        """How long a handoff waits for the event in hand: the shutdown timeout, but short enough that
        the release comes before the receiver's handoff timeout runs out (counted from its own first
        cycle waiting, up to two late cycles before this worker saw the move): past it the receiver
        takes the partition while this worker still holds the lease."""
        timeout = self.coordinator.handoff_timeout or self.coordinator.expiry
        return max(0.0, min(self.shutdown_timeout, timeout - 2 * self.interval * (1 + self._jitter)))

    def _new_pump(self, pid: str) -> PartitionPump:
        return PartitionPump(
            ref=self.coordinator.ref,
            partition_id=pid,
            owner_id=self.owner_id,
            holds=self.coordinator.holds,
            checkpoints=self._checkpoints,
            source=self._source,
            handler=self._handler,
            config=self._config,
            dead_letters=self.dead_letters,
            monotonic=self.coordinator.monotonic,
            sleep=self._sleep,
            deadline=self.coordinator.deadline,
            outage=self._logs.checkpoints,
            pauses=self._logs.pauses,
            looked_after=True,
        )

    # stopping ------------------------------------------------------------------------------

    async def abort(self) -> None:
        """Drop every pump at once: no final checkpoint, no release. What a crash leaves behind
        (the store keeps the leases until they expire); for tests and the simulator."""
        self.stop()
        self._pumpset.unwatch_deadlines()
        tasks: list[asyncio.Task[Any]] = [task for _, task in self._pumps.values()]
        tasks += self._handoffs.tasks.values()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._pumps.clear()

    async def shutdown(self) -> None:
        """Stop pumps (final checkpoints), then release every partition. Bounded in time (``stopping``)."""
        self.stop()

        async def release() -> None:
            async with self._lock:
                await self.coordinator.release_all()

        await stop_worker(
            self.owner_id,
            self._pumpset,
            self._handoffs,
            release(),
            coordinator=self.coordinator,
            timeout=self.shutdown_timeout,
            cycles=self.cycles,
        )
