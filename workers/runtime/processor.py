"""The event processor of one worker: the coordinator's cycle on its own schedule, one pump per
owned partition, and the graceful stop.

When the worker reads (cycles), renews and wakes is decided by one pure function,
``balancer.schedule.next_due``, which the simulator drives its workers by too; this module keeps the
timers, the wake-ups (``wake()``, ``news()``) and the sleeps until its answer.

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
import contextlib
import logging
import math
import random
import signal
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import workers.metrics as metrics
from balancer.lease import EARLY
from balancer.model import pid_key
from balancer.protocol import Balancer, CheckpointStore, CycleReport, Driver
from balancer.schedule import BACKOFF_MAX, Due, Inputs, Last, next_due
from workers.handlers import Handler
from workers.runtime.checkpoints import CheckpointOutage, PauseLog
from workers.runtime.config import PumpConfig, PumpStats
from workers.runtime.deadletters import DeadLetters
from workers.runtime.pump import PartitionPump, Sleep
from workers.runtime.sink import EventSink, OutageLog
from workers.runtime.slowcycles import CycleWatch
from workers.sources.base import EventSource

log = logging.getLogger("leaseboard.worker")
START_BACKOFF_MAX = BACKOFF_MAX  # seconds: the longest wait between tries when the store is down at start
_SLEPT = object()  # what a wait's timer resolves it with (stop() and wake() resolve it with None)


def _resolve(future: asyncio.Future[object], value: object) -> None:
    if not future.done():
        future.set_result(value)


def _slept(future: asyncio.Future[object], sleep: asyncio.Task[None]) -> None:
    """An injected sleep returned (or failed: a wait ends as if it had slept): resolve ``future``."""
    if not sleep.cancelled():
        sleep.exception()  # retrieved, so the loop does not warn of it
        _resolve(future, _SLEPT)


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
        if interval <= 0 or not 0 <= jitter < 1:
            raise ValueError(f"interval must be > 0 and jitter in [0, 1), got {interval}, {jitter}")
        if coordinator.expiry <= interval:
            raise ValueError(f"lease expiry ({coordinator.expiry}s) must be longer than the interval ({interval}s)")
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
        self._pumps: dict[str, tuple[PartitionPump, asyncio.Task[PumpStats]]] = {}
        self._lost_at: dict[str, int] = {}  # partition -> cycle count when its pump was refused a checkpoint
        self._pump_failures: dict[str, OutageLog] = {}
        self.history: dict[str, PumpStats] = {}  # the last finished pump of each partition
        self.cycles = 0  # successful cycles
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        # Called when this worker's cycle saw an operator's rebalance request: run_workers wakes every
        # worker of the process (a request may reach only one of them through the store).
        self.on_rebalance: Callable[[], None] | None = None
        # While a handoff to this worker is pending, cycle every quarter interval (``balancer.protocol.soon``)
        # to claim soon after the release; False where the store's release notices wake it instead.
        self.poll_waiting = True
        # While nothing changes, wait for the coordinator's ``quiet_until`` instead of one interval
        # (``_quiet_delay``): only where notices cross processes (``poll_waiting`` False), so a join,
        # a release or an operator's control wakes this worker at once.
        self._quiet = False  # the wait under way is a quiet one: news (``news()``) ends it
        self._news = False  # news heard since the last cycle's read was sent: no quiet wait after it
        self._last: CycleReport | None = None  # the last cycle's report (None: it failed)
        self._waiting: asyncio.Future[object] | None = None  # what ``_wait`` waits on (and its sleep)
        # One timer for every pump's lease deadline (``_watch_deadlines``): (the deadline, its task).
        self._deadline_watch: tuple[float, asyncio.Task[None]] | None = None
        # When the idle pumps are next looked at (``_safety_reads``).
        self._next_look = coordinator.monotonic() + self._config.idle_seconds
        # cycle() and release() both rewrite the coordinator's lease table across awaits: never at once.
        self._lock = asyncio.Lock()
        self._handoffs: dict[str, asyncio.Task[None]] = {}
        self._to_release: set[str] = set()  # handoffs whose pumps have stopped, not released yet
        # True once ``run()`` renews between cycles (``_until_cycle``); told to the coordinator with each
        # cycle and renewal step (``_driver``), as is this processor's handoff hook.
        self.renewal_steps = False
        self._outage = OutageLog(
            log, f"worker {coordinator.owner_id}: load-balancing cycle",
            f"retrying every {interval:g}s; pumps keep running while their leases last, then pause until renewed",
        )
        # Before its first cycle a worker holds nothing, so it may back off: a fleet started
        # against a store that is not up yet does not hammer it. Once it holds leases it retries
        # every interval, to renew them the moment the store answers again.
        self.start_backoff_max = max(interval, START_BACKOFF_MAX)
        self._start_failures = 0
        self._checkpoint_outage = CheckpointOutage(coordinator.owner_id)  # one line per outage, not per pump
        self._pauses = PauseLog(coordinator.owner_id, coordinator.monotonic)  # likewise
        self._renewals = OutageLog(
            log, f"worker {coordinator.owner_id}: lease renewal",
            "trying again shortly while the leases last, and at every cycle",
        )
        self._unreachable = OutageLog(
            log, f"worker {coordinator.owner_id}: first load-balancing cycle",
            f"the store may not be up yet: retrying with backoff ({interval:g}s, doubling, at most "
            f"{self.start_backoff_max:g}s)",
        )

    @property
    def owner_id(self) -> str:
        return self.coordinator.owner_id

    @property
    def _driver(self) -> Driver:
        """How this processor drives its coordinator: it hands planned moves off itself (``_hand_off``,
        unless the coordinator was built with a hook of its own) and, once ``run()`` has started,
        renews between cycles."""
        return Driver(on_handoff=self._hand_off, renewal_steps=self.renewal_steps)

    @property
    def pumping(self) -> frozenset[str]:
        """Partitions with a pump that is running (or paused) and not stopping."""
        return frozenset(p for p, (pump, task) in self._pumps.items() if not task.done() and not pump.stopping)

    @property
    def paused(self) -> frozenset[str]:
        """Partitions whose pump is paused: its lease may have run out, and it waits for a renewal."""
        return frozenset(p for p, (pump, task) in self._pumps.items() if not task.done() and pump.paused)

    def stats(self) -> dict[str, PumpStats]:
        """The stats of each partition's current pump, else of its last one."""
        current = {p: pump.stats for p, (pump, _) in self._pumps.items()}
        return {**self.history, **current}

    # the loop ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask ``run`` to stop gracefully (safe to call more than once)."""
        self._stop.set()
        self._interrupt()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wake(self) -> None:
        """Run the next cycle now instead of at the end of the interval (an operator's rebalance)."""
        self._wake.set()
        self._interrupt()

    def news(self) -> None:
        """News (a notice naming no partition: another worker joined, or an operator changed a control):
        cycle now if this worker is waiting quietly, longer than the interval; else its next cycle,
        within the interval, reads it anyway."""
        self._news = True
        if self._quiet:
            self.wake()

    def _interrupt(self) -> None:
        """End ``_wait`` now (``stop()`` or ``wake()`` was called)."""
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_result(None)

    async def run(self) -> None:
        """Cycle every interval, renewing leases as they fall due in between, until ``stop()``; then stop
        pumps, checkpoint and release."""
        log.info("worker %s starts (interval %gs, expiry %gs)", self.owner_id, self.interval, self.coordinator.expiry)
        self.renewal_steps = True  # this loop renews between cycles (``_until_cycle``)
        try:
            while not self._stop.is_set():
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
            self._renewals.failed(exc)
            return None
        self._renewals.ok()
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
                self._unreachable.failed(exc)
            else:
                self._outage.failed(exc)
        else:
            self._unreachable.ok()
            self._outage.ok()
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
        """Sleep ``seconds`` or until ``stop()`` or ``wake()``, whichever comes first. True when ``stop()``
        or ``wake()`` ended it. One future that the sleep, ``stop()`` and ``wake()`` resolve: with the
        loop's own sleep (as deployed) a timer resolves it, with no sleeping task and no
        ``asyncio.wait`` (the fewest turns of the loop for a wait every idle worker makes every cycle
        and every renewal); an injected sleep (a test's) runs as a task that resolves it when it returns."""
        seconds = max(0.0, seconds)
        due = time.monotonic() + seconds
        loop = asyncio.get_running_loop()
        interrupted = self._waiting = loop.create_future()
        if self._stop.is_set() or self._wake.is_set():
            interrupted.set_result(None)
        ending: asyncio.TimerHandle | asyncio.Task[None]
        if self._sleep is asyncio.sleep:
            ending = loop.call_later(seconds, _resolve, interrupted, _SLEPT)
        else:
            ending = asyncio.ensure_future(self._sleep(seconds))
            ending.add_done_callback(partial(_slept, interrupted))
        try:
            slept = await interrupted is _SLEPT
            woken = self._wake.is_set()
            if slept and not woken:
                self._watch.waited(time.monotonic() - due)  # how late the loop ran this worker's timer
            return woken or self._stop.is_set()
        finally:
            self._waiting = None
            self._wake.clear()
            ending.cancel()

    def _reconcile(self, lost: frozenset[str] = frozenset(), *, start: bool = True) -> None:
        """Stop the pumps of partitions no longer owned, being handed off, or ``lost`` in this cycle (even
        if claimed back in the same cycle: that pump's position and pending checkpoint are stale);
        wake the others (a paused pump whose lease was renewed resumes); with ``start``, start pumps for
        held ones (cycles do; a renewal step leaves that to the next cycle)."""
        coordinator = self.coordinator
        owned = coordinator.owned
        for pid, (pump, task) in list(self._pumps.items()):
            if task.done():
                del self._pumps[pid]
                self._finished(pid, task)
            elif pump.stopping:
                continue
            elif pid not in owned or pid in lost:
                pump.stop(lost=True)  # lost or released: not one more event, nor a checkpoint
            elif coordinator.handing_off(pid):
                pump.stop()  # the event in hand, then the final checkpoint
            else:
                pump.wake()  # a paused pump whose lease this cycle renewed resumes now
        if start:
            # Past its deadline a partition is not started: its pump would only pause.
            held = {p for p in owned if coordinator.holds(p) and not coordinator.handing_off(p)}
            for pid in sorted(held - self._pumps.keys()):
                if self._lost_at.get(pid, -1) >= self.cycles:
                    continue  # the store said someone else owns it: wait for a cycle to settle that
                self._lost_at.pop(pid, None)
                self._start(pid)
        self._watch_deadlines()
        self._safety_reads()

    def _safety_reads(self) -> None:
        """Every ``idle_seconds``, after a cycle or renewal step: the safety read of every idle pump
        (``PartitionPump.look``: a pump whose reader says nothing came stays idle). One look for all
        the pumps, on a wake the worker makes anyway, where each idle pump used to wake on a timer."""
        now = self.coordinator.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + self._config.idle_seconds
        for pump, task in self._pumps.values():
            if not task.done() and not pump.stopping:
                pump.look()

    def _watch_deadlines(self) -> None:
        """Tell the running pumps whose lease deadline passed unrenewed (an idle pump then pauses, as a
        busy one does at its next event), and arm one timer at the earliest deadline still ahead to do
        the same there. A renewal moves the deadlines on before they pass, so in steady state the timer
        is re-armed at each renewal and never fires: one timer per worker, where each idle pump used to
        wake at its lease's old deadline after every renewal."""
        deadline, now = self.coordinator.deadline, self.coordinator.monotonic()
        ahead = []
        for pid, (pump, task) in self._pumps.items():
            if task.done() or pump.stopping:
                continue
            at = deadline(pid)
            if not math.isfinite(at):
                continue  # not held: the processor stops this pump
            if at > now:
                ahead.append(at)
            elif not pump.paused:
                pump.deadline_passed()
        first = min(ahead, default=None)
        watch = self._deadline_watch
        if watch is not None and watch[0] == first and not watch[1].done():
            return
        if watch is not None:
            watch[1].cancel()
        self._deadline_watch = None
        if first is not None and not self._stop.is_set():
            timer = asyncio.get_running_loop().create_task(self._at_deadline(first), name=f"deadlines {self.owner_id}")
            self._deadline_watch = (first, timer)

    async def _at_deadline(self, at: float) -> None:
        clock = self.coordinator.monotonic
        await self._sleep(max(0.0, at - clock()) + EARLY)  # EARLY: a timer may fire a hair early
        if clock() < at:
            return  # a test's sleep that only yields: the next cycle or renewal arms it again
        self._deadline_watch = None
        self._watch_deadlines()  # tells the pumps whose deadline passed; arms the next one ahead

    def _hand_off(self, pid: str) -> None:
        """The coordinator's ``on_handoff``: a planned move of ``pid`` starts (called inside cycle())."""
        if pid not in self._handoffs:
            task = asyncio.get_running_loop().create_task(self._handoff(pid), name=f"handoff {self.owner_id} {pid}")
            self._handoffs[pid] = task
            task.add_done_callback(lambda _: self._handoffs.pop(pid, None))

    async def _handoff(self, pid: str) -> None:
        """Stop the pump after the event in hand and its final checkpoint, then release ``pid``.

        The lease is renewed meanwhile, so the next owner cannot start before that checkpoint and
        a planned move handles no event twice.
        """
        entry = self._pumps.get(pid)
        if entry is not None:
            pump, task = entry
            pump.stop()
            wait = self._handoff_wait()
            _, late = await asyncio.wait([task], timeout=wait)
            if late:
                log.warning(
                    "worker %s: partition %s still busy after %gs; handing it off anyway (its event in hand "
                    "will be handled again by the next owner)", self.owner_id, pid, wait,
                )
        self._to_release.add(pid)
        async with self._lock:
            # Every handoff ready by now goes in one request: under load, a hundred releases one after
            # the other each took the lock in turn and the renewals queued behind them, until leases lapsed.
            batch = sorted(self._to_release, key=pid_key)
            self._to_release.clear()
            if batch:  # else released with another handoff's batch meanwhile
                await self._release(batch)

    async def _release(self, batch: list[str]) -> None:
        try:
            await self.coordinator.release_many(batch, "handed off")
        except Exception as exc:
            metrics.STORE_ERRORS.labels(operation="release").inc()
            log.warning(
                "worker %s: could not release partition(s) %s (%s: %s); the next owner takes them after the "
                "handoff timeout", self.owner_id, ", ".join(batch), type(exc).__name__, exc,
            )  # fmt: skip

    def _handoff_wait(self) -> float:
        """How long a handoff waits for the event in hand: the shutdown timeout, but short enough that
        the release comes before the receiver's handoff timeout runs out (counted from its own first
        cycle waiting, up to two late cycles before this worker saw the move): past it the receiver
        takes the partition while this worker still holds the lease."""
        timeout = self.coordinator.handoff_timeout or self.coordinator.expiry
        return max(0.0, min(self.shutdown_timeout, timeout - 2 * self.interval * (1 + self._jitter)))

    def _start(self, pid: str) -> None:
        pump = PartitionPump(
            ref=self.coordinator.ref, partition_id=pid, owner_id=self.owner_id, holds=self.coordinator.holds,
            checkpoints=self._checkpoints, source=self._source, handler=self._handler, config=self._config,
            dead_letters=self.dead_letters, monotonic=self.coordinator.monotonic, sleep=self._sleep,
            deadline=self.coordinator.deadline, outage=self._checkpoint_outage, pauses=self._pauses,
            looked_after=True,
        )  # fmt: skip
        task = asyncio.get_running_loop().create_task(pump.run(), name=f"pump {self.owner_id} {pid}")
        self._pumps[pid] = (pump, task)

    def _finished(self, pid: str, task: asyncio.Task[PumpStats]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            stats = task.result()
            self.history[pid] = stats
            self._pump_failures.pop(pid, None)
            if stats.ended == "lost":
                self._lost_at[pid] = self.cycles
            return
        # An error from the source or the store the pump could not handle: restarted from the
        # checkpoint at the next cycle; the first failure in a row gets a traceback.
        outage = self._pump_failures.setdefault(
            pid, OutageLog(log, f"worker {self.owner_id}: pump of partition {pid}", "restarting from its checkpoint")
        )
        outage.failed(error)

    # stopping ------------------------------------------------------------------------------

    def _unwatch_deadlines(self) -> None:
        if self._deadline_watch is not None:
            self._deadline_watch[1].cancel()
            self._deadline_watch = None

    async def abort(self) -> None:
        """Drop every pump at once: no final checkpoint, no release. What a crash leaves behind
        (the store keeps the leases until they expire); for tests and the simulator."""
        self.stop()
        self._unwatch_deadlines()
        tasks: list[asyncio.Task[Any]] = [task for _, task in self._pumps.values()]
        tasks += self._handoffs.values()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._pumps.clear()

    async def shutdown(self) -> None:
        """Stop pumps (final checkpoints), then release every partition. Bounded in time."""
        self.stop()
        self._unwatch_deadlines()
        running = {task: pid for pid, (_, task) in self._pumps.items() if not task.done()}
        for pump, _ in self._pumps.values():
            pump.stop()
        if running:
            _, late = await asyncio.wait(running, timeout=self.shutdown_timeout)
            for task in late:
                log.warning(
                    "worker %s: partition %s still busy after %gs; releasing it anyway (its event in hand "
                    "will be handled again by the next owner)", self.owner_id, running[task], self.shutdown_timeout,
                )
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        for pid, (_, task) in list(self._pumps.items()):
            if task.done():
                self._finished(pid, task)
        self._pumps.clear()
        if self._handoffs:  # their pumps have stopped: each release is one store call
            _, unreleased = await asyncio.wait(list(self._handoffs.values()), timeout=self.shutdown_timeout)
            for handoff in unreleased:
                handoff.cancel()
        try:
            async with self._lock:
                await asyncio.wait_for(self.coordinator.release_all(), timeout=self.shutdown_timeout)
        except Exception as exc:
            metrics.STORE_ERRORS.labels(operation="release").inc()
            log.warning(
                "worker %s: could not release its partitions (%s: %s); others take them after expiry (%gs)",
                self.owner_id, type(exc).__name__, exc, self.coordinator.expiry,
            )
        log.info("worker %s stopped", self.owner_id)


async def run_workers(
    processors: Sequence[EventProcessor],
    *,
    sink: EventSink | None = None,
    signals: bool = True,
) -> None:
    """Run ``processors`` until all have stopped; SIGTERM or SIGINT stops them gracefully.

    A second signal gives up on the graceful stop (pending work is cancelled).
    """
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(p.run(), name=f"worker {p.owner_id}") for p in processors]
    installed: list[signal.Signals] = []

    def wake_all() -> None:
        for p in processors:
            p.wake()

    for p in processors:
        p.on_rebalance = wake_all
    listener = loop.create_task(listen_for_wakeups(wake_all), name="wake-up listener")

    def on_signal(signum: signal.Signals) -> None:
        if any(p.stopping for p in processors):
            log.warning("second %s: not waiting for the graceful stop", signum.name)
            for task in tasks:
                task.cancel()
            return
        log.info("%s: stopping %d worker(s): finishing events in hand, checkpointing, releasing", signum.name,
                 len(processors))
        for p in processors:
            p.stop()

    if signals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)
    try:
        await asyncio.gather(*tasks, return_exceptions=True)
        if sink is not None:
            await sink.flush(timeout=5.0)
    finally:
        listener.cancel()
        for signum in installed:
            loop.remove_signal_handler(signum)
        for task in tasks:
            if not task.done():
                task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)


