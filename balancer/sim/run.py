"""The simulator behind ``manage.py simulate``: real coordinators, real strategies, simulated time.

Each run puts N real coordinators (``Coordinator`` objects with the chosen strategy, or 001's
``RaceCoordinator``: see ``RUNS``) on one ``MemoryStore`` and drives them on an asyncio loop whose
clock is simulated (``sim_loop``):

- every worker is driven by the runtime's schedule (``balancer.schedule.next_due``, through
  ``balancer.sim.worker.SimWorker``): it cycles every ``interval`` with the runtime's timer jitter
  (±10 %), soon after its announcing first cycle, waits quietly after steady cycles (until the
  coordinator's ``quiet_until``), and runs renewal steps (``renew()`` at ``next_renewal()``) between
  cycles; the order of cycles is random; workers that "start together" start within ``start_spread``;
- notices as the stores' channels send them (``notice_latency`` after the event; none with
  ``--no-notices``, the Blob store without a channel layer): a release wakes the other workers, a join
  (``announce_joining``) and an operator's control (drain, pin) are news, which ends a quiet wait;
  without notices a worker waiting for a handoff polls every quarter interval, as the runtime does;
- the store is read through its change feed (``snapshot_since``), as on SQL and Redis;
- every store request takes a random latency (``sim_store``), so cycles interleave and claims race;
- the store has its own clock (true simulated time); each worker's clock is the store's plus its
  skew (the clock-skew scenario moves one worker's clock 3 minutes ahead);
- processing: a worker processes a partition from the moment it wins it until it notices the loss
  (at its next cycle) or the coordinator's ``holds`` turns false. A planned handoff (the coordinator's
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
  (0 if it never broke), ``cycles_to_balance`` counts balancing intervals (those seconds over the
  interval, rounded up), and ``reads_to_balance`` is the most cycles any worker ran until then
  (wake-ups on notices and "soon" included). A
  run ends once balance has held for ``observe_cycles`` (1000 cycles for single-partition) after
  the disturbance is over, or at the horizon;
- moves: won writes that give a partition to a worker other than its last holder while that
  holder is alive (a steal, or a release and a claim); ``min_moves`` from ``sim_metrics.min_moves``
  on the state right after the disturbance (the largest over the seeds);
- overlap: seconds, summed over partitions, during which two workers processed one partition;
  ``max_unowned_seconds``: the longest stretch any partition went unprocessed (largest over seeds);
- requests per worker cycle: store round trips of one cycle plus those of handoffs and renewal
  steps since the worker's previous cycle (checkpoint writes excluded).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from balancer.sim import loop as sim_loop
from balancer.sim.base import Run
from balancer.sim.measures import spread
from balancer.sim.race import RaceRun
from balancer.sim.scenarios import SCENARIOS, Outcome, Settings, effective_size
from balancer.sim.table import TableRun
from balancer.strategies import RACE, Strategy, get_strategy, load_weighted

__all__ = ["RUNS", "SCENARIOS", "Settings", "check", "run_of", "simulate"]

# The runs of strategies that are no plan function for a ``Coordinator``: each has a run of its own.
RUNS: dict[str, type[Run]] = {RACE.name: RaceRun}


def run_of(strategy: Strategy) -> type[Run]:
    """The kind of run that simulates ``strategy``: its own, else lease-table coordinators planning with it."""
    return RUNS.get(strategy.name, TableRun)


def check(strategy: str | None, scenario: str, partitions: int, workers: int, seeds: int) -> Strategy:
    """The strategy to run; ValueError with one clear line for any bad argument."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose one of: {', '.join(SCENARIOS)}")
    for name, value in (("partitions", partitions), ("workers", workers), ("seeds", seeds)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    return get_strategy(strategy)


def outcomes(
    chosen: Strategy,
    scenario: str,
    partitions: int,
    workers: int,
    seeds: int,
    settings: Settings,
    on_seed: Callable[[int], None] | None = None,
) -> list[Outcome]:
    """Each seed's run of one scenario, seeds 0 to ``seeds - 1``, on the effective size (what
    ``simulate`` sums up; ``bench_sim_vs_real`` compares their spread with real runs')."""
    runner = run_of(chosen)
    runs = []
    for seed in range(seeds):
        runs.append(sim_loop.run(runner(chosen, scenario, partitions, workers, seed, settings).main()))
        if on_seed is not None:
            on_seed(seed)
    return runs


def simulate(
    strategy: str | None,
    scenario: str,
    partitions: int = 32,
    workers: int = 4,
    seeds: int = 20,
    settings: Settings | None = None,
    on_seed: Callable[[int], None] | None = None,
    weighted: bool = False,
) -> dict[str, object]:
    """Run ``seeds`` seeded runs of one scenario; return DESIGN.md's JSON object as a dict.

    ``on_seed(seed)``, if given, is called after each seed's run (a command's progress line); it
    sees nothing of the run and changes nothing in the result. ``weighted``: the strategy's
    load-weighted variant (``--load-weighted``; the default strategy only).
    Raises ValueError for an unknown strategy or scenario, or fewer than one partition, worker or seed.
    """
    chosen = check(strategy, scenario, partitions, workers, seeds)
    if weighted:
        chosen = load_weighted(chosen)
    settings = settings or Settings()
    p, n = effective_size(scenario, partitions, workers)
    runs = outcomes(chosen, scenario, p, n, seeds, settings, on_seed)
    done = [r for r in runs if r.balanced]
    return {
        "strategy": chosen.name,
        "scenario": scenario,
        "partitions": p,
        "workers": n,
        "seeds": seeds,
        "balanced_runs": len(done),
        "cycles_to_balance": spread([math.ceil(r.seconds / settings.interval) for r in done]),
        "seconds_to_balance": spread([r.seconds for r in done]),
        "reads_to_balance": spread([r.cycles for r in done]),
        "moves": spread([r.moves for r in runs]),
        "min_moves": max(r.min_moves for r in runs),
        "overlap_seconds": spread([r.overlap for r in runs]),
        "max_unowned_seconds": round(max(r.unowned for r in runs), 3),
        "store_requests_per_worker_cycle": spread([x for r in runs for x in r.requests]),
        "plan_ms": spread([x for r in runs for x in r.plan_ms]),
        "load_weighted": chosen.uses_load,
        "load_spread": spread([r.load_spread for r in runs]),
        "interval": settings.interval,
        "expiry": settings.expiry,
    }
