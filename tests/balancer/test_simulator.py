"""The simulator and ``manage.py simulate``: determinism, every scenario, the known behaviours."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from balancer.notices import OPERATOR, Released
from balancer.sim import loop as sim_loop
from balancer.sim.measures import Processing, longest_unprocessed, min_moves, overlap_seconds
from balancer.sim.race import RaceRun
from balancer.sim.run import SCENARIOS, Settings, run_of, simulate
from balancer.sim.scenarios import REF
from balancer.sim.table import TableRun
from balancer.sim.worker import SimWorker
from balancer.strategies import DEFAULT, STRATEGIES, get_strategy

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "strategy",
    "scenario",
    "partitions",
    "workers",
    "seeds",
    "balanced_runs",
    "cycles_to_balance",
    "seconds_to_balance",
    "moves",
    "min_moves",
    "overlap_seconds",
    "max_unowned_seconds",
    "store_requests_per_worker_cycle",
    "plan_ms",
}
QUICK = Settings(observe_cycles=5, horizon_cycles=40, skew_cycles=20, single_partition_cycles=50)


def number(result: dict[str, object], key: str) -> float:
    """A top-level figure of ``simulate``'s result (a dict of objects), checked to be a number."""
    value = result[key]
    assert isinstance(value, int | float), (key, value)
    return value


def without_timing(result: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in result.items() if k != "plan_ms"}


# the engine ---------------------------------------------------------------------------------


def test_simulated_time_passes_without_waiting() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.gather(asyncio.sleep(3600), asyncio.wait_for(asyncio.sleep(5), 10))
        return loop.time()

    started = time.perf_counter()
    assert sim_loop.run(main()) == 3600.0
    assert time.perf_counter() - started < 1.0


def test_overlap_and_unowned_time_come_from_the_processing_intervals() -> None:
    p = Processing()
    p.start("a", "0", 0.0)
    p.start("b", "0", 10.0)  # b starts before a notices its loss at 14
    p.stop("a", "0", 14.0)
    p.stop("b", "0", 20.0)
    p.start("a", "0", 26.0)  # nobody from 20 to 26
    p.close_all(30.0)
    assert overlap_seconds(p, 0.0, 30.0) == 4.0
    assert longest_unprocessed(p, ["0", "1"], 0.0, 30.0) == 30.0  # "1" was never processed
    assert longest_unprocessed(p, ["0"], 0.0, 30.0) == 6.0


def test_min_moves_counts_surplus_drains_and_pins() -> None:
    holders = {str(i): f"w{i % 4}" for i in range(32)}
    assert min_moves(holders, ["w0", "w1", "w2", "w3", "w4"]) == 6  # 8,8,8,8,0 -> 7,7,6,6,6
    assert min_moves(holders, ["w0", "w1", "w2"]) == 8  # w3 drained: its 8 must go
    assert min_moves(holders, ["w0", "w1", "w2", "w3"], {"1": "w0"}) == 2  # the pin, then one back
    orphans = {p: (None if w == "w3" else w) for p, w in holders.items()}
    assert min_moves(orphans, ["w0", "w1", "w2"]) == 0  # taking a dead worker's partitions is no move


# determinism ------------------------------------------------------------------------------------


def test_the_same_arguments_give_the_same_json() -> None:
    for strategy in ("eph", DEFAULT):
        first = simulate(strategy, "scale-out", 12, 4, seeds=2, settings=QUICK)
        again = simulate(strategy, "scale-out", 12, 4, seeds=2, settings=QUICK)
        assert without_timing(first) == without_timing(again)
    other = simulate("eph", "scale-out", 12, 4, seeds=3, settings=QUICK)
    assert without_timing(other) != without_timing(first)  # seeds do change the runs


