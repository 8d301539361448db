"""Every registered strategy through every scenario of the simulator, as one table.

Run: ``.venv/bin/python -m tests.benchmarks.bench_strategies [--seeds K] [--big-seeds K] [--jobs J]``.
Not collected by pytest. Each row is one ``balancer.sim.run.simulate`` call (the JSON of
``manage.py simulate``): 32 partitions on 4 workers unless the issue's targets name other sizes
(scale-out 4 -> 5 workers, add-partitions 16 -> 24, a single partition on 3 workers, 4
partitions on 6 workers), plus a cold start of 1024 partitions on 64 workers. Figures are
"median/max" over the seeds; moves are shown against the fewest possible. Then ``greedy`` beside
Microsoft's own greedy code, and the hot-partition scenario with the default strategy counting
partitions and weighing them by load (``--load-weighted``): the spread of load per worker.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from balancer.sim.run import SCENARIOS, Settings, simulate
from balancer.strategies import DEFAULT, NAMES
from tests.benchmarks.size import size
from workers.progress import progress

SIZES: dict[str, tuple[int, int]] = {  # scenario -> (partitions, workers)
    "scale-out": (32, 5),
    "add-partitions": (24, 4),
    "more-workers-than-partitions": (4, 6),
    "single-partition": (1, 3),
}
BIG = size(("cold-start", 1024, 64), ("cold-start", 64, 8))
COLUMNS = [
    "strategy",
    "scenario",
    "P/N",
    "balanced",
    "cycles",
    "seconds",
    "moves (min)",
    "overlap s",
    "max unowned s",
    "req/worker/cycle",
    "plan ms",
]


REQUESTS = "store_requests_per_worker_cycle"


def cases(seeds: int, big_seeds: int) -> list[tuple[str, str, int, int, int]]:
    """(strategy, scenario, partitions, workers, seeds) for every row, the default strategy first."""
    names = [DEFAULT, *sorted(n for n in NAMES if n != DEFAULT)]  # race included (balancer.sim.race)
    rows = []
    for name in names:
        for scenario in SCENARIOS:
            if scenario == "hot-partition":
                continue  # a table of its own, by load (``load_rows``)
            p, n = SIZES.get(scenario, (32, 4))
            rows.append((name, scenario, p, n, seeds))
        rows.append((name, BIG[0], BIG[1], BIG[2], big_seeds))
    return rows


def _simulate(case: tuple[str, str, int, int, int]) -> dict[str, Any]:
    from tests.benchmarks.microsoft_greedy import register

    register()  # "microsoft-greedy" (azure-eventhub's own code) for the side-by-side rows
    return simulate(*case)


# ``greedy`` beside azure-eventhub's own greedy code in the same harness: (scenario, P, N).
MICROSOFT_CASES = [
    ("cold-start", 32, 4),
    ("cold-start", BIG[1], BIG[2]),
    ("clock-skew", 32, 4),
    ("scale-out", 32, 5),
    ("crash", 16, 4),
]


def microsoft_rows(seeds: int, big_seeds: int, jobs: int) -> list[list[str]]:
    """``greedy`` and ``microsoft-greedy`` row by row, the last cell greedy's moves over Microsoft's."""
    todo = [
        (name, sc, p, n, big_seeds if p > 100 else seeds)
        for sc, p, n in MICROSOFT_CASES
        for name in ("greedy", "microsoft-greedy")
    ]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        done = list(pool.map(_simulate, todo))
    rows = []
    for ours, theirs in zip(done[::2], done[1::2], strict=True):
        mine, microsoft = ours["moves"]["median"] or 0, theirs["moves"]["median"] or 0
        ratio = f"{mine / microsoft:.2f}" if microsoft else ("1.00" if mine == microsoft else "-")
        rows += [[*row(ours), ratio], [*row(theirs), ""]]
    return rows


# The hot-partition scenario, by partitions counted and weighed by load: (P, N) per row.
LOAD_SIZES = size([(16, 4), (32, 4), (64, 8), (128, 16)], [(16, 4)])
LOAD_COLUMNS = [
    "P/N",
    "load max/mean by count",
    "load-weighted",
    "target",
    "balanced",
    "seconds",
    "moves",
    "max unowned s",
    "req/worker/cycle",
]
LOAD_TARGET = 1.25


def _simulate_load(case: tuple[int, int, int, bool]) -> dict[str, Any]:
    partitions, workers, seeds, weighted = case
    return simulate(None, "hot-partition", partitions, workers, seeds, weighted=weighted)


def load_target(partitions: int, workers: int) -> float:
    """The spread to reach: ``LOAD_TARGET``, or more where the hot partition alone is heavier than that."""
    s = Settings()
    alone = s.hot_factor * workers / (partitions - 1 + s.hot_factor)  # the hot partition's rate over the mean
    return max(LOAD_TARGET, alone)


def load_rows(seeds: int, jobs: int) -> list[list[str]]:
    """One row per size: the count-based spread beside the load-weighted one, and how the weighted run went."""
    todo = [(p, n, seeds, weighted) for p, n in LOAD_SIZES for weighted in (False, True)]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        done = list(pool.map(_simulate_load, todo))
    rows = []
    for (p, n), counted, weighted in zip(LOAD_SIZES, done[::2], done[1::2], strict=True):
        target = load_target(p, n)
        alone = "" if target == LOAD_TARGET else " (hot one alone)"
        rows.append(
            [
                f"{p}/{n}",
                _mm(counted["load_spread"], 3),
                _mm(weighted["load_spread"], 3),
                f"<= {target:.2f}{alone}",
                f"{weighted['balanced_runs']}/{weighted['seeds']}",
                _mm(weighted["seconds_to_balance"]),
                f"{_mm(weighted['moves'])} ({_mm(counted['moves'])})",
                f"{weighted['max_unowned_seconds']:.1f}",
                f"{_mm(weighted[REQUESTS])} ({_mm(counted[REQUESTS])})",
            ]
        )
    return rows


def _mm(value: dict[str, Any], digits: int = 1) -> str:
    if value["median"] is None:
        return "-"
    return f"{value['median']:.{digits}f}/{value['max']:.{digits}f}".replace(".0/", "/").removesuffix(".0")


def row(r: dict[str, Any]) -> list[str]:
    return [
        r["strategy"],
        r["scenario"],
        f"{r['partitions']}/{r['workers']}",
        f"{r['balanced_runs']}/{r['seeds']}",
        _mm(r["cycles_to_balance"]),
        _mm(r["seconds_to_balance"]),
        f"{_mm(r['moves'])} ({r['min_moves']})",
        _mm(r["overlap_seconds"]),
        f"{r['max_unowned_seconds']:.1f}",
        _mm(r["store_requests_per_worker_cycle"]),
        _mm(r["plan_ms"], 3),
    ]


def render(rows: list[list[str]], title: str, columns: list[str] | None = None) -> None:
    columns = COLUMNS if columns is None else columns
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text when rich is not installed
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
        print(title)
        for line in [columns, ["-" * w for w in widths], *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))
        return
    table = Table(title=title, header_style="bold")
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i < 2 else "right", no_wrap=True)
    previous = None
    for cells in rows:
        if previous is not None and cells[0] != previous:
            table.add_section()
        previous = cells[0]
        table.add_row(*cells)
    Console(width=220).print(table)


def main(argv: list[str] | None = None) -> None:
    """Print the table. ``argv``: this module's options (none when ``tests.benchmarks.run`` calls it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=size(20, 1), help="seeds per row (default 20)")
    parser.add_argument("--big-seeds", type=int, default=size(20, 1), help="seeds of the 1024/64 rows (default 20)")
    parser.add_argument("--jobs", type=int, default=2, help="processes running rows at once (default 2)")
    args = parser.parse_args(argv or [])
    started = time.perf_counter()
    todo = cases(args.seeds, args.big_seeds)
    # Rows run in separate processes, the big ones first so that both finish about together; each
    # row's plan_ms is measured inside its own process, one process per core.
    order = sorted(range(len(todo)), key=lambda i: -todo[i][2] * todo[i][4])
    seeds = sum(todo[i][4] for i in order)
    with (
        ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool,
        progress("strategies x scenarios", total=seeds, unit="seeds", info=f"{len(todo)} rows") as task,
    ):  # the progress line (a terminal only) counts the seeds of the rows done
        futures = {i: pool.submit(_simulate, todo[i]) for i in order}
        for i, future in futures.items():

            def advance(_done: Future[dict[str, Any]], seeds: int = todo[i][4]) -> None:
                task.advance(seeds)

            future.add_done_callback(advance)
        done = {i: future.result() for i, future in futures.items()}
    rows = [row(done[i]) for i in range(len(todo))]
    title = (
        f"simulator: interval 10 s, expiry 30 s, median/max over seeds; default strategy: {DEFAULT} "
        f"({time.perf_counter() - started:.0f} s)"
    )
    render(rows, title)
    started = time.perf_counter()
    side = microsoft_rows(args.seeds, max(1, args.big_seeds // 4), args.jobs)
    COLUMNS.append("moves vs MS")
    try:
        render(
            side,
            f"greedy beside azure-eventhub's own greedy (OwnershipManager), same harness and seeds "
            f"({time.perf_counter() - started:.0f} s)",
        )
    finally:
        COLUMNS.pop()
    started = time.perf_counter()
    rows = load_rows(args.seeds, args.jobs)
    title = (
        f"hot-partition: one of P partitions at {Settings().hot_factor:g}x the others' rate from the disturbance, "
        f"default strategy; load per worker max/mean at the end, median/max over {args.seeds} seeds; "
        f"balanced, seconds and moves of the load-weighted runs (moves and requests by count in brackets) "
        f"({time.perf_counter() - started:.0f} s)"
    )
    render(rows, title, LOAD_COLUMNS)


if __name__ == "__main__":
    main(sys.argv[1:])
