"""The benchmarks' two sizes: full for ``make bench``, tiny when ``BENCH_TINY=1``.

``tests/benchmarks/test_benches_run.py`` runs every benchmark of ``make bench`` at its tiny size in
``make test`` (seconds each, through ``python -m tests.benchmarks.run``), so a change that breaks one
fails the build. A tiny size shrinks the work (events, seconds, rounds, seeds, fleets) and skips no
step, with one exception said where it is (bench_pipeline's demo latency); its figures mean
nothing. At full size nothing changes.
"""

from __future__ import annotations

import os
from typing import TypeVar

ENV = "BENCH_TINY"
T = TypeVar("T")


def tiny() -> bool:
    """Whether this run is the tiny one (``BENCH_TINY`` set and not 0)."""
    return os.environ.get(ENV, "") not in ("", "0")


def size(full: T, small: T) -> T:
    """``full`` for ``make bench``, ``small`` when the run is the tiny one."""
    return small if tiny() else full
