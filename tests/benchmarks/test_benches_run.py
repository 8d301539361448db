"""Benchmarks that cannot rot (issue 40, item 5): every benchmark ``make bench`` runs also runs here,
at its tiny size, so a change that breaks one fails ``make test``.

Each runs as ``make bench`` runs it, through ``python -m tests.benchmarks.run <its name>``, with
``BENCH_TINY=1`` (``tests/benchmarks/size.py``): the same entry point and steps on little work. Its
figures are not judged (they mean nothing at that size); a bench passes when it exits 0, printed its
table and reported no failed case ("FAILED", a "failed" cell, a store "not measured"). The ones that
start servers, browsers, fleets of processes or Spark are marked ``slow`` (``-m "not slow"`` skips them).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.benchmarks.run import BENCHMARKS
from tests.benchmarks.size import ENV

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FAST = {"bench_hub", "bench_worker", "bench_throughput", "bench_tracing", "bench_pipeline_state", "bench_visitors"}
# Seconds a bench may take at its tiny size before it is stopped and failed (pytest-timeout's 300 s
# otherwise): measured on this 2-core machine with the suite's load beside it, times about three.
TIMEOUTS = {
    "bench_pipeline": 900,
    "bench_alert_latency": 900,
    "bench_amqp": 480,
    "bench_fleet_cost": 480,
    "bench_handoff": 480,
    "bench_outage": 480,
}
REPORTED_FAILURE = re.compile(r"FAILED|\bfailed\b|not measured")


def _name(module: str) -> str:
    return module.rsplit(".", 1)[-1]


def _case(module: str) -> object:
    name = _name(module)
    marks = [pytest.mark.timeout(TIMEOUTS.get(name, 300))]
    if name not in FAST:
        marks.append(pytest.mark.slow)
    return pytest.param(name, marks=marks, id=name)


def _stop(process: subprocess.Popen[str]) -> None:
    """Ctrl-C to the bench's whole process group (its finally blocks stop its servers), then SIGKILL."""
    for sig, grace in ((signal.SIGINT, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run_tiny(name: str, timeout: float) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``python -m tests.benchmarks.run <name>`` at the tiny size."""
    env = {**os.environ, ENV: "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.benchmarks.run", name],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(process)
        out, err = process.communicate()
        pytest.fail(f"{name} still running after {timeout:.0f} s at its tiny size:\n{_tail(out, err)}")
    finally:
        if process.poll() is None:
            _stop(process)
    return process.returncode, out, err


def _tail(out: str, err: str) -> str:
    return f"--- stdout (end)\n{out[-4000:]}\n--- stderr (end)\n{err[-3000:]}"


@pytest.mark.parametrize("name", [_case(module) for _, module in BENCHMARKS])
def test_the_bench_runs_at_its_tiny_size(name: str, request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("timeout")
    limit = float(marker.args[0]) if marker else 300.0
    started = time.monotonic()
    status, out, err = run_tiny(name, limit - 30)
    took = time.monotonic() - started
    title = next(title for title, module in BENCHMARKS if _name(module) == name)
    failures = [line for line in out.splitlines() if REPORTED_FAILURE.search(line)]  # the tables, not the logs
    tail = _tail(out, err)
    assert status == 0, f"{name} exited with {status} after {took:.0f} s:\n{tail}"
    assert f"=== {title} (tests.benchmarks.{name})" in out, f"{name} did not run:\n{tail}"
    assert f"tiny sizes ({ENV}=1)" in out, f"{name} did not run at its tiny size:\n{tail}"
    # Why a case failed is printed before the table, often further back than the tail shows.
    why = [line for line in out.splitlines() if "timed out" in line][:5]
    assert not failures, f"{name} reported failures: {failures}\nwhy: {why}\n{tail}"
    assert len(out.splitlines()) > 4, f"{name} printed no table:\n{tail}"


def test_make_bench_runs_every_bench_of_this_folder() -> None:
    """A bench left out of ``run.BENCHMARKS`` would run neither in ``make bench`` nor above."""
    listed = [_name(module) for _, module in BENCHMARKS]
    found = sorted(path.stem for path in HERE.glob("bench_*.py"))
    assert sorted(listed) == found
    assert len(set(listed)) == len(listed)


def test_a_bench_name_picks_that_bench_only() -> None:
    from tests.benchmarks.run import _named

    chosen = [module for _, module in BENCHMARKS if _named(module, {"bench_pipeline"})]
    assert chosen == ["tests.benchmarks.bench_pipeline"]
    amqp_and_prefetch = [module for _, module in BENCHMARKS if _named(module, {"amqp", "prefetch"})]
    assert amqp_and_prefetch == ["tests.benchmarks.bench_amqp", "tests.benchmarks.bench_prefetch"]
