"""Renewal: when each held lease is renewed, and the renewal steps a driver runs between cycles.

With renewal steps (``renewal_steps``, or the driver's ``Driver.renewal_steps``) a lease is renewed
once ``renew_share`` of the expiry has passed, by ``renew()`` at ``next_renewal()`` or by any cycle
that finds it due; a failed renewal is tried again after a backoff while the lease holds. Without
them, cycles alone renew (see ``balancer.lease.options``).
"""

from __future__ import annotations

from collections.abc import Awaitable

from balancer.errors import StoreUnavailable
from balancer.protocol import CYCLES_ONLY, CycleReport, Driver, by_partition

from .options import EARLY, GATHER, LATE, RETRY_CYCLES, RETRY_SHARE
from .state import Lease
from .writes import Writes


class Renewal(Writes):
    """Renewal steps and the renewal schedule."""

    def next_renewal(self) -> float | None:
        """The local monotonic time at which ``renew()`` next has a lease to renew (perhaps already
        past), or None: none held that still holds. A lease whose deadline passed is left to the cycles,
        which renew it with the ETag it had if nobody took it meanwhile."""
        now, times = self.monotonic(), []
        for lease in self._leases.values():
            at = self._due_at(lease) if self._retry_at is None else max(self._due_at(lease), self._retry_at)
            if now - lease.renewed_at < self.expiry and at < lease.renewed_at + self.expiry:
                times.append(at)
        return min(times, default=None)

    async def renew(self, driver: Driver = CYCLES_ONLY) -> CycleReport:
        """Renew the leases due now (``next_renewal()``), between cycles: one conditional write per
        lease with the ETag this worker holds, no listing, no plan. Raises StoreUnavailable (holding on
        to the leases, to be tried again at ``next_renewal()``). The report names the leases lost
        (another worker's write moved the ETag) and the requests spent."""
        async with self._lock:
            return await self._guarded(self._renew(driver))

    async def _guarded(self, step: Awaitable[CycleReport]) -> CycleReport:
        """Run a cycle or a renewal step (under the lock): on failure, note an outage, read the table
        in full next time (whatever the step missed) and schedule the renewal's retry."""
        try:
            report = await step
        except Exception as exc:
            self._failed = self._failed or isinstance(exc, StoreUnavailable)
            self._table.forget()
            self._renewal_failed()
            raise
        self._renewal_worked()
        return report

    async def _renew(self, driver: Driver) -> CycleReport:
        started = self.monotonic()
        self._requests = self._rows = 0
        renewing = self._renewing(self.monotonic(), driver.renewal_steps)
        if not renewing:
            return CycleReport(owned=self.owned)
        requests = [self._leases[p].record for p in self._leases if p in renewing]
        sent_at = self.monotonic()
        won = by_partition(await self._call(self.store.claim_ownership(requests)))
        failed = [r for r in requests if r.partition_id not in won]
        if failed:
            self._table.forget()  # as in a cycle: the record changed behind this worker's copy
            won.update(await self._retry(failed, {}, sent_at))
        stamp = self._stamp(list(won.values()))
        held = bool(self._leases)
        _, lost, _ = self._apply(won, {}, [], renewing, sent_at, stamp)
        self._handing_off &= set(self._leases)
        if held and not self._leases and self.controls is not None:
            await self._heartbeat(self._stamp())  # alive by its leases until now: by a heartbeat from now on
        report = CycleReport(
            owned=self.owned,
            lost=tuple(lost),
            requests=self._requests,
            seconds=self.monotonic() - started,
            rows=self._rows,
        )
        for event in report.lost:
            self._emit(event)
        return report

    def _due_at(self, lease: Lease) -> float:
        return lease.renewed_at + self.share * self.expiry

    def _renewing(self, at: float, steps: bool) -> set[str]:
        """The held partitions to renew in a request sent at ``at`` (local monotonic time)."""
        if not (self.renewal_steps or steps):
            return {p for p, lease in self._leases.items() if self._renewal_due(lease, at)}
        due = {p for p, lease in self._leases.items() if at + EARLY >= self._due_at(lease)}
        if not due:
            return due
        gather = GATHER * self.share * self.expiry
        return due | {p for p, lease in self._leases.items() if at - lease.renewed_at >= gather}

    def _renewal_due(self, lease: Lease, at: float) -> bool:
        """Whether to renew ``lease`` in the cycle starting at ``at`` (local monotonic time)."""
        if self.interval is None:
            return True
        age = at - lease.renewed_at
        return age >= self.expiry / 2 or age + RETRY_CYCLES * self.interval * LATE >= self.expiry

    def _renewal_failed(self) -> None:
        """A renewal (or a cycle, which may have carried one) failed: try again after a backoff."""
        self._renew_failures += 1
        backoff = RETRY_SHARE * 2 ** min(self._renew_failures - 1, 10) * self.expiry
        self._retry_at = self.monotonic() + backoff

    def _renewal_worked(self) -> None:
        self._renew_failures, self._retry_at = 0, None
