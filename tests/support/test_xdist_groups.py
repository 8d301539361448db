"""tests.support.xdist_groups: under ``--dist loadgroup`` every test that uses ``spark`` runs on one
xdist worker (one JVM), on the pytest this suite runs (9.2 drops xdist 3.8's group suffix without it)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.test_timeline import throwaway_run

LOADGROUP = ["-n", "3", "--dist", "loadgroup"]
TESTS = """
import pytest


@pytest.fixture(scope="session")
def spark():
    return object()


@pytest.mark.parametrize("n", range(6))
def test_with_spark(spark, n):
    pass


@pytest.mark.parametrize("n", range(6))
def test_without(n):
    pass
"""


def test_every_test_that_uses_spark_runs_on_one_xdist_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(TESTS)
    done = throwaway_run(["-v", "-p", "tests.support.xdist_groups", *LOADGROUP, str(tmp_path)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"^\[(gw\d)\] .*PASSED .*::(test_\w+)\[(\d)\](@\w+)?", done.stdout, re.MULTILINE)
    assert len(ran) == 12, done.stdout
    grouped = {(worker, suffix) for worker, test, _, suffix in ran if test == "test_with_spark"}
    assert len(grouped) == 1 and next(iter(grouped))[1] == "@spark", done.stdout
    assert all(suffix == "" for _, test, _, suffix in ran if test == "test_without"), done.stdout
    assert len({worker for worker, *_ in ran}) > 1, done.stdout  # the others still spread over the workers
