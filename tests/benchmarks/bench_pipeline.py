"""Events per second through the Spark pipeline for 1 million landed events, against a plain pyarrow
scan of the same files as the floor.

Run: ``.venv/bin/python -m tests.benchmarks.bench_pipeline [--events N]`` (or ``make bench``). The
events are landed first, as the landing handler lands them (files of 5000 events, 16 partitions,
written durably with ``workers.landing.write_atomically``); they are synthetic sensor readings of
1000 homes over an hour. Then, on the same files:

* pyarrow: a scan of every column (the floor: reading is all it does), and a scan plus the
  per-home/minute/sensor count (the aggregation without the dedupe);
* Spark batch: read, count per home/minute/sensor, write Parquet; and the same with
  ``dropDuplicates(partition, sequence)`` first (what the job must at least do);
* the real job, ``runpipeline --once`` minus the command (``PipelineJob.start(once=True)``: file
  source, dedupe by counted ranges, aggregates and alerts to Parquet, summary to a throw-away SQLite
  database), from a fresh checkpoint.

Each Spark case is measured twice (``local[2]``, the pipeline's own session settings):

* cold: each case is the first query of its own new Spark session, in its own process and JVM
  (the same settings for all, so each pays the JVM's warm-up and code generation once), the cases
  in turn ``--cold-rounds`` times; the median of each; the session's start is not counted and is
  printed apart;
* warm: all cases on one session (the same session), one round to warm it, then ``--rounds``
  rounds in turn; the median of each.

Beside the seconds, the CPU seconds of the process and its Spark JVM (``local[2]`` runs the
executors in it): on a machine shared with other work, wall-clock ratios move from run to run;
CPU seconds much less.

Then the demo's latency from enqueue to aggregate: ``produce --rate 50``, ``runworkers --count 3
--handler workers.landing.LandingHandler`` and ``runpipeline --master local[1]`` (5 s trigger, as
``serve`` starts it) as real processes on a throw-away database for ``--latency-seconds`` after
the pipeline's first batch; per committed batch, the time from the enqueueing of its newest and
of its oldest event to its commit. The page shows a commit within its poll interval (3 s) more.

Prints one table. Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django.setup()

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.dataset as ds  # noqa: E402
from django.core.management import call_command  # noqa: E402

from tests.benchmarks.size import size as sized  # noqa: E402  (main has a size of its own)
from workers.landing import ARROW_SCHEMA, MAX_EVENTS, file_name, write_atomically  # noqa: E402
from workers.sensors import SENSORS  # noqa: E402

HUB = "bench"
PARTITIONS = 16
HOMES = np.array([f"home-{i:05d}" for i in range(1000)])
KINDS = list(SENSORS)
T0 = 1_767_225_600.0


def synthetic(partition_id: str, first: int, count: int, rng: np.random.Generator, span: float) -> pa.Table:
    """``count`` landed events of one partition from sequence number ``first``, spread over ``span`` s."""
    weights = np.array([SENSORS[k][0] for k in KINDS], dtype=float)
    kinds = rng.choice(len(KINDS), size=count, p=weights / weights.sum())
    sensor = np.array(KINDS)[kinds]
    opened = rng.random(count) < 0.5
    event = np.where(
        np.isin(sensor, ["door", "window"]),
        np.where(opened, "opened", "closed"),
        np.where(np.isin(sensor, ["glass_break"]) | opened, "detected", "cleared"),
    )
    sequence = np.arange(first, first + count, dtype=np.int64)
    seconds = T0 + rng.random(count) * span
    micros = pa.array((seconds * 1e6).astype(np.int64), pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    columns = {
        "partition_id": pa.array(np.full(count, partition_id)),
        "sequence_number": pa.array(sequence),
        "offset": pa.array((sequence * 120).astype(str)),
        "enqueued_time": micros,
        "partition_key": pa.nulls(count, pa.string()),
        "event_id": pa.array(np.char.add(f"{partition_id}-", sequence.astype(str))),
        "home": pa.array(HOMES[rng.integers(0, len(HOMES), count)]),
        "sensor": pa.array(sensor),
        "sensor_id": pa.array(np.char.add(sensor, "-1")),
        "event": pa.array(event),
        "armed": pa.array(rng.random(count) < 0.3),
        "event_time": micros,
    }
    return pa.Table.from_pydict(columns, schema=ARROW_SCHEMA)


def land(root: Path, events: int) -> tuple[int, float]:
    """Land ``events`` events under ``root``/HUB; (files written, seconds)."""
    rng = np.random.default_rng(7)
    per_partition = events // PARTITIONS
    files = 0
    started = time.perf_counter()
    for p in range(PARTITIONS):
        for first in range(0, per_partition, MAX_EVENTS):
            count = min(MAX_EVENTS, per_partition - first)
            table = synthetic(str(p), first, count, rng, 3600.0)
            write_atomically(root / HUB / str(p), file_name(first, first + count - 1), table)
            files += 1
    return files, time.perf_counter() - started


def pyarrow_scan(folder: Path) -> tuple[int, float]:
    started = time.perf_counter()
    table = ds.dataset(folder, format="parquet").to_table()
    return table.num_rows, time.perf_counter() - started


def pyarrow_aggregate(folder: Path) -> tuple[int, float]:
    started = time.perf_counter()
    table = ds.dataset(folder, format="parquet").to_table(columns=["home", "sensor", "event_time"])
    table = table.append_column("minute", pc.floor_temporal(table["event_time"], unit="minute"))
    counts = table.group_by(["home", "minute", "sensor"]).aggregate([([], "count_all")])
    assert pc.sum(counts["count_all"]).as_py() == table.num_rows
    return table.num_rows, time.perf_counter() - started


def database(root: Path) -> str:
    """A migrated throw-away SQLite database for the summary; its alias."""
    from tests.support.databases import add_django_database

    alias = f"bench_pipeline_{os.getpid()}_{time.monotonic_ns()}"
    add_django_database(
        alias,
        f"sqlite:///{root / 'bench.sqlite3'}",
        timeout=20,
        init_command="PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        transaction_mode="IMMEDIATE",
    )
    call_command("migrate", database=alias, verbosity=0)
    return alias


def spark_run(root: Path, run: str, alias: str) -> tuple[int, float, float, float]:
    """The job over the landing from a fresh checkpoint; (events counted, seconds, trigger s, write s)."""
    from workers.models import CountedRange, PipelineBatch
    from workers.pipeline.job import Paths, PipelineJob
    from workers.pipeline.spark import build_session

    spark = build_session("local[2]", "leaseboard-bench")
    paths = Paths.for_hub(HUB, root, root.parent / f"pipeline-{run}")
    CountedRange.objects.using(alias).filter(hub=HUB).delete()  # a fresh start: nothing counted yet
    job = PipelineJob(spark, HUB, paths, database=alias)
    started = time.perf_counter()
    query = job.start(once=True)
    query.awaitTermination()
    seconds = time.perf_counter() - started
    job.record_progress(query)
    batches = list(PipelineBatch.objects.using(alias).filter(query_id=str(query.id)))
    trigger = sum(b.duration_seconds or 0.0 for b in batches)
    write = sum(b.write_seconds for b in batches)
    return sum(b.events for b in batches), seconds, trigger, write


CASES = {
    "batch": "Spark batch: read, count, write",
    "dedupe": "Spark batch + dropDuplicates",
    "job": "the job (runpipeline --once, minus the command)",
}
# The cases measured cold, each in a JVM of its own; the tiny run starts one (the job's), not three.
# The tiny run also leaves out the demo's latency (three processes and a streaming JVM waiting for
# its first batch: minutes on a busy machine); tests/pipeline/test_end_to_end.py runs that chain.
COLD = sized(tuple(CASES), ("job",))


def cpu_seconds(spark: Any) -> float:
    """CPU seconds used so far by this process and its Spark JVM (in ``local[2]`` the executors are
    in it): what a case costs whatever else the machine runs, where wall-clock seconds are not."""
    pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    jvm = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    own = os.times()
    return jvm + own.user + own.system


def run_case(case: str, root: Path, alias: str, tag: str) -> dict[str, float]:
    """One run of ``case`` over ``root``/landing on this process's session: its figures (``cpu``: CPU
    seconds of this process and its JVM)."""
    from workers.pipeline.spark import build_session

    spark = build_session("local[2]", "leaseboard-bench")
    before = cpu_seconds(spark)
    if case == "job":
        counted, seconds, trigger, write = spark_run(root / "landing", tag, alias)
        figures = {"seconds": seconds, "events": counted, "trigger": trigger, "write": write}
    else:
        out = root / f"batch-{case}-{tag}"
        figures = {"seconds": spark_batch(spark, root / "landing" / HUB, out, case == "dedupe")}
    return {**figures, "cpu": cpu_seconds(spark) - before}


def cold_case(case: str, root: Path) -> dict[str, float]:
    """``case`` as the first query of a new session in a new process (its own JVM): its figures and
    ``session``, the seconds its session took to start."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.bench_pipeline", "--cold-case", case, "--root", str(root)],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"cold case {case} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return dict(json.loads(lines[-1]))


