"""Events and the time they carry: the store's clock, carried forward on the local monotonic clock.

An event is stamped with the store's clock (a won write's last-modified, else the latest reading),
never this worker's wall clock unless the store's was never read; then told to the event sink and,
for releases, to the workers waiting for them (``on_released``).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable
from typing import TypeVar

from balancer import avoid, load
from balancer.model import BalancerEvent, EventKind, Member, OwnershipRecord, pid_key
from balancer.notices import Released

from .state import LeaseState

T = TypeVar("T")


class Stamping(LeaseState):
    """Stamps, emits and announces events; counts store requests."""

    async def _call(self, awaitable: Awaitable[T]) -> T:
        self._requests += 1
        return await awaitable

    def _seen_store_time(self, at: float) -> None:
        self._anchor = (at, self.monotonic())

    def _stamp(self, won: list[OwnershipRecord] | None = None) -> float:
        """The time to stamp an event with: the store's clock (a won write's own last-modified, else
        the latest reading of the store's clock carried forward on the monotonic clock), never this
        worker's wall clock unless the store's was never read."""
        for record in won or ():
            if record.last_modified is not None and math.isfinite(record.last_modified):
                self._seen_store_time(record.last_modified)
                return record.last_modified
        if self._anchor is None:
            return self.clock()
        at, read = self._anchor
        return at + max(0.0, self.monotonic() - read)

    def _member(self, now: float) -> Member:
        """This worker's heartbeat; its info names the strategy, so the dashboard previews with it,
        and the expiry, so a reader judges the heartbeat by the fleet's expiry, not its own setting."""
        if self._joined is None:
            self._joined = now
        # "joined": when it announced itself, by the store's clock (``Reading._announcing`` of the others)
        info = {"strategy": self.strategy.name, "expiry": f"{self.expiry:g}", "joined": f"{self._joined:.3f}"}
        if self._announced:  # a cycle after its announcing one: alive beyond its start (``cooperative.unproven``)
            info["ready"] = "1"
        if self._published:
            info[load.INFO_KEY] = load.format_rates(self._published)
        if avoided := self.avoiding():
            info[avoid.INFO_KEY] = avoid.format_avoided(avoided)
        return Member(self.ref, self.owner_id, now, info)

    def _event(
        self, kind: EventKind, pid: str, new_owner: str | None, reason: str, now: float, handoff: bool = False
    ) -> BalancerEvent:
        """An event this worker reports about a lease it held (release or loss); ``handoff``: a release
        on a planned move, not a shutdown."""
        return BalancerEvent(kind, self.ref, pid, new_owner, self.owner_id, self.owner_id, reason, now, handoff)

    def _emit(self, event: BalancerEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)

    def _announce(self, released: list[str]) -> None:
        if released and self.on_released is not None:
            self.on_released(Released(self.ref, tuple(sorted(released, key=pid_key)), self.owner_id))