def test_the_command_gives_the_same_json_in_processes_with_different_hash_seeds() -> None:
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [
                sys.executable,
                "manage.py",
                "simulate",
                "--scenario",
                "cold-start",
                "--partitions",
                "16",
                "--workers",
                "3",
                "--seeds",
                "2",
                "--json",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        outputs.append(without_timing(json.loads(done.stdout)))
    assert outputs[0] == outputs[1]
    assert outputs[0]["strategy"] == DEFAULT


# every scenario, every strategy ---------------------------------------------------------------------


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_strategy_runs_every_scenario(scenario: str) -> None:
    for name, strategy in STRATEGIES.items():
        result = simulate(name, scenario, 6, 3, seeds=1, settings=QUICK)
        assert set(result) >= KEYS, name
        assert result["strategy"] == name and result["scenario"] == scenario
        assert 0 <= result["balanced_runs"] <= 1  # type: ignore[operator]
        supports_controls = strategy.uses_members
        if scenario not in ("drain", "pin") or supports_controls:
            assert result["balanced_runs"] == 1, f"{name} did not balance {scenario}"
            assert result["moves"]["max"] >= result["min_moves"]  # type: ignore[index]
        assert result["overlap_seconds"]["max"] >= 0  # type: ignore[index]
        # A steady cycle on the change feed is one read; renewals are steps of their own, counted
        # with the next cycle (issue 34: the simulator drives the coordinator as the runtime does).
        assert result["store_requests_per_worker_cycle"]["median"] >= 1  # type: ignore[index]
    if scenario in ("single-partition", "more-workers-than-partitions"):
        assert result["partitions"] < result["workers"]  # type: ignore[operator]


def test_the_race_has_a_run_of_its_own_and_every_plan_strategy_the_lease_table_run() -> None:
    assert run_of(get_strategy("race")) is RaceRun
    assert {run_of(strategy) for strategy in STRATEGIES.values()} == {TableRun}


def test_cold_start_one_claim_per_cycle_against_all_at_once() -> None:
    # balanced claims one a cycle and moves nothing; greedy (Microsoft's) grabs everything free at
    # once, so the first to cycle takes all, and the others steal back one partition a cycle each.
    slow = simulate("balanced", "cold-start", 32, 4, seeds=3, settings=QUICK)
    grab = simulate("greedy", "cold-start", 32, 4, seeds=3, settings=QUICK)
    assert slow["balanced_runs"] == grab["balanced_runs"] == 3
    assert slow["reads_to_balance"]["median"] >= 8  # type: ignore[index]
    assert grab["reads_to_balance"]["max"] <= 32 // 4 + 2  # type: ignore[index]
    assert slow["moves"]["max"] == 0 < grab["moves"]["median"] <= 32 * 3 // 4  # type: ignore[index]


def test_crashed_workers_partitions_are_taken_only_after_expiry() -> None:
    s = Settings()
    earliest = s.expiry - s.interval * (1 + s.jitter)  # the victim renewed at most one cycle before
    for name in STRATEGIES:
        result = simulate(name, "crash", 16, 4, seeds=3, settings=QUICK)
        assert result["balanced_runs"] == 3, name
        assert result["seconds_to_balance"]["median"] >= earliest  # type: ignore[index]
        assert result["max_unowned_seconds"] >= earliest  # type: ignore[operator]
        assert result["min_moves"] == 0  # taking a dead worker's partitions moves nothing
        if name == "balanced":  # claims below its share only: never more than the orphans
            assert result["moves"]["max"] == 0  # type: ignore[index]
    for name in ("eph", "greedy"):  # both grab every expired lease they need in one cycle
        result = simulate(name, "crash", 16, 4, seeds=3, settings=QUICK)
        assert result["seconds_to_balance"]["max"] <= s.expiry + s.interval * (1 + s.jitter)  # type: ignore[index]


@pytest.mark.parametrize("name", [n for n, s in STRATEGIES.items() if not s.store_clock])
def test_a_strategy_judging_by_its_own_clock_tolerates_100_s_of_skew_at_30_s_and_180_s(name: str) -> None:
    # Issue 36, item 4: its leases are renewed at a quarter of the expiry (CLOCK_RENEW_SHARE), so a worker
    # 100 s ahead still finds every live lease unexpired. Renewed at 65 % (the store-clock strategies'
    # share) they churned: balanced 30, greedy 124 and eph 126 moves in 40 intervals.
    settings = Settings(interval=30.0, expiry=180.0, skew_seconds=100.0, skew_cycles=40)
    result = simulate(name, "clock-skew", 32, 4, seeds=2, settings=settings)
    assert result["moves"]["max"] == 0 and result["overlap_seconds"]["max"] == 0, result  # type: ignore[index]


def test_clock_skew_makes_balanced_churn_but_not_a_store_clock_strategy() -> None:
    # 000's "Clock skews": a worker 3 minutes ahead sees every other lease expired and takes it.
    churn = simulate("balanced", "clock-skew", 12, 3, seeds=2, settings=QUICK)
    assert churn["moves"]["median"] > 0 and churn["overlap_seconds"]["median"] > 0  # type: ignore[index]
    # and it goes on until the clock is right again (give or take the skewed worker's last cycle)
    assert churn["seconds_to_balance"]["median"] >= (QUICK.skew_cycles - 2) * QUICK.interval  # type: ignore[index]
    for name in [n for n, s in STRATEGIES.items() if s.store_clock]:
        calm = simulate(name, "clock-skew", 12, 3, seeds=2, settings=QUICK)
        assert calm["moves"]["max"] == 0 and calm["overlap_seconds"]["max"] == 0, name  # type: ignore[index]


@pytest.mark.parametrize("scenario", ["scale-out", "drain", "pin"])
def test_a_planned_move_leaves_no_gap_where_the_store_sends_release_notices(scenario: str) -> None:
    # Issue 15's bar: the receiver starts within 0.5 s of the release (20 seeds), never before it.
    told = simulate(None, scenario, 32, 4, seeds=20)
    assert told["balanced_runs"] == 20
    assert number(told, "max_unowned_seconds") <= 0.5, told
    assert told["overlap_seconds"]["max"] == 0  # type: ignore[index]
    # Without notices (the Blob store) a receiver that was already waiting for the partition polls
    # every quarter interval (scale-out); one that was not (drain, pin: the holder may see the control
    # first) claims at its next cycle, up to an interval later.
    untold = simulate(None, scenario, 32, 4, seeds=20, settings=Settings(notice_latency=None))
    interval = Settings().interval
    if scenario == "scale-out":
        told_gap, untold_gap = number(told, "max_unowned_seconds"), number(untold, "max_unowned_seconds")
        assert told_gap < untold_gap <= interval / 4 * 1.1 + 0.5, untold
    else:
        assert number(untold, "max_unowned_seconds") > interval / 2, untold
    assert told["moves"] == untold["moves"]  # a notice wakes a cycle; it moves nothing more


def test_workers_starting_over_a_second_claim_once_the_last_has_announced_itself_and_move_nothing() -> None:
    # Issue 36, item 3: a worker whose read after announcing finds one joined less than half the
    # "soon" wait ago announces again (for up to an interval) instead of claiming a share of fewer
    # workers that it would hand part of over a cycle later: 24 moves on 256/16 before, 3 on 32/4.
    settings = Settings(interval=2.0, expiry=10.0, start_spread=1.0)
    result = simulate(None, "cold-start", 256, 16, seeds=3, settings=settings)
    assert result["balanced_runs"] == 3 and result["moves"]["max"] == 0, result  # type: ignore[index]
    assert result["seconds_to_balance"]["max"] <= 1.0 + 2.0, result  # type: ignore[index]


def test_simultaneous_starters_claim_a_quarter_interval_after_announcing_with_no_wasted_move() -> None:
    # The cold-start bar: two cycles (announce, claim), no move; the claim comes a quarter interval
    # (at most a second) after the announcement, not a whole interval: within the first interval.
    result = simulate(None, "cold-start", 32, 4, seeds=20)
    assert result["balanced_runs"] == 20
    assert result["reads_to_balance"]["max"] == 2 and result["moves"]["max"] == 0  # type: ignore[index]
    assert result["cycles_to_balance"]["max"] == 1  # type: ignore[index]
    assert result["seconds_to_balance"]["max"] <= 1.0 * 1.1 + 0.2  # type: ignore[index]


# the command ------------------------------------------------------------------------------------


def test_simulate_prints_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    call_command(
        "simulate",
        "--strategy",
        "greedy",
        "--scenario",
        "add-partitions",
        "--partitions",
        "24",
        "--workers",
        "4",
        "--seeds",
        "2",
        "--json",
    )
    result = json.loads(capsys.readouterr().out)
    assert set(result) >= KEYS
    assert (result["strategy"], result["partitions"], result["workers"], result["seeds"]) == ("greedy", 24, 4, 2)
    assert result["balanced_runs"] == 2


def test_simulate_without_json_prints_a_readable_summary(capsys: pytest.CaptureFixture[str]) -> None:
    call_command("simulate", "--scenario", "single-partition", "--workers", "2", "--seeds", "1")
    out = capsys.readouterr().out
    assert out.startswith(f"{DEFAULT} / single-partition: 1 partitions, 2 workers")
    assert "balanced runs      1/1" in out


def test_simulate_load_weighted_evens_the_load_of_a_hot_partition(capsys: pytest.CaptureFixture[str]) -> None:
    spreads = {}
    for weighted in (False, True):
        call_command(
            "simulate",
            "--scenario",
            "hot-partition",
            "--partitions",
            "32",
            "--workers",
            "4",
            "--seeds",
            "2",
            "--json",
            *(["--load-weighted"] if weighted else []),
        )
        result = json.loads(capsys.readouterr().out)
        assert result["load_weighted"] is weighted
        spreads[weighted] = result["load_spread"]["max"]
    assert spreads[True] <= 1.25 < spreads[False]
    call_command("simulate", "--scenario", "hot-partition", "--partitions", "16", "--seeds", "1", "--load-weighted")
    assert "(load-weighted)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "meltdown"], "unknown scenario 'meltdown'"),
        (["--scenario", "crash", "--strategy", "nope"], "unknown strategy 'nope'"),
        (["--scenario", "crash", "--partitions", "0"], "partitions must be at least 1"),
        (["--scenario", "crash", "--workers", "0"], "workers must be at least 1"),
        (["--scenario", "crash", "--interval", "30", "--expiry", "30"], "need 0 < --interval < --expiry"),
        (["--scenario", "crash", "--strategy", "greedy", "--load-weighted"], "--load-weighted works with"),
    ],
)
def test_simulate_refuses_bad_arguments_in_one_line(args: list[str], message: str) -> None:
    with pytest.raises(CommandError) as raised:
        call_command("simulate", *args)
    assert message in str(raised.value) and "\n" not in str(raised.value)