def cold_main(case: str, root: Path) -> None:
    """The child of ``cold_case``: start a session, run ``case`` once, print its figures as JSON."""
    from workers.pipeline.spark import build_session

    logging.getLogger("leaseboard").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        alias = database(Path(tmp)) if case == "job" else "default"
        started = time.perf_counter()
        build_session("local[2]", "leaseboard-bench")
        session = time.perf_counter() - started
        figures = run_case(case, root, alias, f"cold-{os.getpid()}")
    print(json.dumps({**figures, "session": session}), flush=True)


def flat_run(events: int, alias: str) -> None:
    """``events`` landed, then the job in batches of about 1 M events each (``maxFilesPerTrigger``):
    the per-batch time, first batches against last ones, should not grow with what was counted
    (counted ranges) or landed (cleanSource keeps the listing small)."""
    from workers.models import PipelineBatch
    from workers.pipeline import summary
    from workers.pipeline.job import Paths, PipelineJob
    from workers.pipeline.spark import build_session

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files, _ = land(root / "landing", events)
        per_batch = round(files / max(events / 1_000_000, 1))
        spark = build_session("local[2]", "leaseboard-bench")
        paths = Paths.for_hub(HUB, root / "landing", root / "pipeline")
        job = PipelineJob(spark, HUB, paths, database=alias, max_files=per_batch)
        query = job.start(once=True)
        query.awaitTermination()
        job.record_progress(query)
        rows = list(PipelineBatch.objects.using(alias).filter(query_id=str(query.id)).order_by("batch_id"))
        assert sum(b.events for b in rows) == events // PARTITIONS * PARTITIONS
        left = len(list(paths.landing.rglob("*.parquet")))
        state = summary.counted_ranges(HUB, alias)
    print(f"{events:,} events, {files} files, {per_batch} files per batch: seconds per batch (trigger / foreachBatch)")
    for b in rows:
        print(f"  batch {b.batch_id:>3}: {b.events:>9,} events {b.duration_seconds or 0:>7.2f} {b.write_seconds:>7.2f}")
    # The first batch is also the session's first query (the JIT compiles while it runs): compared
    # apart, so a trend in the others is what the state or the listing would add.
    warm = rows[1:]
    first, last = warm[: len(warm) // 2], warm[len(warm) // 2 :]
    if not first:
        return  # two batches at most: nothing to compare
    print(
        f"  median trigger, batches 1-{first[-1].batch_id} / {last[0].batch_id}-{last[-1].batch_id}: "
        f"{statistics.median(b.duration_seconds or 0 for b in first):.2f}"
        f" / {statistics.median(b.duration_seconds or 0 for b in last):.2f} s (batch 0, cold: "
        f"{rows[0].duration_seconds or 0:.2f} s); landing files left: {left}; "
        f"state: {sum(len(v) for v in state.values())} intervals"
    )


def spark_batch(spark: Any, folder: Path, out: Path, dedupe: bool) -> float:
    """Spark's own batch over the landing: read, (dropDuplicates,) count per home/minute/sensor, write; seconds."""
    from workers.pipeline import transforms
    from workers.pipeline.schema import KEY, LANDING

    started = time.perf_counter()
    events = spark.read.schema(LANDING).option("recursiveFileLookup", "true").parquet(str(folder))
    if dedupe:
        events = events.dropDuplicates(KEY)
    transforms.per_home_minute_sensor(events).write.mode("overwrite").parquet(str(out))
    return time.perf_counter() - started


def demo_latency(seconds: float) -> list[tuple[float, float]]:
    """(newest event's, oldest event's) seconds from enqueued to committed, per batch of a demo-like run."""
    from tests.support.databases import add_django_database, remove_django_database
    from workers.models import PipelineBatch
    from workers.pipeline.launcher import start_pipeline, stop_pipeline

    manage = Path(__file__).resolve().parents[2] / "manage.py"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = {
            **os.environ,
            "DATABASE_URL": f"sqlite:///{root / 'db.sqlite3'}",
            "LEASEBOARD_VAR_DIR": str(root / "var"),
            "LEASEBOARD_HUB_DIR": str(root / "hub"),
            "LEASEBOARD_LOG_LEVEL": "WARNING",
        }
        subprocess.run([sys.executable, str(manage), "migrate", "--noinput", "-v", "0"], env=env, check=True)
        alias = f"bench_latency_{os.getpid()}"
        add_django_database(alias, env["DATABASE_URL"], timeout=20)
        out = (root / "demo.log").open("ab")
        processes = [
            subprocess.Popen([sys.executable, str(manage), "produce", "--rate", "50"], env=env, stdout=out, stderr=out)
        ]
        time.sleep(1.0)  # the producer creates the hub
        processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(manage),
                    "runworkers",
                    "--count",
                    "3",
                    "--handler",
                    "workers.landing.LandingHandler",
                ],
                env=env,
                stdout=out,
                stderr=out,
            )
        )
        pipeline = start_pipeline("sensors", root / "pipeline.log", env=env)
        try:
            deadline = time.monotonic() + 180
            batches = PipelineBatch.objects.using(alias)
            while not batches.exists():
                if time.monotonic() > deadline or pipeline.poll() is not None:
                    raise RuntimeError("no pipeline batch in 180 s:\n" + (root / "pipeline.log").read_text()[-2000:])
                time.sleep(1.0)
            warm = batches.order_by("-batch_id")[0].batch_id  # the first batches carry the start-up's backlog
            time.sleep(seconds)
            rows = list(batches.filter(batch_id__gt=warm))
        finally:
            stop_pipeline(pipeline)
            for process in processes:
                process.terminate()
                process.wait(30)
            out.close()
            remove_django_database(alias)
        return [(b.as_json()["latency_seconds"], b.as_json()["max_latency_seconds"]) for b in rows]


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1] if len(values) > 1 else values[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=sized(1_000_000, 16_000), help="events to land (default 1000000)")
    parser.add_argument(
        "--latency-seconds",
        type=float,
        default=sized(45.0, 0.0),
        help="seconds to measure the demo's latency after its first batch (default 45; 0: skip)",
    )
    parser.add_argument("--rounds", type=int, default=sized(3, 1), help="warm rounds, after a first one (default 3)")
    parser.add_argument("--cold-rounds", type=int, default=sized(2, 1), help="cold runs of each case (default 2)")
    parser.add_argument("--cold-case", choices=sorted(CASES), help=argparse.SUPPRESS)  # cold_case's child
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--flat-events",
        type=int,
        default=0,
        help="also land this many events and run the job 1 M events a batch (10000000: per-batch "
        "time from 1 M to 10 M; default 0: skip)",
    )
    args = parser.parse_args(argv or [])
    logging.getLogger("leaseboard").setLevel(logging.WARNING)
    if args.cold_case:
        cold_main(args.cold_case, args.root)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files, landing_seconds = land(root / "landing", args.events)
        folder = root / "landing" / HUB
        size = sum(p.stat().st_size for p in folder.rglob("*.parquet"))
        events = args.events // PARTITIONS * PARTITIONS
        print(
            f"{events:,} events in {files} landing files ({size / 1e6:.1f} MB), {PARTITIONS} partitions; "
            f"{os.cpu_count()} cores"
        )
        print(f"{'case':<62} {'seconds':>8} {'events/s':>11} {'CPU s':>7}")

        def row(title: str, seconds: float, cpu: float | None = None) -> None:
            used = "" if cpu is None else f" {cpu:>7.2f}"
            print(f"{title:<62} {seconds:>8.2f} {events / seconds:>11,.0f}{used}", flush=True)

        row("landing: write the files durably (pyarrow, fsync, rename)", landing_seconds)
        rows, seconds = pyarrow_scan(folder)
        assert rows == events
        row("floor: pyarrow scan of every column", seconds)
        rows, seconds = pyarrow_aggregate(folder)
        row("pyarrow scan + count per home/minute/sensor (no dedupe)", seconds)

        # Cold: each case the first query of its own new session (own process and JVM), in turn.
        runs: dict[str, list[dict[str, float]]] = {case: [] for case in COLD}
        for _ in range(args.cold_rounds):
            for case in COLD:
                runs[case].append(cold_case(case, root))
        assert all(f["events"] == events for f in runs["job"]), "the job did not count every event once"
        cold = {case: {key: statistics.median(f[key] for f in runs[case]) for key in runs[case][0]} for case in COLD}
        start = statistics.median(c["session"] for c in cold.values())
        print(
            f"cold: each case the first query of a new Spark session in its own JVM, local[2], median of "
            f"{args.cold_rounds} (session start apart: {start:.2f} s)"
        )
        for case, title in CASES.items():
            if case in cold:
                row(f"  {title}", cold[case]["seconds"], cold[case]["cpu"])
        print(
            f"{'    of which Spark trigger / foreachBatch writes':<62} {cold['job']['trigger']:>8.2f} "
            f"{cold['job']['write']:>11.2f}"
        )

        # Warm: one session for every case, a first round to warm it, then rounds in turn.
        alias = database(root)
        from workers.pipeline.spark import build_session

        build_session("local[2]", "leaseboard-bench")
        warm: dict[str, list[dict[str, float]]] = {case: [] for case in CASES}
        for n in range(args.rounds + 1):
            for case in CASES:
                figures = run_case(case, root, alias, f"warm-{n}")
                if case == "job":
                    assert figures["events"] == events, f"the job counted {figures['events']} events, not {events}"
                if n:
                    warm[case].append(figures)
        print(f"warm: one Spark session for every case, after a first round; median of {args.rounds} rounds")

        def median(case: str, key: str = "seconds") -> float:
            return statistics.median(f[key] for f in warm[case])

        for case, title in CASES.items():
            row(f"  {title}", median(case), median(case, "cpu"))
        print(
            f"{'    of which Spark trigger / foreachBatch writes':<62} {median('job', 'trigger'):>8.2f} "
            f"{median('job', 'write'):>11.2f}"
        )
        compared = [("warm", median("job"), median("dedupe"), median("job", "cpu"), median("dedupe", "cpu"))]
        if "dedupe" in cold:
            job, dedupe = cold["job"], cold["dedupe"]
            compared.insert(0, ("cold", job["seconds"], dedupe["seconds"], job["cpu"], dedupe["cpu"]))
        for label, job_s, dedupe_s, job_cpu, dedupe_cpu in compared:
            print(
                f"  the job, {label}: {100 * dedupe_s / job_s:.0f} % of Spark batch + dropDuplicates ({label}) in "
                f"events/s; {100 * dedupe_cpu / job_cpu:.0f} % in events per CPU second"
            )
        for label, done in (("cold", runs), ("warm", warm)):
            listed = {case: ", ".join(f"{f['seconds']:.2f}" for f in done.get(case, [])) for case in ("job", "dedupe")}
            print(f"  ({label} runs, seconds: the job {listed['job']}; batch + dropDuplicates {listed['dedupe']})")

        if args.flat_events:
            from workers.models import CountedRange

            CountedRange.objects.using(alias).filter(hub=HUB).delete()
            flat_run(args.flat_events, alias)

    if args.latency_seconds > 0:
        latencies = demo_latency(args.latency_seconds)
        if not latencies:
            print("demo latency: no batch committed in the measured time")
            return
        newest = [a for a, _ in latencies]
        oldest = [b for _, b in latencies]
        print(
            f"demo (50 events/s, 3 workers, pipeline local[1], 5 s trigger): {len(latencies)} batches in "
            f"{args.latency_seconds:g} s; seconds from enqueue to committed aggregate:"
        )
        print(f"{'  newest event of a batch: median / p95':<62} {statistics.median(newest):>8.2f} {p95(newest):>11.2f}")
        print(f"{'  oldest event of a batch: median / p95':<62} {statistics.median(oldest):>8.2f} {p95(oldest):>11.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
