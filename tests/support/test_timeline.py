"""tests.support.timeline: a run's tests per worker, and which worker bounds the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.timeline import summary, tree_cpu
from tests.support.waiting import until_sync

# Plugins the throwaway run does not use: each pytest process would spend seconds loading them.
UNUSED = [
    f"-pno:{name}"
    for name in ("cacheprovider", "django", "hypothesispytest", "schemathesis", "pytest_postgresql", "pytest_redis")
]


def throwaway_run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m pytest ARGS`` (without the plugins it does not use) as a run of its own in ``cwd``,
    this repository importable, with ``env`` added to the environment."""
    root = Path(__file__).resolve().parents[2]
    environ = {**os.environ, **(env or {}), "PYTHONPATH": str(root)}
    for name in [n for n in environ if n.startswith("PYTEST_XDIST_")]:  # not one of our workers
        environ.pop(name)
    command = [sys.executable, "-m", "pytest", *UNUSED, *args]
    return subprocess.run(command, cwd=cwd, env=environ, capture_output=True, text=True, timeout=120)


def test_the_summary_puts_the_worker_that_ended_last_first_with_its_busy_and_idle_time() -> None:
    rows = [
        {"worker": "gw0", "test": "a", "start": 100.0, "end": 110.0, "cpu": 9.5},
        {"worker": "gw0", "test": "b", "start": 115.0, "end": 120.0, "cpu": 1.0},
        {"worker": "gw1", "test": "c", "start": 100.0, "end": 190.0, "cpu": 2.0},
    ]
    lines = summary(rows, top=1)
    assert lines[0] == "gw1: 1 tests, busy 90s, idle 0s, ended at 90s, CPU 2s"
    assert lines[2] == "gw0: 2 tests, busy 15s, idle 5s, ended at 20s, CPU 10s"
    assert lines[3].split() == ["10.0s,", "CPU", "9.5s,", "from", "0s", "a"]
    assert lines[4] == "most CPU (of 12s in all):" and lines[5].split()[-1] == "a"


def test_a_run_with_the_variable_set_records_each_test_once(tmp_path: Path) -> None:
    (tmp_path / "test_two.py").write_text("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    record = tmp_path / "timeline.jsonl"
    env = {"PYTEST_TIMELINE": str(record)}
    done = throwaway_run(["-q", "-p", "tests.support.timeline", str(tmp_path)], tmp_path, env)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert [r["test"].rsplit("::", 1)[1] for r in rows] == ["test_one", "test_two"]
    assert all(r["worker"] == "main" and r["end"] >= r["start"] and r["cpu"] >= 0 for r in rows)
    record.unlink()
    # the workers record, not the controller as well
    xdist = throwaway_run(["-q", "-p", "tests.support.timeline", str(tmp_path), "-n", "2"], tmp_path, env)
    assert xdist.returncode == 0, xdist.stdout + xdist.stderr
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert sorted(r["test"].rsplit("::", 1)[1] for r in rows) == ["test_one", "test_two"]
    assert {r["worker"] for r in rows} <= {"gw0", "gw1"}


def test_the_cpu_of_a_process_tree_counts_a_child_that_burns_it() -> None:
    before = tree_cpu(os.getpid())
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\ntime.sleep(60)",
        ]
    )
    try:
        until_sync(lambda: tree_cpu(os.getpid()) - before >= 0.5, "the child's half second of CPU to count")
    finally:
        child.kill()
        child.wait()
