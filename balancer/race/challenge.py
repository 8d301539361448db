"""001 step 1: one grab timer per partition, and the challenge a node publishes when one fires.

A timer is one normal lease time (plus jitter), reset whenever a grab notification for its
partition is heard from anyone. When it fires and the partition is (a) not processed by this node
and has no value in the grab hash, the node publishes a grab notification; (b) if the grab hash
has held a value for longer than the maximum lease time since the last notification (a winner
died between steps 3 and 6), the node first clears the partition's allocation and grab fields,
then publishes. Timers run in a task of their own, so a challenge goes out on time rather than at
the next cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import Sequence

from balancer.errors import StoreError
from balancer.model import Controls
from balancer.race.backend import RaceBackend
from balancer.race.node import EPSILON, Outages, RaceNode, log
from balancer.race.steps import Racer
from balancer.race.subscription import Subscription
from balancer.race.times import GrabTimers


class Challenger:
    """The grab timers of one node, and what it does when one fires."""

    def __init__(
        self, node: RaceNode, backend: RaceBackend, subscription: Subscription, racer: Racer, outages: Outages
    ) -> None:
        self._node = node
        self._backend = backend
        self._subscription = subscription
        self._racer = racer
        self._outages = outages
        self._timers = GrabTimers()
        self._moved = asyncio.Event()  # a timer moved earlier: the timer task looks again
        self._last_grab: dict[str, float] = {}  # monotonic time a grab notification was last heard

    def add(self, pids: Sequence[str]) -> None:
        """A first timer for each partition not seen before, at the partition's own point of a normal
        lease time: the same for every node (a hash of its id, plus this node's jitter), so that the
        partitions' challenges are spread over the lease time. (Random points would not do: the
        first of many nodes' random timers of a partition fires near the start, so every partition
        would be challenged in the first second, and again together one lease time later, for ever.)"""
        node, times = self._node, self._node.times
        now = node.monotonic()
        for pid in pids:
            if pid not in self._timers:
                self._last_grab.setdefault(pid, now)
                phase = zlib.crc32(f"{node.ref.hub}/{pid}".encode()) / 2**32 * times.normal_lease
                self.set(pid, now + phase + node.rng.uniform(0, times.jitter * times.normal_lease))

    def set(self, pid: str, at: float) -> None:
        """Fire ``pid``'s timer at monotonic time ``at`` (now, to challenge it at once)."""
        head = self._timers.next_at()
        self._timers.set(pid, at)
        if head is None or at < head:
            self._moved.set()

    def obey(self, standing: Controls) -> None:
        """Take the operators' drains and pins in; challenge at once what they move: everything this
        node holds when it is newly drained, and each partition newly pinned or pinned elsewhere."""
        node = self._node
        drained = node.owner_id in standing.drained
        now = node.monotonic()
        if drained and not node.drained:  # challenge everything held now, so others take it
            for pid in node.owned:
                self.set(pid, now)
        node.drained = drained
        pins = dict(standing.pins)
        for target, _ in set(pins.items()) ^ set(node.pins.items()):  # a new or moved pin: act on it now
            self.set(target, now)
        node.pins = pins

    def heard(self, pid: str, now: float) -> None:
        """A grab notification for ``pid`` was heard at ``now``: its timer starts again (step 2)."""
        self._last_grab[pid] = now
        self._arm(pid, now)

    async def run(self) -> None:
        """Fire grab timers when they are due, until the node stops."""
        while not self._node.stopped:
            for pid in self._timers.pop_due(self._node.monotonic() + EPSILON):
                try:
                    await self._fire(pid)
                except StoreError as exc:
                    self._outages.failed("grab notification", exc)
                    self.set(pid, self._node.monotonic() + self._retry_in())
                else:
                    self._outages.recovered("grab notification")
            head = self._timers.next_at()
            self._moved.clear()
            timeout = None if head is None else max(0.0, head - self._node.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._moved.wait(), timeout)

    def _arm(self, pid: str, now: float) -> None:
        """The next timer of ``pid``: one normal lease time (plus jitter) from ``now``."""
        times = self._node.times
        self.set(pid, now + times.normal_lease * (1 + self._node.rng.uniform(0, times.jitter)))

    def _retry_in(self) -> float:
        """How soon to look at a timer again that could not act now (the jitter window)."""
        times = self._node.times
        return max(times.normal_lease * times.jitter, times.leases_held_delay)

    async def _fire(self, pid: str) -> None:
        """Step 1 for one partition whose timer fired (see the module docstring)."""
        node = self._node
        now = node.monotonic()
        grab = node.grab_seen
        if self._subscription.deaf(now) or grab is None:
            # we would not hear our own race
            self.set(pid, max(now + self._retry_in(), self._subscription.quiet_until))
            return
        pin = node.pins.get(pid)
        elsewhere = pin is not None and pin != node.owner_id
        if pid in node.owned or pid in node.starting:
            # a drained owner, or one holding a partition pinned elsewhere, asks others to take it
            candidate = pid not in node.handing_off and (elsewhere or (node.drained and pin is None))
        else:  # only the pinned node challenges a pinned partition; a drained node nothing
            candidate = not elsewhere and not (node.drained and pin is None)
        if not candidate or self._racer.racing(pid) or node.unknown(pid):
            self._arm(pid, now)
            return
        if grab.get(pid) == node.owner_id and pid in node.owned:
            # our own mark from a race we won: we want out now, not after the minimum lease grab time
            await self._racer.clear_mark(pid)
        if pid not in grab:
            await self._publish_grab(pid, now)
        elif now - self._last_grab.get(pid, now) > node.times.maximum_lease:
            # (b): the winner died between steps 3 and 6. Allocation first: while the grab mark
            # stands nobody can win, so no new allocation can be wiped by this.
            log.warning(
                "%s: partition %s: grab mark of %s is older than the maximum lease time (%gs); clearing it",
                node.owner_id,
                pid,
                grab[pid],
                node.times.maximum_lease,
            )
            await self._backend.hdel("allocation", pid)
            if await self._backend.hdel("grab", pid, expect=grab[pid]):
                grab.pop(pid, None)
                await self._publish_grab(pid, now)
            else:
                self._arm(pid, now)
        else:  # a race is on (or our view is a little old): look again soon
            self.set(pid, now + self._retry_in())

    async def _publish_grab(self, pid: str, now: float) -> None:
        self._arm(pid, now)
        await self._backend.publish("grab", pid)
