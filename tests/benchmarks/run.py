"""`make bench`: runs every benchmark and prints its table. Figures, not assertions.

Each benchmark is a module of this package with a ``main()`` that prints one table; they run one
after another in this process's interpreter so their figures do not compete for the two cores.
``python -m tests.benchmarks.run bench_hub bench_worker`` runs only those (a word that names no
benchmark picks every one whose module path holds it). With ``BENCH_TINY=1`` every benchmark runs
at a tiny size (``tests.benchmarks.size``), as ``make test`` runs them (``test_benches_run.py``).
On a terminal (stderr) a progress line counts the benchmarks (``workers.progress``; some add
their own steps under it); the tables on stdout are the same with or without it.
"""

from __future__ import annotations

import importlib
import os
import sys
import time

from tests.benchmarks.size import ENV, tiny
from workers.progress import progress

BENCHMARKS = [
    ("embedded hub: raw read and write rates", "tests.benchmarks.bench_hub"),
    ("one worker end to end on the embedded hub", "tests.benchmarks.bench_worker"),
    ("one worker vs the hub's raw read rate; memory over 10M events", "tests.benchmarks.bench_throughput"),
    ("one worker with tracing off and on vs a floor without the tracing hooks", "tests.benchmarks.bench_tracing"),
    ("strategies x scenarios (simulator)", "tests.benchmarks.bench_strategies"),
    ("simulator vs real runworkers processes: seconds to balance and moves", "tests.benchmarks.bench_sim_vs_real"),
    ("store requests per worker per cycle, every real store", "tests.benchmarks.bench_stores"),
    ("a planned move, real processes: release to first event, notices on and off", "tests.benchmarks.bench_handoff"),
    ("Spark pipeline: 1M landed events vs a pyarrow scan; demo latency", "tests.benchmarks.bench_pipeline"),
    ("Spark pipeline's dedupe state after 1M and 10M events", "tests.benchmarks.bench_pipeline_state"),
    (
        "alerts (database, websocket, /api/pipeline) and aggregates per event at 1,000 events/s, Spark local[2]",
        "tests.benchmarks.bench_alert_latency",
    ),
    ("Microsoft's processor vs Leaseboard's workers over AMQP", "tests.benchmarks.bench_amqp"),
    ("Event Hubs reader: append-to-receive latency and read rate by prefetch", "tests.benchmarks.bench_prefetch"),
    ("console: event -> browser latency, /metrics render", "tests.benchmarks.bench_dashboard"),
    ("console under 1,000 anonymous requests and 200 sockets: CPU, memory, tasks", "tests.benchmarks.bench_visitors"),
    ("store outages of 2x and 5x the expiry: moves, duplicates, recovery", "tests.benchmarks.bench_outage"),
    (
        "idle fleets of 64, 256 and 1024 partitions: balance, store queries, CPU, RSS; a chart",
        "tests.benchmarks.bench_fleet_cost",
    ),
]


def _named(module: str, words: set[str]) -> bool:
    """Whether ``module`` is chosen by the filter words: its own name (``bench_pipeline``, not
    ``bench_pipeline_state`` too) or, for a word that names no benchmark, any part of its path."""
    short = module.rsplit(".", 1)[-1]
    names = {m.rsplit(".", 1)[-1] for _, m in BENCHMARKS}
    return any(word in (short, module) or (word not in names and word in module) for word in words)


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    only = set(sys.argv[1:])
    del sys.argv[1:]  # each benchmark parses its own options; the filter words are not theirs
    failed = []
    chosen = [(title, module) for title, module in BENCHMARKS if not only or _named(module, only)]
    if tiny():
        print(f"tiny sizes ({ENV}=1): every step runs, on little work; the figures mean nothing", flush=True)
    with progress("benchmarks", total=len(chosen), unit="benchmarks") as task:
        for title, module in chosen:
            task.update(info=module.rsplit(".", 1)[-1])
            print(f"\n=== {title} ({module})", flush=True)
            started = time.perf_counter()
            try:
                status = importlib.import_module(module).main()
                if status:  # a bench that goes on past a failed case says so by its exit status
                    print(f"FAILED: {module}.main() returned {status}")
                    failed.append(module)
            except Exception as exc:  # report and go on: one broken benchmark must not hide the others
                print(f"FAILED: {type(exc).__name__}: {exc}")
                failed.append(module)
            print(f"--- {time.perf_counter() - started:.1f} s", flush=True)
            task.advance()
    if failed:
        print(f"\nbenchmarks that failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