# the runtime's schedule -------------------------------------------------------------------------


def test_a_steady_fleet_hears_a_join_as_news_and_balances_within_two_seconds_where_notices_cross() -> None:
    # The simulator drives its workers by the runtime's schedule (``balancer.schedule``): a steady fleet
    # waits quietly (until ``quiet_until``), and the newcomer's join notice ends the wait, as in
    # production on PostgreSQL or Redis. Without notices (Blob) the others read at their next cycle.
    # The notice comes from its second cycle, "soon" (a second at most) after its first: the one that
    # shows it ready for partitions (``cooperative.unproven``).
    told = simulate(None, "scale-out", 32, 4, seeds=5)
    untold = simulate(None, "scale-out", 32, 4, seeds=5, settings=Settings(notice_latency=None))
    assert told["balanced_runs"] == untold["balanced_runs"] == 5
    assert told["seconds_to_balance"]["max"] < 2.0 < untold["seconds_to_balance"]["median"]  # type: ignore[index]
    interval = Settings().interval
    for result in (told, untold):  # balancing intervals: the seconds over the interval, rounded up
        seconds = result["seconds_to_balance"]["median"]  # type: ignore[index]
        assert result["cycles_to_balance"]["median"] == math.ceil(seconds / interval)  # type: ignore[index]
        assert result["reads_to_balance"]["median"] >= result["cycles_to_balance"]["median"]  # type: ignore[index]


