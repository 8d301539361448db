"""One race of the lease race: 001 steps 2 to 6 for one grab notification heard.

2. wait ``race_wait`` from when the notification was heard (the busier, the longer);
3. ``HSETNX`` the grab hash: the first to set it wins; a node that lost a partition it processes
   hands it over (``lose``: the coordinator's step 3b);
4. the winner waits for the previous processor's allocated notice, at most the maximum shutdown time;
5. then marks the allocation hash with itself, takes the ownership record and starts processing;
6. after the minimum lease grab time it clears its grab mark, so the partition can be challenged again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from balancer.errors import StoreError
from balancer.model import BalancerEvent, EventKind
from balancer.race.backend import RaceBackend
from balancer.race.leases import Leases
from balancer.race.node import EPSILON, Outages, RaceNode, log
from balancer.race.subscription import Subscription

Lose = Callable[[str, str], None]  # (partition, why): a race this node processes was won by another
Emit = Callable[[BalancerEvent], None]


class Racer:
    """The races of one node: at most one per partition at a time, each a task of its own."""

    def __init__(
        self,
        node: RaceNode,
        backend: RaceBackend,
        leases: Leases,
        subscription: Subscription,
        outages: Outages,
        *,
        lose: Lose,
        emit: Emit,
    ) -> None:
        self._node = node
        self._backend = backend
        self._leases = leases
        self._subscription = subscription
        self._outages = outages
        self._lose = lose
        self._emit = emit
        self._racing: dict[str, asyncio.Task[None]] = {}  # from the notification until started (step 5)
        self._deciding: set[str] = set()  # ... until the HSETNX has answered
        self._taking = asyncio.Lock()  # one HSETNX to take a partition at a time (see _decide)
        self._marks: dict[str, float] = {}  # grab marks this node set -> monotonic time to clear them
        self._allocated: dict[str, asyncio.Event] = {}  # allocated notices awaited (step 4)
        self._background: set[asyncio.Task[None]] = set()  # mark clearing (step 6)

    # what the other parts ask --------------------------------------------------------------

    def racing(self, pid: str) -> bool:
        """True from the notification until the winner started (or this node gave up)."""
        return pid in self._racing

    def deciding(self, pid: str) -> bool:
        """True while this node waits to send, or waits for the answer of, its HSETNX for ``pid``."""
        return pid in self._deciding

    def marked(self) -> set[str]:
        """The partitions whose grab mark this node set and has not cleared yet."""
        return set(self._marks)

    def forget_marks(self) -> None:
        self._marks.clear()

    def tasks(self) -> list[asyncio.Task[None]]:
        """Every race and mark-clearing task still running (to cancel them)."""
        return [*self._racing.values(), *self._background]

    # what the other parts tell -------------------------------------------------------------

    def start(self, pid: str, heard: float) -> None:
        """Race for ``pid``, challenged at monotonic time ``heard`` (not while a race for it is on)."""
        task = asyncio.get_running_loop().create_task(self._race(pid, heard), name=f"race {self._node.owner_id} {pid}")
        self._racing[pid] = task
        task.add_done_callback(lambda done: self._race_done(pid, done))

    def allocated(self, pid: str) -> None:
        """The previous processor of ``pid`` finished shutting it down (its allocated notice)."""
        event = self._allocated.get(pid)
        if event is not None:
            event.set()

    async def clear_mark(self, pid: str) -> None:
        """Delete this node's grab mark of ``pid`` (only ours: a newer winner's stays)."""
        node = self._node
        await self._backend.hdel("grab", pid, expect=node.owner_id)
        self._marks.pop(pid, None)
        if node.grab_seen is not None and node.grab_seen.get(pid) == node.owner_id:
            del node.grab_seen[pid]

    async def clear_due_marks(self) -> None:
        """Step 6 for marks whose race task could not clear them (a store error, a stop)."""
        now = self._node.monotonic()
        for pid, due in list(self._marks.items()):
            if due + self._node.times.leases_held_delay <= now and pid not in self._racing:
                await self.clear_mark(pid)

    # one race ------------------------------------------------------------------------------

    def _race_done(self, pid: str, task: asyncio.Task[None]) -> None:
        if self._racing.get(pid) is task:
            del self._racing[pid]
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            assert exc is not None
            if isinstance(exc, StoreError):
                self._outages.failed("race", exc)
            else:
                log.error("%s: race for partition %s failed", self._node.owner_id, pid, exc_info=exc)

    async def _race(self, pid: str, heard: float) -> None:
        """Steps 2 to 6 for one notification."""
        node = self._node
        pin = node.pins.get(pid)
        if (pin is not None and pin != node.owner_id) or (node.drained and pin != node.owner_id):
            return  # never takes it; if it holds it, the next cycle sees who won (step 3b, late)
        self._deciding.add(pid)
        try:
            decided = await self._decide(pid, heard, pin == node.owner_id)
        finally:
            self._deciding.discard(pid)
        if decided is None:
            return
        winner, waited, meant = decided
        self._outages.recovered("race")
        if node.grab_seen is not None:
            node.grab_seen[pid] = winner
        if winner != node.owner_id:
            if node.processing(pid):
                late = f", {waited - meant:.2f}s late" if waited - meant > node.times.leases_held_delay / 2 else ""
                self._lose(pid, f"{winner} won the race (this node waited {waited:.2f}s{late})")
            return
        self._marks[pid] = node.monotonic() + node.times.minimum_lease_grab
        if node.processing(pid):
            await self._keep(pid)
        else:
            await self._take(pid, waited)
        task = asyncio.get_running_loop().create_task(self._clear_mark_later(pid))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _clear_mark_later(self, pid: str) -> None:
        """Step 6: after the minimum lease grab time (and not before the winner has started)."""
        await asyncio.sleep(max(0.0, self._marks.get(pid, 0.0) - self._node.monotonic()))
        with contextlib.suppress(StoreError):  # the cycle tries again (``clear_due_marks``)
            await self.clear_mark(pid)

    async def _decide(self, pid: str, heard: float, pinned_here: bool) -> tuple[str, float, float] | None:
        """Steps 2 and 3: wait ``race_wait`` from when the notification was heard, then HSETNX.
        Returns (the winner, seconds waited, seconds it meant to wait), or None when this node did
        not try. (A node that woke later than it meant by more than half a delay may lose a race it
        should have won: a starved machine; its loss says so.)

        The load is read again whenever the wait ends, and a node sends one HSETNX to take a
        partition at a time: of several challenges heard at once, each attempt sees the answer of
        the one before (a win counts at once), instead of all of them going out at the same instant
        with the same count (one idle node would then win every one of them). An owner defending
        its partition does not queue behind its own attempts to take others.
        """
        node, times = self._node, self._node.times
        epoch, generation = self._subscription.epoch, self._subscription.generation
        while True:
            owner = node.processing(pid)
            meant = node.wait(pid, owner, pinned_here)
            left = heard + meant - node.monotonic()
            if left > EPSILON:
                await node.sleep_unless_load_drops(left)
                continue
            waited = node.monotonic() - heard
            if waited > times.wait_cap + times.leases_held_delay / 2:
                log.warning("%s: partition %s: woke too late to race (%.2fs)", node.owner_id, pid, waited)
                return None
            if epoch != self._subscription.epoch or generation is None:
                # The subscription broke while we waited: the store may have restarted and lost the
                # winner's grab mark, and a late HSETNX would win a second race. Let this one go.
                return None
            if owner:
                return await self._grab(pid, generation, waited, meant)
            async with self._taking:
                if heard + node.wait(pid, False, pinned_here) - node.monotonic() > EPSILON:
                    continue  # an attempt before this one won: this node is busier now
                decided = await self._grab(pid, generation, waited, meant)
                if decided is not None and decided[0] == node.owner_id:
                    node.starting.add(pid)  # counted from the answer on, before it is processed
                return decided

    async def _grab(self, pid: str, generation: str, waited: float, meant: float) -> tuple[str, float, float] | None:
        """Step 3's HSETNX, in the store's generation this race began in; None if it restarted since
        (a break the subscription has not noticed yet: the winner's grab mark may be gone)."""
        winner = await self._backend.grab(pid, self._node.owner_id, generation)
        if winner is None:
            log.info(
                "%s: partition %s: the race's store restarted during the race; letting it go", self._node.owner_id, pid
            )
            return None
        return winner, waited, meant

    async def _keep(self, pid: str) -> None:
        """Steps 4 and 5 for a winner that already processes the partition."""
        owner_id = self._node.owner_id
        holder = await self._backend.hget("allocation", pid)
        if holder == owner_id:
            return
        if holder is not None:  # a node this one never heard of believes it processes it
            await self._await_allocated(pid)
        await self._backend.hset("allocation", pid, owner_id)

    async def _take(self, pid: str, wait: float) -> None:
        """Steps 4 and 5: wait for the previous processor, mark the allocation, take the record."""
        node = self._node
        try:
            event = self._allocated.setdefault(pid, asyncio.Event())
            event.clear()  # before reading: a notice sent after the read is not missed
            holder = await self._backend.hget("allocation", pid)
            handed = True
            if holder is not None and holder != node.owner_id:
                handed = await self._await_allocated(pid)
            await self._backend.hset("allocation", pid, node.owner_id)
            async with self._leases.lock:
                record = await self._leases.take(pid)
                if record is None or node.stopped:
                    await self._backend.hdel("allocation", pid, expect=node.owner_id)
                    return
                node.owned[pid] = record
        finally:
            node.starting.discard(pid)
            self._allocated.pop(pid, None)
            if pid not in node.owned:
                node.load_dropped()
        if holder is None or holder == node.owner_id:
            kind, why = EventKind.CLAIM, "won the lease race; nobody was processing it"
        elif handed:
            kind, why = EventKind.STEAL, f"won the lease race; {holder} shut it down and handed it over"
        else:
            kind = EventKind.EXPIRE
            why = f"won the lease race; {holder} did not hand it over within {node.times.maximum_shutdown:g}s"
        why += f" (waited {wait:.2f}s)"
        self._emit(BalancerEvent(kind, node.ref, pid, node.owner_id, holder, node.owner_id, why, node.clock()))

    async def _await_allocated(self, pid: str) -> bool:
        """Wait for the allocated notice of ``pid``; False when the maximum shutdown time passed first."""
        event = self._allocated.setdefault(pid, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), self._node.times.maximum_shutdown)
        except TimeoutError:
            return False
        return True
