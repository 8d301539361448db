"""The conditional writes of claims, renewals and releases, and what their results do to the lease table.

Every write carries the ETag last seen; a write that loses changed nothing. Steals and renewals go
round the ETag loop of 000 (``_retry``); the results are applied to the table (``_apply``) as gains,
losses and releases.

A stolen lease is fenced: the worker it was taken from may handle events until its own lease runs
out by its own clock (it hears of the steal only at its next renewal), so ``holds()`` is False
meanwhile and no pump starts: a steal never makes two workers handle a partition at once. With a
strategy that judges by the store's clock, the fence lasts until the replaced record would have
counted as expired (``_steal_fences``), as a claim of an expired record is judged; otherwise, or
after the ETag loop, one whole expiry from the moment the steal came back (the replaced write was
sent before the steal landed, so its writer's lease ends within that expiry whatever the clocks
say). A claim of an expired or released record needs no fence.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import replace

from balancer.model import BalancerEvent, EventKind, OwnershipRecord
from balancer.protocol import by_partition
from balancer.strategies import Claim

from .liveness import Liveness
from .state import Lease

log = logging.getLogger("leaseboard.balancer")


class Writes(Liveness):
    """Claims, renewals and releases written to the ownership store."""

    def _claim_record(self, claim: Claim) -> OwnershipRecord:
        if claim.seen is None:
            return OwnershipRecord(self.ref, claim.partition_id, self.owner_id)
        return claim.seen.claimed_by(self.owner_id)

    def _drop_taken(self, listed: Mapping[str, OwnershipRecord]) -> list[BalancerEvent]:
        """Forget leases the listing shows in someone else's hands; refresh our own ETags."""
        events = []
        for pid, lease in list(self._leases.items()):
            current = listed.get(pid)
            if current is not None and current.owner_id == self.owner_id:
                if self._fresh_after is None or pid in self._exact:  # else: its renewals were not read
                    lease.record = current
                continue
            holder = current.owner_id if current is not None and current.owner_id else None
            why = f"now held by {holder}" if holder else "record released or removed by another party"
            events.append(self._event(EventKind.LOST, pid, holder, why, self._stamp()))
            del self._leases[pid]
        return events

    async def _retry(
        self, failed: list[OwnershipRecord], claims: dict[str, Claim], sent_at: float
    ) -> dict[str, OwnershipRecord]:
        """The ETag loop of 000: while the partition's owner is still the one we meant to replace
        (it renewed, so the ETag moved), try again with the fresh ETag; stop as soon as a third
        worker holds it, which means another claimer beat us to it.

        Only steals (and our own renewals) go round the loop. A claim of an expired or released
        partition that lost because its owner renewed meanwhile found that owner alive: taking
        the fresh lease would leave two workers processing the partition until the owner's next
        cycle (the fault-injection suite saw it after a store outage, when everyone renews and
        claims at once). The next cycle plans again with what the store says then.
        """
        won: dict[str, OwnershipRecord] = {}
        pending = [r for r in failed if r.partition_id not in claims or claims[r.partition_id].kind is EventKind.STEAL]
        for _ in range(self.etag_retries if pending else 0):
            listed = by_partition(await self._call(self.store.list_ownership(self.ref)))
            self._rows += len(listed)
            again = []
            for request in pending:
                current = listed.get(request.partition_id)
                if current is None:
                    continue
                expected = self._expected_owner(request, claims)
                if current.owner_id != expected or current.etag == request.etag:
                    continue
                again.append(replace(current, owner_id=request.owner_id))
            if not again:
                break
            result = by_partition(await self._call(self.store.claim_ownership(again)))
            won.update(result)
            pending = [r for r in again if r.partition_id not in result]
            if not pending:
                break
        return won

    def _expected_owner(self, request: OwnershipRecord, claims: dict[str, Claim]) -> str:
        claim = claims.get(request.partition_id)
        if claim is not None:
            return claim.seen.owner_id if claim.seen is not None else ""
        return self.owner_id  # a renewal or a release of our own lease

    def _steal_fences(
        self, claims: Mapping[str, Claim], won: Mapping[str, OwnershipRecord], now: float
    ) -> dict[str, float]:
        """Seconds each steal won by its first write stays fenced, as the store's clock tells: until the
        record it replaced would have counted as expired (its last-modified plus the expiry, ``now``
        being the store's clock at the read, plus one tick of that clock), which is how a claim of an
        expired record is judged too. Only for strategies that judge by the store's clock; a steal
        that went round the ETag loop replaced a record newer than the one read, and is fenced for
        the whole expiry."""
        if not self.strategy.store_clock:
            return {}
        # A store whose clock ticks coarsely (Blob's Last-Modified and Date count whole seconds, both
        # truncated) may show a record up to one tick older than it is: a tick more. The partition
        # suite saw a Blob steal handle 0.17 s inside the old lease without it.
        tick = float(getattr(self.store, "clock_resolution", None) or 0.0)
        out = {}
        for pid, claim in claims.items():
            written = None if claim.seen is None else claim.seen.last_modified
            if claim.kind is EventKind.STEAL and pid in won and written is not None and math.isfinite(written):
                out[pid] = min(self.expiry, max(0.0, written + self.expiry - now + tick))
        return out

    def _apply(
        self,
        won: dict[str, OwnershipRecord],
        claims: dict[str, Claim],
        releases: list[str],
        renewing: set[str],
        sent_at: float,
        now: float,
        fences: Mapping[str, float] | None = None,
    ) -> tuple[list[BalancerEvent], list[BalancerEvent], list[BalancerEvent]]:
        if any(record.owner_id == self.owner_id for record in won.values()):
            self._proved_alive(sent_at)  # a claim or renewal of its own (a won release shows nothing)
        gained, lost, released = [], [], []
        for pid in list(self._leases):
            record = won.get(pid)
            if pid not in releases and pid not in renewing:
                continue  # not due for renewal this cycle: held as it was
            if pid in releases:
                del self._leases[pid]
                if record is not None:
                    released.append(self._event(EventKind.RELEASE, pid, None, "handed off", now, handoff=True))
                else:
                    lost.append(self._event(EventKind.LOST, pid, None, "taken before release", now))
            elif record is not None and record.owner_id == self.owner_id:
                self._leases[pid] = Lease(record, sent_at, self._leases[pid].fenced_until)
            else:
                del self._leases[pid]
                lost.append(self._event(EventKind.LOST, pid, None, "renewal refused (ETag moved)", now))
        for pid, claim in claims.items():
            record = won.get(pid)
            if record is None or record.owner_id != self.owner_id:
                continue
            fence = -math.inf
            if claim.kind is EventKind.STEAL:
                fence = self.monotonic() + (self.expiry if fences is None else fences.get(pid, self.expiry))
            self._leases[pid] = Lease(record, sent_at, fence)
            if claim.reason.startswith("corrupt record"):
                log.warning("partition %s: replaced a %s (%s)", pid, claim.reason, self.ref)
            gained.append(
                BalancerEvent(
                    claim.kind,
                    self.ref,
                    pid,
                    self.owner_id,
                    claim.previous_owner,
                    self.owner_id,
                    claim.reason,
                    now,
                )
            )
        return gained, lost, released

    async def _write_releases(
        self, leases: dict[str, Lease], reason: str, *, handoff: bool
    ) -> tuple[dict[str, OwnershipRecord], list[BalancerEvent]]:
        """Release ``leases`` in one store request: the records won, and an event per lease (RELEASE, or
        LOST where another worker had taken it), in their order, not emitted yet. Raises what the
        store raises, having changed nothing here."""
        records = [replace(lease.record, owner_id="") for lease in leases.values()]
        won = by_partition(await self._call(self.store.claim_ownership(records)))
        if len(won) < len(leases):
            self._table.forget()  # a record changed behind this worker's copy: read it all next time
        stamp = self._stamp(list(won.values()))
        events = [
            self._event(EventKind.RELEASE, pid, None, reason, stamp, handoff=handoff)
            if pid in won
            else self._event(EventKind.LOST, pid, None, "taken by another worker before the release", stamp)
            for pid in leases
        ]
        return won, events