def test_leases_are_renewed_by_renewal_steps_between_quiet_reads() -> None:
    # A steady fleet reads less often than every interval (quiet waits) and renews its leases in
    # renewal steps between reads: nobody's partition lapses while balance is observed for 20 intervals.
    settings = Settings(observe_cycles=20)
    result = simulate(None, "drain", 32, 4, seeds=3, settings=settings)
    assert result["balanced_runs"] == 3
    assert result["overlap_seconds"]["max"] == 0 and result["max_unowned_seconds"] <= 0.5  # type: ignore[index,operator]
    assert result["moves"]["max"] == result["min_moves"]  # type: ignore[index]


def test_a_simulated_worker_wakes_on_a_release_or_an_operators_notice_and_on_a_join_only_in_a_quiet_wait() -> None:
    async def main() -> list[bool]:
        now = asyncio.get_running_loop().time
        rng = random.Random(0)
        worker = SimWorker("w0", CyclesOnly(), interval=10.0, jitter=0.0, poll_waiting=False, rng=rng, now=now)
        seen = []
        worker.news()  # waiting one interval: news does not end it
        seen.append(await worker.wait(now() + 10.0))
        worker.quiet = True
        worker.news()  # a quiet wait: it does
        seen.append(await worker.wait(now() + 10.0))
        worker.hear(Released(REF, ("3",), "w1"))  # a release always does
        seen.append(await worker.wait(now() + 10.0))
        worker.quiet = False
        worker.hear(Released(REF, (), "w1"))  # a join, waiting one interval: no
        seen.append(await worker.wait(now() + 10.0))
        worker.hear(Released(REF, (), OPERATOR))  # an operator's drain or pin always does
        seen.append(await worker.wait(now() + 10.0))
        return seen

    assert sim_loop.run(main()) == [False, True, True, False, True]


