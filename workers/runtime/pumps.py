"""The pumps of one worker: started for the partitions it holds, stopped for those it lost or hands
off, woken after each cycle, looked at together while idle, and told by one timer when a lease's
deadline passes unrenewed; what each did (its stats), and the bounded stop of them all."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import workers.metrics as metrics
from balancer.avoid import EVERY
from balancer.protocol import Balancer
from workers.runtime.config import PumpConfig, PumpStats
from workers.runtime.deadlines import DeadlineWatch
from workers.runtime.handlerwatch import HandlerWatch
from workers.runtime.hubwatch import HubGuard, HubWatch
from workers.runtime.inplace import InPlaceWatch
from workers.runtime.pump import PartitionPump, Sleep
from workers.runtime.sink import OutageLog
from workers.runtime.stuck import GIVE_UP_FOR, HandlerStalls, ReaderWatch, heal, too_many_abandoned
from workers.runtime.wedged import WedgeWatch
from workers.sources.base import PartitionProperties

log = logging.getLogger("leaseboard.worker")


class Pumps:
    """The running pumps of one worker (``running``: partition -> the pump and its task).

    ``build`` makes the pump of a partition; ``sleep`` is the worker's sleep (looked up when the
    deadline timer is armed); ``stopped`` says whether the worker is stopping (no timer then);
    ``source`` the worker's, asked when the hub seems silent (``probe``) or a read hangs (``properties``)."""

    def __init__(
        self,
        coordinator: Balancer,
        *,
        idle_seconds: float,
        build: Callable[[str], PartitionPump],
        sleep: Sleep,
        stopped: Callable[[], bool],
        handler_timeout: float = 0.0,
        reader_stuck: float = 0.0,
        source: object = None,
        quiet: float = 1.0,
        wake: Callable[[], None] = lambda: None,
        reader_wedged: float = 0.0,
    ) -> None:
        self._coordinator = coordinator
        self._idle_seconds = idle_seconds
        self._handler_timeout = handler_timeout
        self._build = build
        self._sleep = sleep
        self._stopped = stopped
        self._wake = wake  # the worker's next cycle now (a restarted pump starts at a cycle)
        self.running: dict[str, tuple[PartitionPump, asyncio.Task[PumpStats]]] = {}
        self._lost_at: dict[str, int] = {}  # partition -> cycle count when its pump was refused a checkpoint
        self._failures: dict[str, OutageLog] = {}
        self.history: dict[str, PumpStats] = {}  # the last finished pump of each partition
        # One timer for every pump's lease deadline (``watch_deadlines``).
        self._deadlines = DeadlineWatch(coordinator, self.running, sleep, stopped)
        # When the idle pumps are next looked at (``_safety_reads``).
        self._next_look = coordinator.monotonic() + idle_seconds
        # The watch for stuck handlers (``handlerwatch.py``), and how many handler threads it abandoned.
        self.handlers: HandlerWatch | None = None
        if handler_timeout > 0:
            clock = coordinator.monotonic
            self.handlers = HandlerWatch(handler_timeout, self.running, clock, sleep, stopped, self._handler_stuck)
        self.abandoned = 0
        self.in_place = InPlaceWatch()  # dead letters an operator replays in place (``inplace.py``)
        self.stalls = HandlerStalls()  # partitions whose handler call was abandoned, until they move past it
        # Partitions whose reader keeps failing (``stuck.py``), and the give-ups under way.
        self._reader_stuck = reader_stuck
        self.readers = ReaderWatch()
        self._giving_up: dict[str, asyncio.Task[None]] = {}
        # Reads that hang while events wait (``wedged.py``): restarted as failing readers.
        self.wedges: WedgeWatch | None = None
        properties: Callable[[str], PartitionProperties] | None = getattr(source, "properties", None)
        if properties is not None and reader_wedged > 0:
            wedge = (reader_wedged, properties, coordinator.monotonic, self._wedged)
            self.wedges = WedgeWatch(*wedge, sleep=sleep, pumps=self._live, stopped=stopped)
        # A hub that stops answering while the store still does (``hubwatch.py``): only where the source
        # can be asked (``EventSource.probe``) and a bound is set.
        self.hub: HubGuard | None = None
        hub_probe: Callable[[], object] | None = getattr(source, "probe", None)
        if hub_probe is not None and reader_stuck > 0:
            answer = max(1.0, min(quiet, 5.0))
            watch = HubWatch(
                hub_probe, quiet=quiet, answer_within=answer, clock=coordinator.monotonic, most_apart=reader_stuck
            )
            self.hub = HubGuard(
                watch, coordinator, bound=reader_stuck, seconds=GIVE_UP_FOR, progress=self._handed, wake=wake
            )

    @property
    def _owner_id(self) -> str:
        return self._coordinator.owner_id

    @property
    def pumping(self) -> frozenset[str]:
        """Partitions with a pump that is running (or paused) and not stopping."""
        return frozenset(p for p, (pump, task) in self.running.items() if not task.done() and not pump.stopping)

    @property
    def paused(self) -> frozenset[str]:
        """Partitions whose pump is paused: its lease may have run out, and it waits for a renewal."""
        return frozenset(p for p, (pump, task) in self.running.items() if not task.done() and pump.paused)

    def _live(self) -> dict[str, PartitionPump]:
        return {p: pump for p, (pump, task) in self.running.items() if not task.done()}

    def _handed(self) -> int:
        """Events the running pumps handed over so far (``HubWatch.moved``: it grows while events come)."""
        return sum(pump.stats.processed for pump, _ in self.running.values())

    def stats(self) -> dict[str, PumpStats]:
        """The stats of each partition's current pump, else of its last one."""
        current = {p: pump.stats for p, (pump, _) in self.running.items()}
        return {**self.history, **current}

    def reconcile(self, lost: frozenset[str], *, start: bool, cycles: int) -> None:
        """Stop the pumps of partitions no longer owned, being handed off, or ``lost`` in this cycle (even
        if claimed back in the same cycle: that pump's position and pending checkpoint are stale);
        wake the others (a paused pump whose lease was renewed resumes); with ``start``, start pumps for
        held ones (cycles do; a renewal step leaves that to the next cycle). ``cycles``: the worker's
        successful cycles so far."""
        coordinator = self._coordinator
        owned = coordinator.owned
        if self.hub is not None:
            self.hub.start()
        for pid, (pump, task) in list(self.running.items()):
            if pump.has_read and self.readers.failing(pid):
                self._reader_back(pid)
            self.stalls.moved(pid, pump.handed())
            if task.done():
                del self.running[pid]
                self.finished(pid, task, cycles)
            elif pid not in owned or pid in lost:
                pump.stop(lost=True)  # lost or released: not one more event, nor a checkpoint
            elif coordinator.handing_off(pid) and not pump.stopping:
                pump.stop(handoff=True)  # the event in hand, then the final checkpoint
            else:
                pump.wake()  # a paused pump whose lease this cycle renewed resumes (or, stopping, checkpoints) now
        if self.handlers is not None:
            self.handlers.look()
        if self.wedges is not None:
            self.wedges.look(self._live())
        self.in_place.look(self._live())
        for pid in [p for p in self.readers.since if p not in owned]:  # lost or handed over: its failures end
            self._reader_back(pid)
        for pid in [p for p in self.stalls.stalled if p not in owned]:
            self.stalls.over(pid)
        self._give_up_stuck_readers()
        if start:
            self._start_held(owned, cycles)
        self.watch_deadlines()
        self._safety_reads()

    def _start_held(self, owned: frozenset[str], cycles: int) -> None:
        """Start a pump for each partition held and not being handed off that has none (a failing
        reader's is a restart, counted), unless the store said someone else owns it since the last
        cycle or it is being given up. Past its deadline a partition is not started: its pump would
        only pause."""
        coordinator = self._coordinator
        held = {p for p in owned if coordinator.holds(p) and not coordinator.handing_off(p)}
        for pid in sorted(held - self.running.keys()):
            if self._lost_at.get(pid, -1) >= cycles:
                continue  # the store said someone else owns it: wait for a cycle to settle that
            self._lost_at.pop(pid, None)
            if pid in self._giving_up:
                continue
            if self.readers.failing(pid):
                self.readers.restarted(coordinator, pid)
            self._start(pid)

    def _handler_stuck(self, pid: str, seconds: float) -> None:
        """``pid``'s handler call has had the same event (or batch) in hand for the timeout or more
        (``HandlerWatch``): its pump is abandoned (``PartitionPump.abandon``: what the call does later
        is fenced) and its task cancelled, and the worker's next cycle, now, starts the partition again
        from its checkpoint on a new thread; or it is given up if it sticks again on the same event."""
        pump, task = self.running[pid]
        call = pump.calling()
        self._abandon(pid, pump, task, seconds)
        self._stalled_again(pid, None if call is None else _sequence(call[0]), seconds)
        self._wake()

    def _stalled_again(self, pid: str, sequence: int | None, seconds: float) -> None:
        """The second step for a handler: a partition whose restarted handler got stuck again on the same
        event is given up (released with its reason, kept from this worker for ``GIVE_UP_FOR``), so
        another worker takes it at once rather than this one restarting it until it stops."""
        if not self.stalls.abandoned(pid, sequence) or pid in self._giving_up:
            return
        reason = f"stuck: handler running {seconds:.0f} s"
        log.error("worker %s: partition %s %s again: releasing it for another worker", self._owner_id, pid, reason)
        task = asyncio.get_running_loop().create_task(self._give_up(pid, reason, "handler"), name=f"give up {pid}")
        self._giving_up[pid] = task

    def too_many_abandoned(self, config: PumpConfig) -> str | None:
        """Why the worker must stop (``stuck.too_many_abandoned``), else None."""
        return too_many_abandoned(self._owner_id, self.abandoned, config)

    def _abandon(self, pid: str, pump: PartitionPump, task: asyncio.Task[PumpStats], seconds: float) -> None:
        self.abandoned += 1
        log.error(
            "worker %s: partition %s stuck: handler running %.1fs or more (LEASEBOARD_HANDLER_TIMEOUT %gs); "
            "abandoning its thread (%d so far) and restarting the partition from its checkpoint",
            self._owner_id,
            pid,
            seconds,
            self._handler_timeout,
            self.abandoned,
        )
        heal(self._coordinator, pid, "handler", "restart", f"restarted: handler running {seconds:.0f} s")
        pump.abandon()
        task.cancel()

    def _wedged(self, pid: str, since: float) -> None:
        """``pid``'s reader has handed nothing over since ``since`` while events wait: its pump is abandoned
        (a hung read's thread is left to end if ever) and the next cycle starts it again, as after a failing read."""
        entry = self.running.get(pid)
        if entry is None or entry[1].done():
            return
        pump, task = entry
        seconds = self._coordinator.monotonic() - since
        log.error(
            "worker %s: partition %s stuck: its reader has handed nothing over for %.0f s while events wait "
            "(LEASEBOARD_READER_WEDGED %gs); restarting it from the checkpoint",
            *(self._owner_id, pid, seconds, self.wedges.bound if self.wedges else 0.0),
        )
        pump.abandon()
        task.cancel()
        # Failing from now: restarted first, released only if still failing LEASEBOARD_READER_STUCK later.
        if self.readers.failed(pid, self._coordinator.monotonic()):
            metrics.PARTITION_STUCK.labels(pid, "reader").set(1)
        self._wake()

    def _safety_reads(self) -> None:
        """Every ``idle_seconds``, after a cycle or renewal step: the safety read of every idle pump
        (``PartitionPump.look``: a pump whose reader says nothing came stays idle). One look for all
        the pumps, on a wake the worker makes anyway, where each idle pump used to wake on a timer."""
        now = self._coordinator.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + self._idle_seconds
        for pump, task in self.running.values():
            if not task.done() and not pump.stopping:
                pump.look()

    def watch_deadlines(self) -> None:
        """Tell the pumps whose lease deadline passed unrenewed; one timer for the next (``deadlines.py``)."""
        self._deadlines.watch()

    def unwatch_deadlines(self) -> None:
        self._deadlines.cancel()

    def _start(self, pid: str) -> None:
        pump = self._build(pid)
        task = asyncio.get_running_loop().create_task(pump.run(), name=f"pump {self._owner_id} {pid}")
        self.running[pid] = (pump, task)

    def finished(self, pid: str, task: asyncio.Task[PumpStats], cycles: int) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            stats = task.result()
            self.history[pid] = stats
            self._failures.pop(pid, None)
            if stats.ended == "lost":
                self._lost_at[pid] = cycles
            return
        # An error from the source or the store the pump could not handle: restarted from the
        # checkpoint at the next cycle; the first failure in a row gets a traceback.
        outage = self._failures.setdefault(
            pid, OutageLog(log, f"worker {self._owner_id}: pump of partition {pid}", "restarting from its checkpoint")
        )
        outage.failed(error)
        if self.readers.failed(pid, self._coordinator.monotonic()):
            metrics.PARTITION_STUCK.labels(pid, "reader").set(1)

    def _reader_back(self, pid: str) -> None:
        """``pid``'s reader read again, or the partition was given up: no longer failing here."""
        self.readers.read(pid)
        metrics.PARTITION_STUCK.labels(pid, "reader").set(0)

    def _give_up_stuck_readers(self) -> None:
        """Give up (``Balancer.give_up``, in a task of its own) each held partition whose reader has kept
        failing for ``reader_stuck`` seconds; its pump, if one was started again, stops first."""
        if not self.readers.since:  # the common case, every cycle and renewal step: nothing failing
            return
        coordinator = self._coordinator
        held = frozenset(p for p in coordinator.owned if not coordinator.handing_off(p))
        due = self.readers.due(coordinator.monotonic(), self._reader_stuck, held)
        if len(held) > 1 and len(due) == len(held) and EVERY not in coordinator.avoiding():
            if EVERY not in self._giving_up:  # every reader failing: the hub, not one partition
                seconds = min(s for _, s in due)
                log.error(
                    "worker %s cannot read the hub: every reader failing %.0f s or more (LEASEBOARD_READER_STUCK "
                    "%gs); handing its %d partitions over, and claiming none for %gs",
                    *(self._owner_id, seconds, self._reader_stuck, len(held), GIVE_UP_FOR),
                )
                task = asyncio.get_running_loop().create_task(self._cannot_read(held), name="cannot read")
                self._giving_up[EVERY] = task
            return
        for pid, seconds in due:
            if pid in self._giving_up:
                continue
            reason = self.readers.reason(seconds)
            log.error(
                "worker %s: partition %s %s (LEASEBOARD_READER_STUCK %gs): releasing it for another worker; "
                "this one takes it no more for %gs",
                self._owner_id,
                pid,
                reason,
                self._reader_stuck,
                GIVE_UP_FOR,
            )
            if pid in self.running:  # one that has read nothing since its start has nothing to checkpoint:
                self._end(*self.running[pid])  # a read that hangs is not waited for
            task = asyncio.get_running_loop().create_task(self._give_up(pid, reason), name=f"give up {pid}")
            self._giving_up[pid] = task

    @staticmethod
    def _end(pump: PartitionPump, task: asyncio.Task[PumpStats]) -> None:
        """Stop a pump given up on: after its final checkpoint if it has read, else at once."""
        if pump.has_read:
            pump.stop(handoff=True)
        else:
            pump.abandon()
            task.cancel()

    async def _give_up(self, pid: str, reason: str, cause: str = "reader") -> None:
        try:
            if pid in self.running:  # the pump started again stops (its final checkpoint) before the release
                await asyncio.wait({self.running[pid][1]}, timeout=self._coordinator.expiry / 4)
            await self._coordinator.give_up(pid, reason, GIVE_UP_FOR)
            metrics.STUCK_HEALS.labels(cause, "release").inc()
            if cause == "reader":
                self._reader_back(pid)
            self.stalls.over(pid)
        except Exception as exc:  # the store failed: the next cycle tries again
            log.warning("worker %s: giving partition %s up failed (%s); tried again", self._owner_id, pid, exc)
        finally:
            del self._giving_up[pid]

    async def _cannot_read(self, held: frozenset[str]) -> None:
        try:
            await self._coordinator.cannot_read(GIVE_UP_FOR)  # the next cycles hand them over
            metrics.STUCK_HEALS.labels("reader", "hand_over").inc()
            for pid in held:
                self._reader_back(pid)
        except Exception as exc:  # the next cycle tries again
            log.warning("worker %s: saying it cannot read failed (%s); tried again", self._owner_id, exc)
        finally:
            del self._giving_up[EVERY]

    async def stop_all(self, timeout: float, cycles: int) -> None:
        """Stop every pump after its event in hand and its final checkpoint, waiting at most ``timeout``
        (the late ones are cancelled), and keep what each did."""
        if self.hub is not None:
            self.hub.stop()
        if self.wedges is not None:
            self.wedges.cancel()
        if self.handlers is not None:
            self.handlers.cancel()
        running = {task: pid for pid, (_, task) in self.running.items() if not task.done()}
        for pump, _ in self.running.values():
            pump.stop()
        if running:
            _, late = await asyncio.wait(running, timeout=timeout)
            for task in late:
                log.warning(
                    "worker %s: partition %s still busy after %gs; releasing it anyway (its event in hand "
                    "will be handled again by the next owner)",
                    self._owner_id,
                    running[task],
                    timeout,
                )
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        for pid, (_, task) in list(self.running.items()):
            if task.done():
                self.finished(pid, task, cycles)
        self.running.clear()


def _sequence(held: object) -> int | None:
    """The sequence number of the event (or the first of the batch) a handler call has in hand."""
    first = held[0] if isinstance(held, list | tuple) and held else held
    number = getattr(first, "sequence_number", None)
    return number if isinstance(number, int) else None
