"""The simulator behind ``manage.py simulate``: real coordinators, real strategies, simulated time.

Each run puts N real ``Coordinator`` objects, each with the chosen strategy, on one
``MemoryStore`` and drives them on an asyncio loop whose clock is simulated (``sim_loop``):

- every worker cycles every ``interval`` seconds with the runtime's timer jitter (±10 %), so the
  order of cycles is random; workers that "start together" start within ``start_spread``;
- every store request takes a random latency (``sim_store``), so cycles interleave and claims race;
- the store has its own clock (true simulated time); each worker's clock is the store's plus its
  skew (the clock-skew scenario moves one worker's clock 3 minutes ahead);
- processing: a worker processes a partition from the moment it wins it until it notices the loss
  (at its next cycle) or ``Coordinator.holds`` turns false. A planned handoff (the coordinator's
  ``on_handoff``) finishes the event in hand (``handoff_seconds``, or until a blocked handler
  returns), checkpoints, then releases. A blocked handler keeps processing its partition even if
  the partition is lost meanwhile, while its coordinator keeps cycling.

Everything is seeded from the arguments (strings seed ``random.Random`` the same way in every
process), nothing reads the wall clock or the global ``random``: the same arguments give the same
JSON, except ``plan_ms``, which is the wall time the strategy's plan function took
(``time.perf_counter``), measured and never fed back into the simulation.

The scenarios and the JSON keys are those of DESIGN.md's ``simulate``; see ``SCENARIOS``. Measured
from the disturbance on (a cold start's disturbance is the start):

- balance: every partition's record names a live, undrained worker and has not expired by the
  store's clock, owned counts differ by at most one, every pin is respected. A run is balanced if
  balance holds at its end; ``seconds_to_balance`` runs until balance began for the last time
  (0 if it never broke), ``cycles_to_balance`` is the most cycles any worker ran until then. A
  run ends once balance has held for ``observe_cycles`` (1000 cycles for single-partition) after
  the disturbance is over, or at the horizon;
- moves: won writes that give a partition to a worker other than its last holder while that
  holder is alive (a steal, or a release and a claim); ``min_moves`` from ``sim_metrics.min_moves``
  on the state right after the disturbance (the largest over the seeds);
- overlap: seconds, summed over partitions, during which two workers processed one partition;
  ``max_unowned_seconds``: the longest stretch any partition went unprocessed (largest over seeds);
- requests per worker cycle: store round trips of one cycle plus those of handoffs since the
  worker's previous cycle (checkpoint writes excluded).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from balancer.coordinator import Coordinator, CycleReport
from balancer.errors import OwnershipLost
from balancer.model import Checkpoint, Control, ControlKind, EventKind, HubRef, partition_ids
from balancer.sim import loop as sim_loop
from balancer.sim.measures import Processing, longest_unprocessed, min_moves, overlap_seconds, spread
from balancer.sim.store import LatentStore, Ledger
from balancer.stores.memory import MemoryStore
from balancer.strategies import RACE, Claim, Plan, Strategy, View, get_strategy

REF = HubRef("sim.example", "sensors", "$Default")
EPOCH = 1_700_000_000.0  # the store clock at simulated time 0

SCENARIOS: dict[str, str] = {
    "cold-start": "N workers start together on P unowned partitions",
    "scale-out": "N-1 workers balanced, then one joins",
    "crash": "N balanced, one stops without releasing",
    "add-partitions": "N balanced on floor(2P/3) partitions, then the hub grows to P",
    "more-workers-than-partitions": "cold start of N workers on fewer partitions (P forced to N-1 when P >= N)",
    "single-partition": "P forced to 1; moves counted over 1000 cycles after balance",
    "clock-skew": "N balanced, one worker's clock 3 minutes ahead for 100 cycles",
    "slow-worker": "N balanced, one worker's handler blocks for 10 cycles",
    "drain": "N balanced, one drained",
    "pin": "N balanced, one partition pinned to a worker that does not own it",
}
COLD = {"cold-start", "more-workers-than-partitions", "single-partition"}
_ids = functools.lru_cache(maxsize=8)(partition_ids)


@dataclass(frozen=True, slots=True)
class Settings:
    """The simulated environment.

    A cycle every 10 s and a 30 s lease by default: Microsoft's processor uses 30 s and 180 s, which
    only stretches every figure that is counted in seconds; cycles and moves depend on the ratio of
    expiry to interval (3 here, 6 there) rather than on the values.
    """

    interval: float = 10.0
    expiry: float = 30.0
    jitter: float = 0.1  # each wait is interval * (1 ± jitter), as the runtime does
    latency: tuple[float, float] = (0.002, 0.020)  # seconds per store round trip, uniform
    start_spread: float = 0.05  # workers that start together start within this many seconds
    handoff_seconds: float = 0.2  # finish the event in hand and checkpoint, before a release
    observe_cycles: int = 10  # a run ends once balance has held this long (and the disturbance is over)
    horizon_cycles: int = 100  # or this long (plus P/N cycles) after the disturbance ended, balanced or not
    skew_seconds: float = 180.0
    skew_cycles: int = 100
    block_cycles: int = 10
    single_partition_cycles: int = 1000

    def __post_init__(self) -> None:
        if self.interval <= 0 or self.expiry <= 0:
            raise ValueError(f"interval and expiry must be > 0, got {self.interval}, {self.expiry}")


def effective_size(scenario: str, partitions: int, workers: int) -> tuple[int, int]:
    """The partitions and workers a scenario really runs with (some force one of them)."""
    if scenario == "single-partition":
        return 1, workers
    if scenario == "more-workers-than-partitions":
        workers = max(workers, 2)
        return (partitions if partitions < workers else max(1, workers - 1)), workers
    return partitions, workers


def check(strategy: str | None, scenario: str, partitions: int, workers: int, seeds: int) -> Strategy:
    """The strategy to run; ValueError with one clear line for any bad argument."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose one of: {', '.join(SCENARIOS)}")
    for name, value in (("partitions", partitions), ("workers", workers), ("seeds", seeds)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    return get_strategy(strategy)


def simulate(
    strategy: str | None,
    scenario: str,
    partitions: int = 32,
    workers: int = 4,
    seeds: int = 20,
    settings: Settings | None = None,
) -> dict[str, object]:
    """Run ``seeds`` seeded runs of one scenario; return DESIGN.md's JSON object as a dict.

    Raises ValueError for an unknown strategy or scenario, or fewer than one partition, worker or seed.
    """
    chosen = check(strategy, scenario, partitions, workers, seeds)
    settings = settings or Settings()
    p, n = effective_size(scenario, partitions, workers)
    runner = _Run
    if chosen.name == RACE.name:  # 001's race is no plan function: it has a run of its own
        from balancer.sim.race import RaceRun

        runner = RaceRun
    runs = [sim_loop.run(runner(chosen, scenario, p, n, seed, settings).main()) for seed in range(seeds)]
    done = [r for r in runs if r.balanced]
    return {
        "strategy": chosen.name,
        "scenario": scenario,
        "partitions": p,
        "workers": n,
        "seeds": seeds,
        "balanced_runs": len(done),
        "cycles_to_balance": spread([r.cycles for r in done]),
        "seconds_to_balance": spread([r.seconds for r in done]),
        "moves": spread([r.moves for r in runs]),
        "min_moves": max(r.min_moves for r in runs),
        "overlap_seconds": spread([r.overlap for r in runs]),
        "max_unowned_seconds": round(max(r.unowned for r in runs), 3),
        "store_requests_per_worker_cycle": spread([x for r in runs for x in r.requests]),
        "plan_ms": spread([x for r in runs for x in r.plan_ms]),
        "interval": settings.interval,
        "expiry": settings.expiry,
    }


@dataclass
class Outcome:
    balanced: bool
    cycles: int
    seconds: float
    moves: int
    min_moves: int
    overlap: float
    unowned: float
    requests: list[int]
    plan_ms: list[float]


def _scripted(plan: Plan) -> Callable[[View, random.Random], Plan]:
    """A plan function that always returns ``plan``."""
    return lambda view, rng: plan


class _Run:
    """One seeded run of one scenario. ``main()`` must run on a ``sim_loop`` loop."""

    def __init__(
        self, strategy: Strategy, scenario: str, partitions: int, workers: int, seed: int, settings: Settings
    ) -> None:
        self.strategy, self.scenario, self.s = strategy, scenario, settings
        self.env = random.Random(f"{scenario}/{partitions}/{workers}/{seed}")  # timing, victims
        self.seed = seed
        self.names = [f"w{i}" for i in range(workers)]
        self.partitions = partitions
        self.hub_size = max(1, 2 * partitions // 3) if scenario == "add-partitions" else partitions
        self.plan_ms: list[float] = []
        self.timed = replace(strategy, plan=self._timed(strategy.plan))
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
        self.checkpoints: dict[str, int] = {}
        self.counted: dict[str, int] = dict.fromkeys(self.names, 0)  # requests already attributed

    # set-up --------------------------------------------------------------------------------

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _timed(self, plan: Callable[[View, random.Random], Plan]) -> Callable[[View, random.Random], Plan]:
        def timed(view: View, rng: random.Random) -> Plan:
            started = time.perf_counter()  # measurement only: never read by the simulation
            result = plan(view, rng)
            if self._now() >= self.disturbed_at:
                self.plan_ms.append((time.perf_counter() - started) * 1000)
            return result

        return timed

    def _build(self) -> None:
        self.store = MemoryStore(clock=lambda: EPOCH + self._now())
        self.ledger = Ledger(self.s.expiry, lambda w: w in self.alive)
        self.proxies: dict[str, LatentStore] = {}
        self.coordinators: dict[str, Coordinator] = {}
        for w in self.names:
            proxy = LatentStore(self.store, self.ledger, random.Random(self.env.random()), self.s.latency)
            self.proxies[w] = proxy
            self.coordinators[w] = Coordinator(
                ref=REF,
                owner_id=w,
                store=proxy,
                partitions=self._partition_ids,
                strategy=self.timed,
                expiry=self.s.expiry,
                controls=proxy,
                rng=random.Random(f"{self.seed}/{w}"),
                clock=self._clock_of(w),
                monotonic=self._now,
                on_handoff=self._on_handoff(w),
            )

    def _clock_of(self, worker: str) -> Callable[[], float]:
        return lambda: EPOCH + self._now() + self.skew.get(worker, 0.0)

    async def _partition_ids(self) -> tuple[str, ...]:
        return _ids(self.hub_size)

    async def _adopt(self, workers: list[str]) -> None:
        """Start from a balanced state: deal the partitions out and let each worker claim its deal."""
        pids = list(_ids(self.hub_size))
        self.env.shuffle(pids)
        for i, w in enumerate(workers):
            deal = Plan(claims=tuple(Claim(p, EventKind.CLAIM, None, "initial state") for p in pids[i :: len(workers)]))
            self.coordinators[w].strategy = replace(self.strategy, plan=_scripted(deal))
            self.alive.add(w)
            await self._cycle(w)
            self.coordinators[w].strategy = self.timed
        for w in workers:
            self._launch(w, self._now() + self.env.uniform(0, self.s.interval))

    def _launch(self, worker: str, first_at: float) -> None:
        self.alive.add(worker)
        self.tasks[worker].append(asyncio.get_running_loop().create_task(self._worker(worker, first_at)))

    # workers -------------------------------------------------------------------------------

    async def _sleep_until(self, at: float) -> None:
        await asyncio.sleep(max(0.0, at - self._now()))

    async def _worker(self, w: str, first_at: float) -> None:
        rng = random.Random(self.env.random())
        await self._sleep_until(first_at)
        while True:
            await self._cycle(w)
            next_at = self._now() + self.s.interval * (1 + self.s.jitter * (2 * rng.random() - 1))
            claimed_at = self.proxies[w].first_claim_at
            if claimed_at is not None and claimed_at + self.s.expiry < next_at:
                await self._sleep_until(claimed_at + self.s.expiry)  # the local lease deadline passes first
                for pid in self.processing.of(w):
                    if not self.coordinators[w].holds(pid):
                        self._stop(w, pid)
            await self._sleep_until(next_at)

    async def _cycle(self, w: str) -> None:
        proxy = self.proxies[w]
        async with self.locks[w]:
            proxy.first_claim_at = None
            report = await self.coordinators[w].cycle()
        if self._now() >= self.disturbed_at:  # this cycle's requests, and any handoff's since the last
            self.cycles[w] += 1
            self.requests.append(proxy.requests - self.counted[w])
        self.counted[w] = proxy.requests
        self._after_cycle(w, report)

    def _after_cycle(self, w: str, report: CycleReport) -> None:
        for pid in self.processing.of(w):
            if pid not in report.owned:
                self._stop(w, pid)
        for pid in sorted(report.owned, key=int):
            self.processing.start(w, pid, self._now())
        self._judge()

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
            self.checkpoints[pid] = self.checkpoints.get(pid, 0) + 1
            # OwnershipLost: taken after the handoff timeout; the new owner resumes from the last checkpoint
            with contextlib.suppress(OwnershipLost):
                await self.proxies[w].update_checkpoint(Checkpoint(REF, pid, self.checkpoints[pid]), w)
            await coordinator.release(pid)
        self._judge()

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
        if not counts or sum(counts) != self.hub_size or max(counts) - min(counts) > 1:
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
        settled = names[:-1] if kind == "scale-out" else names
        await self._adopt(settled)
        await self._sleep_until(self._now() + 2 * s.interval)  # a little steady state first
        self.disturbed_at = self.quiet_at = self._now()
        self.ledger.counting = True
        victim = env.choice(settled) if settled else names[0]
        if kind == "scale-out":
            self._launch(names[-1], self._now() + env.uniform(0, s.start_spread))
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
        elif kind == "pin":
            others = [p for p in _ids(self.hub_size) if p not in self.coordinators[victim].owned]
            pid = env.choice(others) if others else "0"
            self.pins[pid] = victim
            await self.store.put_control(Control(REF, ControlKind.PIN, pid, victim))

    def _min_moves(self) -> int:
        now = EPOCH + self._now()
        holders: dict[str, str | None] = {}
        for p in _ids(self.hub_size):
            holder = self.ledger.holder(p, now)
            holders[p] = holder if holder in self.alive else None
        return min_moves(holders, self._eligible(), self.pins)

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
        )
