"""One race of the lease race (001 steps 2 to 6), part of ``RaceCoordinator``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from balancer.errors import StoreError
from balancer.model import BalancerEvent, EventKind, OwnershipRecord
from balancer.protocol import by_partition
from balancer.race.notify import EPSILON
from balancer.race.times import race_wait

if TYPE_CHECKING:
    from balancer.race.state import RaceState
else:
    RaceState = object

log = logging.getLogger("balancer.race.coordinator")


class RaceSteps(RaceState):
    """Steps 2 to 6 for one grab notification, and the winner's mark."""

    async def _race(self, pid: str, heard: float) -> None:
        """Steps 2 to 6 for one notification."""
        pin = self._pins.get(pid)
        if (pin is not None and pin != self.owner_id) or (self._drained and pin != self.owner_id):
            return  # never takes it; if it holds it, the next cycle sees who won (step 3b, late)
        self._deciding.add(pid)
        try:
            decided = await self._decide(pid, heard, pin == self.owner_id)
        finally:
            self._deciding.discard(pid)
        if decided is None:
            return
        winner, waited = decided
        self._recovered("race")
        if self._grab_seen is not None:
            self._grab_seen[pid] = winner
        if winner != self.owner_id:
            if pid in self._owned and pid not in self._handing_off:
                self._lose(pid, f"{winner} won the race (this node waited {waited:.2f}s)")
            return
        self._marks[pid] = self.monotonic() + self.times.minimum_lease_grab
        if pid in self._owned and pid not in self._handing_off:
            await self._keep(pid)
        else:
            await self._take(pid, waited)
        task = asyncio.get_running_loop().create_task(self._clear_mark_later(pid))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _clear_mark_later(self, pid: str) -> None:
        """Step 6: after the minimum lease grab time (and not before the winner has started)."""
        await asyncio.sleep(max(0.0, self._marks.get(pid, 0.0) - self.monotonic()))
        with contextlib.suppress(StoreError):  # the cycle tries again (``_clear_marks``)
            await self._clear_mark(pid)

    async def _clear_mark(self, pid: str) -> None:
        """Delete this node's grab mark of ``pid`` (only ours: a newer winner's stays)."""
        await self.backend.hdel("grab", pid, expect=self.owner_id)
        self._marks.pop(pid, None)
        if self._grab_seen is not None and self._grab_seen.get(pid) == self.owner_id:
            del self._grab_seen[pid]

    async def _decide(self, pid: str, heard: float, pinned_here: bool) -> tuple[str, float] | None:
        """Steps 2 and 3: wait ``race_wait`` from when the notification was heard, then HSETNX.
        Returns (the winner, seconds waited), or None when this node did not try.

        The load is read again whenever the wait ends, and a node sends one HSETNX to take a
        partition at a time: of several challenges heard at once, each attempt sees the answer of
        the one before (a win counts at once), instead of all of them going out at the same instant
        with the same count (one idle node would then win every one of them). An owner defending
        its partition does not queue behind its own attempts to take others.
        """
        epoch = self._epoch
        while True:
            owner = pid in self._owned and pid not in self._handing_off
            left = heard + self._wait(pid, owner, pinned_here) - self.monotonic()
            if left > EPSILON:
                await self._sleep_unless_load_drops(left)
                continue
            waited = self.monotonic() - heard
            if waited > self.times.wait_cap + self.times.leases_held_delay / 2:
                log.warning("%s: partition %s: woke too late to race (%.2fs)", self.owner_id, pid, waited)
                return None
            if epoch != self._epoch:
                # The subscription broke while we waited: the store may have restarted and lost the
                # winner's grab mark, and a late HSETNX would win a second race. Let this one go.
                return None
            if owner:
                return await self.backend.hsetnx("grab", pid, self.owner_id), waited
            async with self._taking:
                if heard + self._wait(pid, False, pinned_here) - self.monotonic() > EPSILON:
                    continue  # an attempt before this one won: this node is busier now
                winner = await self.backend.hsetnx("grab", pid, self.owner_id)
                if winner == self.owner_id:
                    self._starting.add(pid)  # counted from the answer on, before it is processed
                return winner, waited

    def _wait(self, pid: str, owner: bool, pinned_here: bool) -> float:
        if pinned_here:
            return 0.0
        challenged = (self.load.weight(pid) if self.load is not None else 1.0) if owner else None
        return race_wait(self.load_now(), challenged, self.times)

    async def _sleep_unless_load_drops(self, seconds: float) -> None:
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

    def _load_dropped(self) -> None:
        for waiter in self._waiters:
            _resolve(waiter)

    async def _keep(self, pid: str) -> None:
        """Steps 4 and 5 for a winner that already processes the partition."""
        holder = await self.backend.hget("allocation", pid)
        if holder == self.owner_id:
            return
        if holder is not None:  # a node this one never heard of believes it processes it
            await self._await_allocated(pid)
        await self.backend.hset("allocation", pid, self.owner_id)

    async def _take(self, pid: str, wait: float) -> None:
        """Steps 4 and 5: wait for the previous processor, mark the allocation, take the record."""
        try:
            event = self._allocated.setdefault(pid, asyncio.Event())
            event.clear()  # before reading: a notice sent after the read is not missed
            holder = await self.backend.hget("allocation", pid)
            handed = True
            if holder is not None and holder != self.owner_id:
                handed = await self._await_allocated(pid)
            await self.backend.hset("allocation", pid, self.owner_id)
            async with self._lock:
                record = await self._claim_record(pid)
                if record is None or self._stopped:
                    await self.backend.hdel("allocation", pid, expect=self.owner_id)
                    return
                self._owned[pid] = record
        finally:
            self._starting.discard(pid)
            self._allocated.pop(pid, None)
            if pid not in self._owned:
                self._load_dropped()
        if holder is None or holder == self.owner_id:
            kind, why = EventKind.CLAIM, "won the lease race; nobody was processing it"
        elif handed:
            kind, why = EventKind.STEAL, f"won the lease race; {holder} shut it down and handed it over"
        else:
            kind = EventKind.EXPIRE
            why = f"won the lease race; {holder} did not hand it over within {self.times.maximum_shutdown:g}s"
        why += f" (waited {wait:.2f}s)"
        self._emit(BalancerEvent(kind, self.ref, pid, self.owner_id, holder, self.owner_id, why, self.clock()))

    async def _await_allocated(self, pid: str) -> bool:
        """Wait for the allocated notice of ``pid``; False when the maximum shutdown time passed first."""
        event = self._allocated.setdefault(pid, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), self.times.maximum_shutdown)
        except TimeoutError:
            return False
        return True

    async def _claim_record(self, pid: str) -> OwnershipRecord | None:
        """The partition's ownership record, taken over whoever holds it (the race decided)."""
        for _ in range(4):
            listed = by_partition(await self._store_call(self.store.list_ownership(self.ref)))
            current = listed.get(pid)
            request = current.claimed_by(self.owner_id) if current else OwnershipRecord(self.ref, pid, self.owner_id)
            won = await self._store_call(self.store.claim_ownership([request]))
            if won:
                return won[0]
        log.warning("%s: partition %s: its ownership record kept changing; not taken", self.owner_id, pid)
        return None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
