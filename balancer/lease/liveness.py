"""Liveness and dark time: how this worker shows itself alive, and what it knows of outages.

A worker holding leases is alive by its renewals; one holding nothing heartbeats. A gap without any
write showing it alive, longer than the expiry, restarts its handoff waits. Spans in which a cycle
failed are dark: nobody could renew then, so they do not age records (``View.dark``).
"""

from __future__ import annotations

from balancer import avoid

from .stamping import Stamping


class Liveness(Stamping):
    """Heartbeats, proofs of life and dark spans."""

    def _darkness(self, now: float) -> tuple[tuple[float, float], ...]:
        """The dark spans as of a view read at ``now``: the span since the last view read is dark if a
        cycle failed since (the store could not be reached, so nobody could renew). A span that ended
        more than the expiry ago is dropped: whatever it covers has aged past the expiry anyway."""
        if self._failed and self._last_view is not None and now > self._last_view:
            self._dark.append((self._last_view, now))
        self._failed = False
        self._last_view = now
        self._dark = [(start, end) for start, end in self._dark if now - end <= self.expiry]
        return tuple(self._dark)

    def _heartbeat_due(self) -> bool:
        """A worker that holds partitions is alive by its ownership records (renewed while it lives:
        ``balancer.model.signs_of_life``), so it sends no heartbeat; one that holds nothing heartbeats
        every cycle, and every worker does in its first cycle, announcing itself, its strategy and its
        expiry (the member record that makes its leases count as a live worker's)."""
        return not self._leases or self._heartbeat_at is None or self.avoiding() != self._avoid_said

    async def _heartbeat(self, now: float) -> None:
        assert self.controls is not None
        sent_at = self.monotonic()
        member = self._member(now)
        await self._call(self.controls.heartbeat(member))
        self._avoid_said = avoid.parse_avoided(member.info.get(avoid.INFO_KEY, ""))
        self._heartbeat_at = self.monotonic()
        self._proved_alive(sent_at)

    def _proved_alive(self, sent_at: float) -> None:
        """A write sent at ``sent_at`` (local monotonic) showed this worker alive to the others."""
        self._absent_until(sent_at)
        self._proved_at = sent_at if self._proved_at is None else max(self._proved_at, sent_at)

    def _absent_until(self, at: float) -> None:
        """If nothing showed this worker alive for longer than the expiry before ``at``, the others may
        have counted it gone meanwhile: a holder may have taken back the partition it was handing over
        (released, unclaimed, claimed again), a new tenure the store cannot tell from a renewal. Every
        handoff wait then starts afresh, so the timeout never takes over a lease on the old account
        (the partition suite saw it: a receiver on a flapping link stole a lease claimed 0.3 s before)."""
        if self._proved_at is not None and at - self._proved_at > self.expiry:
            self._waiting.clear()
            self._waiting_on.clear()