WAKE_GROUP = "leaseboard.workers"


async def listen_for_wakeups(wake: Callable[[], None]) -> None:
    """Wake the workers of this process on a ``worker.wake`` message to the channel-layer group
    "leaseboard.workers" (an operator's "rebalance now"). With the in-process layer only workers in
    the dashboard's own process hear it; the others see the rebalance token in their next cycle."""
    from channels.layers import get_channel_layer

    from balancer.aio import stop_if_cancelled, within
    from workers.layer_notices import ENDING, receive

    layer = get_channel_layer()
    if layer is None:
        return
    try:
        channel = await layer.new_channel()
        await layer.group_add(WAKE_GROUP, channel)
        stop_if_cancelled()
    except Exception as exc:  # no layer to listen on: the token in the store still does the job
        log.warning("not listening for rebalance wake-ups: %s: %s", type(exc).__name__, exc)
        return

    async def leave() -> None:
        await layer.group_discard(WAKE_GROUP, channel)

    try:
        while True:
            # Cancelled at the stop: ends the receive and leaves the group within ENDING, never hangs.
            message = await receive(layer, channel, leave)
            stop_if_cancelled()  # the layer's redis-py may have lost a cancellation (balancer.aio)
            if message.get("type") == "worker.wake":
                log.info("woken by the channel layer: %s", message.get("reason", "no reason given"))
                wake()
    except Exception:  # the layer failed: leave its group if it still answers
        await within(leave(), ENDING)
        raise
