"""The coordinator: one worker's load-balancing cycle (list -> plan -> claim and renew -> report).

It owns no timer and no processing. The runtime calls ``cycle()`` on its own schedule (so lease
renewal never waits behind a handler) and asks ``holds()`` before handing an event on; the
simulator calls the same ``cycle()`` on simulated time. A driver that also calls ``renew()`` at
``next_renewal()`` between cycles (the runtime's loop does, and says so: ``Driver.renewal_steps``) has each
lease renewed on its own schedule, when ``renew_share`` of the expiry has passed, not at a cycle.
"""

from __future__ import annotations

from dataclasses import replace

from balancer.model import OwnershipRecord
from balancer.notices import Released
from balancer.protocol import CYCLES_ONLY, Balancer, CycleReport, Driver, by_partition
from balancer.strategies import Plan, View

from .handoffs import Handoffs
from .state import NOTHING


class Coordinator(Handoffs):
    """Balances one worker's share of one hub and consumer group."""

    async def cycle(self, driver: Driver = CYCLES_ONLY) -> CycleReport:
        """Run one load-balancing cycle for ``driver`` (its handoff hook, its renewal steps). Raises
        StoreUnavailable (holding on to current leases)."""
        async with self._lock:
            return await self._guarded(self._cycle(driver))

    async def _cycle(self, driver: Driver) -> CycleReport:
        started = self.monotonic()
        self._absent_until(started)  # before the view carries the handoff waits into the plan
        self._requests = self._rows = 0
        pids = self._partition_ids = tuple(await self.partitions())
        view = await self._view(pids)
        listed, now, planned_at = view.ownership, view.now, self.monotonic()
        plan = self._plan(view)
        proving = self._joining(view, started)
        # The handoff timeout runs per holder: a partition that changed hands meanwhile (its holder's
        # lease ran out and a third worker took it) is waited for afresh, not taken from the new
        # holder at once on the old holder's account.
        self._waiting = {p: view.waiting.get(p, now) for p in plan.waiting}
        self._waiting_on = {p: listed[p].owner_id for p in plan.waiting if p in listed}

        lost = self._drop_taken(listed)
        releases = self._start_handoffs([p for p in plan.releases if p in self._leases], driver.on_handoff)
        renewing = self._renewing(self.monotonic(), driver.renewal_steps) - set(releases)
        requests: list[OwnershipRecord] = [self._leases[p].record for p in self._leases if p in renewing]
        requests += [replace(self._leases[p].record, owner_id="") for p in releases]
        claims = {c.partition_id: c for c in plan.claims if c.partition_id not in self._leases}
        requests += [self._claim_record(c) for c in claims.values()]

        sent_at = self.monotonic()
        won = by_partition(await self._call(self.store.claim_ownership(requests))) if requests else {}
        failed = [r for r in requests if r.partition_id not in won]
        if failed:
            # A write lost: the record had changed since the copy was read, perhaps behind the store's
            # back (a hand edit no change feed sees). The next read is whole.
            self._table.forget()
            retried = await self._retry(failed, claims, sent_at)
        else:
            retried = {}
        fences = self._steal_fences(claims, won, now)  # before the retried ones join: see _steal_fences
        won.update(retried)

        stamp = self._stamp(list(won.values()))
        held = bool(self._leases)
        gained, lost2, released = self._apply(won, claims, releases, renewing, sent_at, stamp, fences)
        self._handing_off &= set(self._leases)
        if held and not self._leases and self.controls is not None:
            await self._heartbeat(self._stamp())  # alive by its leases until now: by a heartbeat from now on
        report = CycleReport(
            owned=self.owned,
            gained=tuple(gained),
            lost=tuple(lost + lost2 + released),
            requests=self._requests,
            seconds=self.monotonic() - started,
            rebalance=self._rebalance,
            announced=view.first_cycle,
            waiting=tuple(p for p in plan.waiting if p not in self._leases),
            rows=self._rows,
            planned=not self._steady,
            recheck_at=None if plan.recheck_in is None else planned_at + plan.recheck_in,
        )
        self._tell(report, [e.partition_id for e in released], proving)
        return report

    def _joining(self, view: View, started: float) -> bool:
        """Note that this worker has announced itself (and, after its first cycle, look for others joining
        for up to an interval: ``_announcing``); True for its first cycle after the announcing one, which
        shows it alive and ready (a second heartbeat): the news of its joining comes then, when the
        holders will hand it partitions (``cooperative.unproven``). Told after the first, it woke them to
        find it not ready, and their next wait was no quiet one."""
        first, self._announced = not self._announced, True
        if first and self.interval is not None:
            self._settle = (started + self.interval, view.members)
        proving, self._proven = not first and not self._proven, self._proven or not first
        return proving

    def _plan(self, view: View) -> Plan:
        """This cycle's plan: the strategy's, or none on a steady cycle (``steady_cycles``)."""
        if self._steady:
            return NOTHING  # what the plan would say (``steady_cycles``); the last active owners stand
        plan = self.strategy.plan(view, self.rng)
        active = view.active()
        self._previous.update((p, r.owner_id) for p, r in active.items())
        self._settled = self._settles(view, plan, active)
        return plan

    def _tell(self, report: CycleReport, released: list[str], joining: bool) -> None:
        """Tell the event sink what the cycle did, the waiting workers what it released, and, after the
        cycle after its announcing one (``joining``), the quiet ones that this worker joined and is
        ready (``announce_joining``): holders hand it partitions from then on (``cooperative.unproven``)."""
        # Losses first: in a take-back (a corrupt record over its own partition: lost to the phantom,
        # claimed again) the loss happened first, and the console's tenures follow the log's order.
        for event in report.lost + report.gained:
            self._emit(event)
        self._announce(released)
        if joining and self.announce_joining and self.on_released is not None:
            self.on_released(Released(self.ref, (), self.owner_id))  # joined: news for the quiet


_IS_A_BALANCER: type[Balancer] = Coordinator  # the type checker proves it satisfies the protocol
