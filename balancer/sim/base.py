"""One seeded run of one scenario, whatever coordinator the workers run: ``Run``.

A run drives N workers' ``Balancer``s on a ``sim_loop`` loop as the runtime's processor does: each
cycles, renews and wakes when the one schedule says (``balancer.schedule``, kept per worker by
``balancer.sim.worker.SimWorker``), hears release and join notices and operators' news, reaches the
one ``MemoryStore`` through its own ``LatentStore``, processes what it owns and hands over what it
is told to. ``Run`` plays the scenario (the disturbance), judges balance and measures; a subclass
builds the coordinators (``balancer.sim.table`` for the lease-table strategies, ``balancer.sim.race``
for 001's race) and deals out the balanced start. ``balancer.sim.run`` explains what is measured and how.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import random
from collections.abc import Callable
from functools import partial

from balancer.errors import OwnershipLost, StoreUnavailable
from balancer.model import Checkpoint, Control, ControlKind, partition_ids
from balancer.notices import OPERATOR, Released
from balancer.protocol import Balancer, CycleReport, Driver
from balancer.sim.events import Events
from balancer.sim.measures import (
    Processing,
    even_by_load,
    load_spread,
    loads_of,
    longest_unprocessed,
    min_moves,
    overlap_seconds,
)
from balancer.sim.scenarios import COLD, EPOCH, REF, Outcome, Settings, steady_for
from balancer.sim.store import LatentStore, Ledger
from balancer.sim.worker import SimWorker, deliver
from balancer.stores.memory import MemoryStore
from balancer.strategies import Strategy

_ids = functools.lru_cache(maxsize=8)(partition_ids)
# How the simulator drives each coordinator, as the runtime does: renewal steps between cycles; the
# coordinator's own handoff hook (``Run._on_handoff``) hands planned moves off.
DRIVER = Driver(renewal_steps=True)


class Run(abc.ABC):
    """One seeded run of one scenario. ``main()`` must run on a ``sim_loop`` loop."""

    store: MemoryStore  # the one store every worker reaches through its own LatentStore (built by main)
    ledger: Ledger

    def __init__(
        self, strategy: Strategy, scenario: str, partitions: int, workers: int, seed: int, settings: Settings
    ) -> None:
        self.strategy, self.scenario, self.s = strategy, scenario, settings
        self.env = random.Random(f"{scenario}/{partitions}/{workers}/{seed}")  # timing, victims
        self.seed = seed
        self.names = [f"w{i}" for i in range(workers)]
        self.partitions = partitions
        self.hub_size = max(1, 2 * partitions // 3) if scenario == "add-partitions" else partitions
        self.plan_ms: list[float] = []  # wall time of each plan (strategies that plan), measured only
        self.alive: set[str] = set()
        self.drained: set[str] = set()
        self.pins: dict[str, str] = {}
        self.skew: dict[str, float] = {}
        self.blocked: dict[tuple[str, str], float] = {}  # (worker, pid) -> loop time its handler returns
        self.processing = Processing()
        self.cycles: dict[str, int] = dict.fromkeys(self.names, 0)
        self.requests: list[int] = []
        self.disturbed_at = float("inf")  # set when the scenario's disturbance happens
        self.quiet_at = float("inf")  # when the disturbance is over (skew reverted, handler unblocked)
        self.balanced_since: float | None = None
        self.balance_cycles = 0
        self.done = asyncio.Event()
        self.tasks: dict[str, list[asyncio.Task[None]]] = {w: [] for w in self.names}
        self.locks = {w: asyncio.Lock() for w in self.names}
        lag = random.Random(f"lag/{scenario}/{partitions}/{workers}/{seed}")  # checkpoints behind events
        self.events = Events(settings, scenario == "hot-partition", lag)
        self.counted: dict[str, int] = dict.fromkeys(self.names, 0)  # requests already attributed
        self.proxies: dict[str, LatentStore] = {}
        self.coordinators: dict[str, Balancer] = {}
        self.workers: dict[str, SimWorker] = {}  # each worker's side of the schedule

    # set-up --------------------------------------------------------------------------------

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _build(self) -> None:
        self.store = MemoryStore(clock=lambda: EPOCH + self._now())
        self.ledger = Ledger(self.s.expiry, lambda w: w in self.alive)
        for w in self.names:
            proxy = LatentStore(self.store, self.ledger, random.Random(self.env.random()), self.s.latency)
            self.proxies[w] = proxy
            self.coordinators[w] = self._coordinator(w, proxy)
            self.workers[w] = SimWorker(
                w,
                self.coordinators[w],
                interval=self.s.interval,
                jitter=self.s.jitter,
                poll_waiting=self.s.notice_latency is None,  # no notices: a waiting receiver polls
                rng=random.Random(self.env.random()),
                now=self._now,
            )

    @abc.abstractmethod
    def _coordinator(self, w: str, store: LatentStore) -> Balancer:
        """Worker ``w``'s coordinator, on ``store`` (called in worker order, once each)."""

    @abc.abstractmethod
    async def _adopt(self, workers: list[str]) -> None:
        """Start from a balanced state: deal the partitions out to ``workers``, have each take its
        deal and cycle once, then ``_launch`` them."""

    def _spent(self, w: str) -> int:
        """Round trips worker ``w`` made so far (its store's, and any other its coordinator uses)."""
        return self.proxies[w].requests

    def _clock_of(self, worker: str) -> Callable[[], float]:
        return lambda: EPOCH + self._now() + self.skew.get(worker, 0.0)

    async def _partition_ids(self) -> tuple[str, ...]:
        return _ids(self.hub_size)

    def _launch(self, worker: str, first_at: float) -> None:
        self.alive.add(worker)
        self.tasks[worker].append(asyncio.get_running_loop().create_task(self._worker(worker, first_at)))

    # workers -------------------------------------------------------------------------------

    async def _sleep_until(self, at: float) -> None:
        await asyncio.sleep(max(0.0, at - self._now()))

    async def _worker(self, w: str, first_at: float) -> None:
        """Worker ``w``'s loop from ``first_at``, as the runtime's processor runs it (``SimWorker.run``)."""
        await self._sleep_until(first_at)
        await self.workers[w].run(partial(self._cycle, w), partial(self._renew, w), partial(self._until, w))

    async def _until(self, w: str, at: float) -> bool:
        """Until ``at`` or a notice (True); processing stops meanwhile where a lease runs out on the
        local clock (the runtime's pump stops then, and goes on once the lease is renewed)."""
        claimed_at = self.proxies[w].first_claim_at
        if claimed_at is not None and claimed_at + self.s.expiry < at:
            await self._sleep_until(claimed_at + self.s.expiry)  # the local lease deadline passes first
            self._lapsed(w)
        lapse = min((self.coordinators[w].deadline(p) for p in self.processing.of(w)), default=at)
        if lapse < at:
            await self._sleep_until(lapse)
            self._lapsed(w)
        return await self.workers[w].wait(at)

    def _lapsed(self, w: str) -> None:
        for pid in self.processing.of(w):
            if not self.coordinators[w].holds(pid):
                self._stop(w, pid)

    async def _renew(self, w: str) -> None:
        """A renewal step (``Balancer.renew``): the leases due now, with no listing; processing of
        any lost stops, as the runtime's ``renew()`` stops their pumps."""
        async with self.locks[w]:
            with contextlib.suppress(StoreUnavailable):  # tried again after the coordinator's backoff
                report = await self.coordinators[w].renew(DRIVER)
                for pid in self.processing.of(w):
                    if pid not in report.owned or any(e.partition_id == pid for e in report.lost):
                        self._stop(w, pid)
        self._judge()

    def _tell(self, notice: Released) -> None:
        """Every coordinator's ``on_released``, and the operators' news (``balancer.sim.worker.deliver``)."""
        deliver(notice, [self.workers[w] for w in sorted(self.alive)], self.s.notice_latency)

    async def _cycle(self, w: str) -> CycleReport:
        async with self.locks[w]:
            self.proxies[w].first_claim_at = None
            self.workers[w].heard = False  # what is heard from now on may have come after this read
            report = await self.coordinators[w].cycle(DRIVER)
            if self.scenario == "hot-partition":  # events flow: checkpoint what it holds, once a cycle
                for pid in sorted(report.owned, key=int):
                    checkpoint = Checkpoint(REF, pid, self.events.sequence(pid, self._now()))
                    with contextlib.suppress(OwnershipLost, StoreUnavailable):
                        await self.store.update_checkpoint(checkpoint, w)
        spent = self._spent(w)
        if self._now() >= self.disturbed_at:  # this cycle's requests, and any handoff's (or race's) since
            self.cycles[w] += 1
            self.requests.append(spent - self.counted[w])
        self.counted[w] = spent
        self._after_cycle(w, report)
        return report

    def _after_cycle(self, w: str, report: CycleReport) -> None:
        for pid in self.processing.of(w):
            if pid not in report.owned:
                self._stop(w, pid)
        for pid in sorted(report.owned, key=int):
            self.processing.start(w, pid, self._now())
        self._judge()
        if self.scenario == "newcomer-crash" and w == self.names[-1]:
            self._crash(w)  # it announced itself (its first cycle) and is gone

    def _stop(self, w: str, pid: str) -> None:
        """Stop processing ``pid`` now, or when its blocked handler returns."""
        until = self.blocked.get((w, pid), 0.0)
        if until <= self._now():
            self.processing.stop(w, pid, self._now())
            return

        async def later() -> None:
            await self._sleep_until(until)
            if pid not in self.coordinators[w].owned:
                self.processing.stop(w, pid, self._now())

        self.tasks[w].append(asyncio.get_running_loop().create_task(later()))

    def _on_handoff(self, w: str) -> Callable[[str], None]:
        def start(pid: str) -> None:
            self.tasks[w].append(asyncio.get_running_loop().create_task(self._hand_off(w, pid)))

        return start

    async def _hand_off(self, w: str, pid: str) -> None:
        """The runtime's part of a planned move: finish the event in hand, checkpoint, release."""
        await self._sleep_until(max(self._now() + self.s.handoff_seconds, self.blocked.get((w, pid), 0.0)))
        coordinator = self.coordinators[w]
        # The runtime must not release while a cycle of the same worker is in flight: a renewal
        # sent by that cycle could land first, move the ETag and make the release fail.
        async with self.locks[w]:
            if not coordinator.handing_off(pid):
                return
            self.processing.stop(w, pid, self._now())
            self.events.sequence(pid, self._now())
            # OwnershipLost: taken after the handoff timeout; the new owner resumes from the last checkpoint
            with contextlib.suppress(OwnershipLost, StoreUnavailable):
                await self.proxies[w].update_checkpoint(Checkpoint(REF, pid, self.events.checkpoints[pid]), w)
            with contextlib.suppress(StoreUnavailable):  # the coordinator starts the handoff again
                await coordinator.release(pid)
        self._judge()

    def _rates(self) -> dict[str, float]:
        return {p: self.events.rate(p, self._now()) for p in _ids(self.hub_size)}

    def _held(self) -> dict[str, list[str]]:
        """The partitions each live, undrained worker holds now (by the store's records)."""
        now = EPOCH + self._now()
        held: dict[str, list[str]] = {w: [] for w in self._eligible()}
        for p in _ids(self.hub_size):
            holder = self.ledger.holder(p, now)
            if holder in held:
                held[holder].append(p)
        return held

    def loads(self) -> dict[str, float]:
        """Events per second each live, undrained worker holds now (by the store's records)."""
        return loads_of(self._held(), self._rates())

    def _crash(self, w: str) -> None:
        for task in self.tasks[w]:
            task.cancel()
        self.alive.discard(w)
        for pid in self.processing.of(w):
            self.processing.stop(w, pid, self._now())

    # balance -------------------------------------------------------------------------------

    def _eligible(self) -> list[str]:
        return [w for w in self.names if w in self.alive and w not in self.drained]

    def _balanced(self) -> bool:
        """Every partition owned by a live, undrained worker; counts within one; pins respected."""
        eligible = self._eligible()
        counts = [self.ledger.held[w] for w in eligible]
        if not counts or sum(counts) != self.hub_size:
            return False
        if self.strategy.uses_load:
            if not even_by_load(self._held(), self._rates()):
                return False
        elif max(counts) - min(counts) > 1:
            return False
        oldest = EPOCH + self._now() - self.s.expiry
        ok, owner, modified = set(eligible), self.ledger.owner, self.ledger.modified
        if not all(owner.get(p) in ok and modified[p] >= oldest for p in _ids(self.hub_size)):
            return False
        return all(owner.get(p) == w for p, w in self.pins.items())

    def _judge(self) -> None:
        now = self._now()
        if now < self.disturbed_at:
            return
        if not self._balanced():
            self.balanced_since = None
            return
        if self.balanced_since is None:
            self.balanced_since = now
            self.balance_cycles = max((self.cycles[w] for w in self._eligible()), default=0)
        observe = self.s.single_partition_cycles if self.scenario == "single-partition" else self.s.observe_cycles
        if now >= self.quiet_at and now - self.balanced_since >= observe * self.s.interval:
            self.done.set()

    # the scenario --------------------------------------------------------------------------

    async def _disturb(self) -> None:
        s, names, env = self.s, self.names, self.env
        kind = self.scenario
        if kind in COLD:
            self.disturbed_at = self.quiet_at = self._now()
            self.ledger.counting = True
            for w in names:
                self._launch(w, self._now() + env.uniform(0, s.start_spread))
            return
        joins = kind in ("scale-out", "stop-and-join", "newcomer-crash")
        settled = names[:-1] if joins else names
        await self._adopt(settled)
        await self._sleep_until(self._now() + steady_for(s, kind, self.partitions, len(names), self.seed))
        victim = env.choice(settled) if settled else names[0]
        if joins:
            self._launch(names[-1], self._now() + env.uniform(0, s.start_spread))
        if kind == "stop-and-join" and s.join_lead:  # the newcomer's first cycle, then the stop
            await self._sleep_until(self._now() + s.join_lead)
        self.disturbed_at = self.quiet_at = self._now()
        self.ledger.counting = True
        if kind in ("stop", "stop-and-join"):  # a graceful stop: the runtime's shutdown releases everything
            async with self.locks[victim]:
                await self.coordinators[victim].release_all()
            self._crash(victim)
        elif kind == "store-outage":
            self.store.down = True
            self.quiet_at = self._now() + s.outage_expiries * s.expiry
            asyncio.get_running_loop().call_at(self.quiet_at, setattr, self.store, "down", False)
        elif kind == "crash":
            self._crash(victim)
        elif kind == "add-partitions":
            self.hub_size = self.partitions
        elif kind == "clock-skew":
            self.skew[victim] = s.skew_seconds
            self.quiet_at = self._now() + s.skew_cycles * s.interval
            asyncio.get_running_loop().call_at(self.quiet_at, self.skew.pop, victim, 0.0)
        elif kind == "slow-worker":
            mine = sorted(self.coordinators[victim].owned, key=int)
            if mine:
                self.quiet_at = self._now() + s.block_cycles * s.interval
                self.blocked[(victim, env.choice(mine))] = self.quiet_at
        elif kind == "drain":
            self.drained.add(victim)
            await self.store.put_control(Control(REF, ControlKind.DRAIN, victim))
            self._tell(Released(REF, (), OPERATOR))  # news, as the dashboard's action sends it
        elif kind == "hot-partition":
            self.events.hot, self.events.since = env.choice(_ids(self.hub_size)), self._now()
        elif kind == "pin":
            others = [p for p in _ids(self.hub_size) if p not in self.coordinators[victim].owned]
            pid = env.choice(others) if others else "0"
            self.pins[pid] = victim
            await self.store.put_control(Control(REF, ControlKind.PIN, pid, victim))
            self._tell(Released(REF, (), OPERATOR))

    def _min_moves(self) -> int:
        now = EPOCH + self._now()
        holders: dict[str, str | None] = {}
        for p in _ids(self.hub_size):
            holder = self.ledger.holder(p, now)
            holders[p] = holder if holder in self.alive else None
        eligible = self._eligible()
        if self.scenario == "newcomer-crash":  # the newcomer is doomed: the end state is without it
            eligible = [w for w in eligible if w != self.names[-1]]
        return min_moves(holders, eligible, self.pins)

    async def main(self) -> Outcome:
        self._build()
        await self._disturb()
        least = self._min_moves()
        self._judge()
        s = self.s
        share = -(-self.partitions // len(self.names))  # one-claim-per-cycle strategies need that many
        horizon = self.quiet_at - self.disturbed_at + (s.horizon_cycles + share) * s.interval
        if self.scenario == "single-partition":
            horizon += s.single_partition_cycles * s.interval
        with contextlib.suppress(TimeoutError):  # the horizon: balanced or not, the run ends
            await asyncio.wait_for(self.done.wait(), timeout=horizon)
        end = self._now()
        spread_at_end = load_spread(self.loads().values())
        for tasks in self.tasks.values():
            for task in tasks:
                task.cancel()
        await asyncio.gather(*(t for ts in self.tasks.values() for t in ts), return_exceptions=True)
        self.processing.close_all(end)
        balanced = self.balanced_since is not None
        start = self.disturbed_at
        return Outcome(
            balanced=balanced,
            cycles=self.balance_cycles if balanced else 0,
            seconds=round((self.balanced_since or start) - start, 3),
            moves=self.ledger.moves,
            min_moves=least,
            overlap=round(overlap_seconds(self.processing, start, end), 3),
            unowned=round(longest_unprocessed(self.processing, _ids(self.hub_size), start, end), 3),
            requests=self.requests,
            plan_ms=self.plan_ms,
            load_spread=round(spread_at_end, 3),
        )