def test_a_drain_where_notices_cross_is_acted_on_at_once_whatever_the_drained_worker_was_waiting_for() -> None:
    # The operator's notice wakes every worker, not only those in a quiet wait: with the bench's timing
    # (bench_sim_vs_real) 4 drains in 40 came while the drained worker waited one interval after a full
    # read, and took 0.6-1.5 s instead of 0.02 s.
    settings = Settings(
        interval=2.0, expiry=10.0, latency=(0.0008, 0.0018), handoff_seconds=0.005, steady_spread=1.0, start_phases=1.0
    )
    result = simulate(None, "drain", 8, 4, seeds=40, settings=settings)
    assert result["balanced_runs"] == 40
    assert result["seconds_to_balance"]["max"] < 0.1, result  # type: ignore[index]


class CyclesOnly:
    """Just enough of a ``Balancer`` for a ``SimWorker`` that is never asked what is due."""

    def quiet_until(self, interval: float | None = None) -> float | None:
        return None

    def next_renewal(self) -> float | None:
        return None

    async def partitions_changed(self) -> bool:
        return False


def test_partitions_added_to_a_quiet_fleet_are_owned_within_an_interval() -> None:
    # At Microsoft's 30 s / 180 s a steady fleet waits quietly about 57 s between reads; no store's
    # channel tells of partitions added, so the wait looks at the hub every interval (it took 53 s).
    settings = Settings(interval=30.0, expiry=180.0)
    result = simulate(None, "add-partitions", 32, 4, seeds=3, settings=settings)
    assert result["balanced_runs"] == 3
    assert result["seconds_to_balance"]["max"] <= settings.interval  # type: ignore[index]


@pytest.mark.parametrize("phases", [0.0, 1.0])
def test_the_balanced_start_spreads_renewals_over_the_renewal_period_when_told(phases: float) -> None:
    # A real fleet's leases were won at different times, so each worker renews on a phase of its own
    # (bench_sim_vs_real: a renewal step restarts a quiet wait's looks at the hub); by default every
    # lease of the balanced start is written at once and every worker renews in step.
    settings = Settings(interval=2.0, expiry=10.0, start_phases=phases)

    async def renewals() -> list[float]:
        run = TableRun(get_strategy(DEFAULT), "crash", 8, 4, 0, settings)
        run._build()
        await run._adopt(run.names)
        due = [run.coordinators[w].next_renewal() for w in run.names]
        launched = [task for tasks in run.tasks.values() for task in tasks]
        for task in launched:  # the workers _adopt launched: ended here, not destroyed pending with the loop
            task.cancel()
        await asyncio.gather(*launched, return_exceptions=True)
        return sorted(t for t in due if t is not None)

    due = sim_loop.run(renewals())
    assert len(due) == 4
    if phases:
        assert due[-1] - due[0] > 1.0  # four draws within 6.5 s: 1 s apart at the least for this seed
    else:
        assert due[-1] - due[0] < 0.1  # claimed one after the other: only the store's round trips apart


class StopAndJoin(TableRun):
    """A stop-and-join that notes when the newcomer was launched and what it had at the stop."""

    launched_at = float("nan")
    held_at_stop = 0  # partitions whose record named the newcomer

    def _launch(self, worker: str, first_at: float) -> None:
        if worker == self.names[-1]:
            self.launched_at = self._now()
        super()._launch(worker, first_at)

    async def _disturb(self) -> None:
        await super()._disturb()
        self.held_at_stop = self.ledger.held[self.names[-1]]


@pytest.mark.parametrize("lead", [0.0, 1.0])
def test_a_stop_and_join_stops_its_victim_the_join_lead_after_the_newcomer_starts(lead: float) -> None:
    # bench_sim_vs_real's real newcomer reaches its first cycle before the other worker gets SIGTERM
    # (the simulator is told how long before, as measured); the run is timed from the stop.
    run = StopAndJoin(
        get_strategy(DEFAULT), "stop-and-join", 8, 4, 0, Settings(interval=2.0, expiry=10.0, join_lead=lead)
    )
    outcome = sim_loop.run(run.main())
    assert outcome.balanced
    assert run.disturbed_at - run.launched_at == pytest.approx(lead)
    if lead:  # it joined, showed itself ready half a second later, and was handed partitions before the stop
        assert run.held_at_stop >= 1
