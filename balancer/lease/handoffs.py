"""Handoffs and releases: giving partitions up, on a planned move or when stopping.

With a handoff hook (``on_handoff``) a planned release first tells the driver, which stops the
partition's processing after its last checkpoint and then calls ``release()``; meanwhile the lease
keeps being renewed. Releases that finish together go in one store request (``release_many``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from balancer import avoid
from balancer.errors import StoreUnavailable
from balancer.model import BalancerEvent, EventKind
from balancer.notices import Released
from balancer.protocol import HandoffHook

from .read import Reading


class Handoffs(Reading):
    """Planned moves handed off, and releases."""

    def _start_handoffs(self, planned: list[str], hook: HandoffHook | None) -> list[str]:
        """The partitions to release in this cycle's request. With a handoff hook (this coordinator's
        own ``on_handoff``, else the driver's ``hook``), a planned release first tells the runtime
        (which stops the pump, checkpoints and calls ``release``); the lease keeps being renewed
        meanwhile, so nobody else starts on it before the last checkpoint."""
        on_handoff = self.on_handoff if self.on_handoff is not None else hook
        if on_handoff is None:
            return planned
        for pid in planned:
            if pid not in self._handing_off:
                self._handing_off.add(pid)
                on_handoff(pid)
        return []

    def healed(self, partition_id: str, reason: str) -> None:
        """A healing step on held ``partition_id`` (``Balancer.healed``): a HEAL event, stamped as any other."""
        self._emit(self._event(EventKind.HEAL, partition_id, self.owner_id, reason, self._stamp()))

    async def release(self, partition_id: str, reason: str = "handed off") -> BalancerEvent | None:
        """Give one held partition up now (the end of a handoff: the event's ``handoff`` is True); None
        if it was not held."""
        events = await self.release_many([partition_id], reason)
        return events[0] if events else None

    async def give_up(self, partition_id: str, reason: str, seconds: float) -> BalancerEvent | None:
        """Release ``partition_id`` (stuck on this worker: ``reason`` says why) and take it no more for
        ``seconds``. The heartbeat saying so (``balancer.avoid``) is written first, so the plans the
        release wakes already assign the partition elsewhere; if it cannot be written the partition is
        released anyway (the next cycle's heartbeat says it). None if it was not held."""
        self._avoid[partition_id] = max(self._avoid.get(partition_id, 0.0), self.monotonic() + seconds)
        if self.controls is not None and self._heartbeat_due():
            with contextlib.suppress(StoreUnavailable):
                await self._heartbeat(self._stamp())
        return await self.release(partition_id, reason)

    async def cannot_read(self, seconds: float) -> None:
        """This worker cannot read the hub at all: for ``seconds`` it is in no plan (``balancer.avoid``'s
        ``EVERY``, said in its heartbeat now), so its next cycles hand every partition over and claim none."""
        self._avoid[avoid.EVERY] = max(self._avoid.get(avoid.EVERY, 0.0), self.monotonic() + seconds)
        if self.controls is not None and self._heartbeat_due():
            with contextlib.suppress(StoreUnavailable):
                await self._heartbeat(self._stamp())

    async def can_read(self) -> None:
        """This worker reads the hub again: a ``cannot_read`` ends now (its heartbeat says so now where
        it can be written, else at the next cycle), and the plans count it in again."""
        if self._avoid.pop(avoid.EVERY, None) is None:
            return
        if self.controls is not None and self._heartbeat_due():
            with contextlib.suppress(StoreUnavailable):
                await self._heartbeat(self._stamp())
        if self.announce_joining and self.on_released is not None:  # back: news for the quiet, as a join is
            self.on_released(Released(self.ref, (), self.owner_id))

    async def release_many(self, partition_ids: Sequence[str], reason: str = "handed off") -> list[BalancerEvent]:
        """Give the held ones of ``partition_ids`` up now in one store request (the ends of handoffs
        that finished together); their events, in the order given. A worker handing over a hundred
        partitions at once (a cold start, a scale-out) makes one request, not a hundred one after the
        other, each holding the lock its renewals wait for."""
        async with self._lock:
            return await self._release(partition_ids, reason)

    async def _release(self, partition_ids: Sequence[str], reason: str) -> list[BalancerEvent]:
        leases = {p: self._leases.pop(p) for p in dict.fromkeys(partition_ids) if p in self._leases}
        self._handing_off.difference_update(partition_ids)
        if not leases:
            return []
        try:
            won, events = await self._write_releases(leases, reason, handoff=True)
        except StoreUnavailable:
            # Nothing changed in the store: the leases are still ours. Keep them, so the next cycle
            # renews them and plans the handoffs again, rather than leave them unowned until they expire.
            self._leases.update(leases)
            raise
        for event in events:
            self._emit(event)
        if not self._leases and self.controls is not None:
            with contextlib.suppress(StoreUnavailable):  # the next cycle heartbeats anyway
                await self._heartbeat(self._stamp())  # alive by its leases until now: by a heartbeat from now on
        if won:
            self._announce(list(won))
        return events

    async def _leave(self, raising: bool = False) -> bool:
        """Remove this worker's member record (none kept: True); False if the store is down, unless
        ``raising`` (StoreUnavailable then)."""
        if self.controls is None:
            return True
        try:
            await self._call(self.controls.remove_member(self.ref, self.owner_id))
        except StoreUnavailable:
            if raising:
                raise
            return False
        return True

    async def release_all(self, reason: str = "shutting down") -> list[BalancerEvent]:
        """Give every held partition up at once, so others take them now rather than after expiry."""
        async with self._lock:
            return await self._release_all(reason)

    async def _release_all(self, reason: str) -> list[BalancerEvent]:
        # Its member record goes first: a worker that reads the releases then knows their holder left,
        # and leaves them free a while for a newcomer joining as this one stops
        # (``cooperative.vacated_for``). Gone after them, a reader between the two took them as any free
        # partition, and a newcomer's share then moved to it a cycle later (10 moves in a simulated
        # stop-and-join). A record it could not remove now is tried again after the releases.
        left = await self._leave()
        if not self._leases:
            if not left:
                await self._leave(raising=True)
            return []
        won, events = await self._write_releases(self._leases, reason, handoff=False)
        self._leases.clear()
        self._handing_off.clear()
        if not left:
            await self._leave(raising=True)
        for event in events:
            self._emit(event)
        self._announce(list(won))
        return events
