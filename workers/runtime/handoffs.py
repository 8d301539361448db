"""Planned moves away from one worker: its pump stops after the event in hand and its final
checkpoint, then the partition is released, in one store request with every other handoff ready by
then. The lease is renewed meanwhile, so the next owner cannot start before that checkpoint and a
planned move handles no event twice. A pump still busy when the wait runs out (a loaded machine, a
long handler call) is handed off anyway, released with ``BUSY`` as its reason: what it handled
since its last checkpoint is handled again by the next owner, and the event log says why."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import workers.metrics as metrics
from balancer.model import pid_key
from balancer.protocol import Balancer
from workers.runtime.pumps import Pumps

log = logging.getLogger("leaseboard.worker")

BUSY = "handed off while busy"  # the release's reason when the pump outlasted the wait (then ": N s")


class Handoffs:
    """The handoffs under way of one worker (``tasks``: partition -> its handoff).

    ``lock`` is the worker's: a cycle and a release both rewrite the coordinator's lease table across
    awaits, never at once. ``wait`` says how long a handoff waits for the event in hand."""

    def __init__(self, coordinator: Balancer, pumps: Pumps, *, lock: asyncio.Lock, wait: Callable[[], float]) -> None:
        self._coordinator = coordinator
        self._pumps = pumps
        self._lock = lock
        self._wait = wait
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.to_release: set[str] = set()  # handoffs whose pumps have stopped, not released yet
        self.busy: dict[str, float] = {}  # of those, the ones handed off still busy -> the wait they outlasted

    @property
    def _owner_id(self) -> str:
        return self._coordinator.owner_id

    def start(self, pid: str) -> None:
        """The coordinator's ``on_handoff``: a planned move of ``pid`` starts (called inside cycle())."""
        if pid not in self.tasks:
            task = asyncio.get_running_loop().create_task(self._handoff(pid), name=f"handoff {self._owner_id} {pid}")
            self.tasks[pid] = task
            task.add_done_callback(lambda _: self.tasks.pop(pid, None))

    async def _handoff(self, pid: str) -> None:
        """Stop the pump after the event in hand and its final checkpoint, then release ``pid``.

        The lease is renewed meanwhile, so the next owner cannot start before that checkpoint and
        a planned move handles no event twice.
        """
        entry = self._pumps.running.get(pid)
        if entry is not None:
            pump, task = entry
            pump.stop(handoff=True)
            wait = self._wait()
            _, late = await asyncio.wait([task], timeout=wait)
            if late:
                log.warning(
                    "worker %s: partition %s still busy after %gs; handing it off anyway (its event in hand "
                    "will be handled again by the next owner)",
                    self._owner_id,
                    pid,
                    wait,
                )
                self.busy[pid] = wait
        self.to_release.add(pid)
        async with self._lock:
            # Every handoff ready by now goes in one request: under load, a hundred releases one after
            # the other each took the lock in turn and the renewals queued behind them, until leases lapsed.
            batch = sorted(self.to_release, key=pid_key)
            self.to_release.clear()
            if batch:  # else released with another handoff's batch meanwhile
                await self._release(batch)

    async def _release(self, batch: list[str]) -> None:
        by_reason: dict[str, list[str]] = {}  # one request per reason: those handed off busy say so
        for pid in batch:
            reason = f"{BUSY}: {self.busy.pop(pid):g} s" if pid in self.busy else "handed off"
            by_reason.setdefault(reason, []).append(pid)
        try:
            for reason, pids in by_reason.items():
                await self._coordinator.release_many(pids, reason)
        except Exception as exc:
            metrics.STORE_ERRORS.labels(operation="release").inc()
            log.warning(
                "worker %s: could not release partition(s) %s (%s: %s); the next owner takes them after the "
                "handoff timeout",
                self._owner_id,
                ", ".join(batch),
                type(exc).__name__,
                exc,
            )

    async def finish(self, timeout: float) -> None:
        """Wait at most ``timeout`` for the handoffs under way (their pumps have stopped: each release is
        one store call); cancel those still unreleased."""
        if self.tasks:
            _, unreleased = await asyncio.wait(list(self.tasks.values()), timeout=timeout)
            for handoff in unreleased:
                handoff.cancel()
