"""What the simulator runs: the scenarios of DESIGN.md's ``simulate``, the simulated environment's
settings, and what one seeded run of a scenario measured."""

from __future__ import annotations

import random
from dataclasses import dataclass

from balancer.lease import RENEW_SHARE
from balancer.model import HubRef

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
    "stop": "N balanced, one stops gracefully (releasing what it holds)",
    "stop-and-join": "N-1 balanced; at one instant one stops (releasing what it holds) and another joins",
    "newcomer-crash": "N-1 balanced; one joins and crashes right after announcing itself",
    "store-outage": "N balanced; no worker can reach the store for 3 times the expiry",
    "hot-partition": "N balanced; then one partition's events come at 10x the others' rate",
}
COLD = {"cold-start", "more-workers-than-partitions", "single-partition"}


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
    # The disturbance comes this long after the balanced start (all leases written at once): two
    # intervals of steady state, plus a random share (up to ``steady_spread`` expiries) of one expiry.
    # With none (the default) every disturbance finds the workers waiting quietly and every lease the
    # same age (a crash always comes 2 intervals after the last renewal); with 1.0 it may come at any
    # age of a lease within its renewal cycle and any point of a worker's waits, as an event in a
    # real fleet does (``bench_sim_vs_real`` runs so).
    steady_intervals: float = 2.0
    steady_spread: float = 0.0  # in expiries
    # The balanced start's claims: each worker claims its deal at a moment of its own, drawn within
    # this share of the renewal period (the coordinator's renew share of the expiry), so each renews on
    # a phase of its own afterwards, as in a real fleet, whose leases were won at different times. With
    # none (the default) every lease is written at once and every worker renews in step with the others.
    start_phases: float = 0.0
    # stop-and-join: the newcomer starts this many seconds before the other stops, and the run is timed
    # (and its moves counted) from the stop, as ``bench_sim_vs_real`` times a real one: its newcomer
    # reaches its first cycle, then the other gets SIGTERM and releases. None (0) starts both at once.
    join_lead: float = 0.0
    observe_cycles: int = 10  # a run ends once balance has held this long (and the disturbance is over)
    horizon_cycles: int = 100  # or this long (plus P/N cycles) after the disturbance ended, balanced or not
    skew_seconds: float = 180.0
    skew_cycles: int = 100
    block_cycles: int = 10
    single_partition_cycles: int = 1000
    outage_expiries: float = 3.0  # store-outage: how long the store is unreachable, in expiries
    # Notices (``balancer.notices``): a release wakes the other workers' cycles after this many
    # seconds, and a join or an operator's control ends their quiet waits, as PostgreSQL's and Redis'
    # channels do across processes; None: no notices (Blob without a channel layer: waiting receivers
    # poll, and nobody waits quietly).
    notice_latency: float | None = 0.005
    # hot-partition: every partition's events per second, the hot one's from the disturbance on. Its
    # owners checkpoint each partition they hold once a cycle (where the load-weighted plan reads rates).
    base_rate: float = 10.0
    hot_factor: float = 10.0
    checkpoint_lag: float = 1.0  # a checkpoint is behind the events by up to this many seconds' worth (random)

    def __post_init__(self) -> None:
        if self.interval <= 0 or self.expiry <= 0:
            raise ValueError(f"interval and expiry must be > 0, got {self.interval}, {self.expiry}")


def steady_for(settings: Settings, scenario: str, partitions: int, workers: int, seed: int) -> float:
    """Seconds from the balanced start to the disturbance (``Settings.steady_spread``), drawn from a
    generator of its own: the victims and every other draw stay those of the seed."""
    spread = random.Random(f"steady/{scenario}/{partitions}/{workers}/{seed}").uniform(0, settings.steady_spread)
    return settings.steady_intervals * settings.interval + spread * settings.expiry


def claim_offsets(
    settings: Settings, scenario: str, workers: list[str], seed: int, partitions: int
) -> dict[str, float]:
    """Seconds from the balanced start at which each of ``workers`` claims its deal
    (``Settings.start_phases``), drawn from a generator of its own: every other draw stays the seed's."""
    if settings.start_phases <= 0:
        return dict.fromkeys(workers, 0.0)
    period = settings.start_phases * RENEW_SHARE * settings.expiry
    draw = random.Random(f"phases/{scenario}/{partitions}/{len(workers)}/{seed}")
    return {w: draw.uniform(0, period) for w in workers}


def effective_size(scenario: str, partitions: int, workers: int) -> tuple[int, int]:
    """The partitions and workers a scenario really runs with (some force one of them)."""
    if scenario == "single-partition":
        return 1, workers
    if scenario == "more-workers-than-partitions":
        workers = max(workers, 2)
        return (partitions if partitions < workers else max(1, workers - 1)), workers
    return partitions, workers


@dataclass
class Outcome:
    """What one seeded run measured (see ``balancer.sim.run`` for how)."""

    balanced: bool
    cycles: int
    seconds: float
    moves: int
    min_moves: int
    overlap: float
    unowned: float
    requests: list[int]
    plan_ms: list[float]
    load_spread: float = 1.0  # at the end: the most loaded live worker's events per second over the mean
