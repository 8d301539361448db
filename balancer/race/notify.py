"""The lease race's notifications (001 step 1 and the subscription), part of ``RaceCoordinator``.

Grab timers run in a task of their own, so a notification goes out on time rather than at the
next cycle; the subscription is a task that subscribes again, backing off, when it breaks; each
grab notification heard starts one race (``race_steps``) per partition at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from balancer.errors import StoreError
from balancer.model import check_partition_id
from balancer.race.backend import Channel

if TYPE_CHECKING:
    from balancer.race.state import RaceState
else:
    RaceState = object

log = logging.getLogger("balancer.race.coordinator")

RESUBSCRIBE_QUIET = 2.0  # seconds without publishing after a subscription came back (> the backoff cap)
BACKOFF_CAP = 1.0
# Times closer than this count as now: asyncio runs a timer that is due within its clock resolution
# at once, and a wait for less than one float step of the clock would never end.
EPSILON = 1e-6


class RaceNotifications(RaceState):
    """Grab timers, the subscription, and what a delivered notification starts."""

    _listener: asyncio.Task[None] | None
    _timer_task: asyncio.Task[None] | None

    def _add_timers(self, pids: Sequence[str]) -> None:
        """A first timer for each partition not seen before, at the partition's own point of a normal
        lease time: the same for every node (a hash of its id, plus this node's jitter), so that the
        partitions' challenges are spread over the lease time. (Random points would not do: the
        first of many nodes' random timers of a partition fires near the start, so every partition
        would be challenged in the first second, and again together one lease time later, for ever.)"""
        now = self.monotonic()
        for pid in pids:
            if pid not in self._timers:
                self._last_grab.setdefault(pid, now)
                phase = zlib.crc32(f"{self.ref.hub}/{pid}".encode()) / 2**32 * self.times.normal_lease
                self._set_timer(pid, now + phase + self.rng.uniform(0, self.times.jitter * self.times.normal_lease))

    def _set_timer(self, pid: str, at: float) -> None:
        head = self._timers.next_at()
        self._timers.set(pid, at)
        if head is None or at < head:
            self._timers_moved.set()

    def _arm(self, pid: str, now: float) -> None:
        """The next timer of ``pid``: one normal lease time (plus jitter) from ``now``."""
        self._set_timer(pid, now + self.times.normal_lease * (1 + self.rng.uniform(0, self.times.jitter)))

    async def _run_timers(self) -> None:
        """Fire grab timers when they are due (a task: notifications go out on time, not per cycle)."""
        while not self._stopped:
            for pid in self._timers.pop_due(self.monotonic() + EPSILON):
                try:
                    await self._fire(pid)
                except StoreError as exc:
                    self._failed("grab notification", exc)
                    self._set_timer(pid, self.monotonic() + self._retry_in())
                else:
                    self._recovered("grab notification")
            head = self._timers.next_at()
            self._timers_moved.clear()
            timeout = None if head is None else max(0.0, head - self.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._timers_moved.wait(), timeout)

    def _retry_in(self) -> float:
        """How soon to look at a timer again that could not act now (the jitter window)."""
        return max(self.times.normal_lease * self.times.jitter, self.times.leases_held_delay)

    async def _fire(self, pid: str) -> None:
        """Step 1 for one partition whose timer fired (see the module docstring)."""
        now = self.monotonic()
        grab = self._grab_seen
        if not self._subscribed or now < self._quiet_until or grab is None:
            self._set_timer(pid, max(now + self._retry_in(), self._quiet_until))  # we would not hear our race
            return
        pin = self._pins.get(pid)
        elsewhere = pin is not None and pin != self.owner_id
        if pid in self._owned or pid in self._starting:
            # a drained owner, or one holding a partition pinned elsewhere, asks others to take it
            candidate = pid not in self._handing_off and (elsewhere or (self._drained and pin is None))
        else:  # only the pinned node challenges a pinned partition; a drained node nothing
            candidate = not elsewhere and not (self._drained and pin is None)
        if not candidate or pid in self._racing or (self._known and pid not in self._known):
            self._arm(pid, now)
            return
        if grab.get(pid) == self.owner_id and pid in self._owned:
            # our own mark from a race we won: we want out now, not after the minimum lease grab time
            await self._clear_mark(pid)
        if pid not in grab:
            await self._publish_grab(pid, now)
        elif now - self._last_grab.get(pid, now) > self.times.maximum_lease:
            # (b): the winner died between steps 3 and 6. Allocation first: while the grab mark
            # stands nobody can win, so no new allocation can be wiped by this.
            log.warning(
                "%s: partition %s: grab mark of %s is older than the maximum lease time (%gs); clearing it",
                self.owner_id, pid, grab[pid], self.times.maximum_lease,
            )
            await self.backend.hdel("allocation", pid)
            if await self.backend.hdel("grab", pid, expect=grab[pid]):
                grab.pop(pid, None)
                await self._publish_grab(pid, now)
            else:
                self._arm(pid, now)
        else:  # a race is on (or our view is a little old): look again soon
            self._set_timer(pid, now + self._retry_in())

    async def _publish_grab(self, pid: str, now: float) -> None:
        self._arm(pid, now)
        await self.backend.publish("grab", pid)

    # notifications -------------------------------------------------------------------------

    def _start_tasks(self) -> None:
        if self._listener is None and not self._stopped:
            loop = asyncio.get_running_loop()
            self._listener = loop.create_task(self._listen(), name=f"race listener {self.owner_id}")
            self._timer_task = loop.create_task(self._run_timers(), name=f"race timers {self.owner_id}")

    async def _listen(self) -> None:
        """Keep the subscription up; back off (up to a second) while the store is away."""
        delay = 0.05
        first = True
        while not self._stopped:

            def ready() -> None:
                nonlocal delay, first
                self._subscribed = True
                if not first:
                    self._quiet_until = self.monotonic() + RESUBSCRIBE_QUIET
                    log.info("%s: race subscription is back", self.owner_id)
                first = False
                delay = 0.05
                self._recovered("subscription")

            try:
                await self.backend.listen(self._deliver, ready)
            except StoreError as exc:
                self._failed("subscription", exc)
            except Exception as exc:  # a bug must not end the subscription for good
                log.exception("%s: race subscription failed", self.owner_id)
                self._failed("subscription", exc)
            self._subscribed = False
            self._epoch += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_CAP)

    def _deliver(self, channel: Channel, pid: str) -> None:
        try:
            check_partition_id(pid)
        except ValueError:
            log.warning("%s: ignored a %s notification for %r: not a partition id", self.owner_id, channel, pid)
            return
        if channel == "allocated":
            event = self._allocated.get(pid)
            if event is not None:
                event.set()
            return
        now = self.monotonic()
        self._last_grab[pid] = now
        self._arm(pid, now)  # step 2: the timer is reset on receipt
        if self._stopped or pid in self._racing or (self._known and pid not in self._known):
            return  # one race at a time per partition: a second notification joins the first
        task = asyncio.get_running_loop().create_task(self._race(pid, now), name=f"race {self.owner_id} {pid}")
        self._racing[pid] = task
        task.add_done_callback(lambda done: self._race_done(pid, done))

    def _race_done(self, pid: str, task: asyncio.Task[None]) -> None:
        if self._racing.get(pid) is task:
            del self._racing[pid]
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            assert exc is not None
            if isinstance(exc, StoreError):
                self._failed("race", exc)
            else:
                log.error("%s: race for partition %s failed", self.owner_id, pid, exc_info=exc)
