"""What an idle fleet costs, by size (`make bench`): real ``runworkers`` processes on PostgreSQL and Redis.

Per store and size (64 partitions / 8 workers, 256 / 16, 1024 / 64; one ``runworkers --count 1``
process per worker, an embedded hub, interval 2 s, expiry 10 s, no events): seconds from the last
process started until the fleet is balanced (every partition held, every worker within one of its
share) and from the moment every worker had announced itself (all up: balancing without the starts),
seconds from one process's SIGKILL until the survivors are balanced again, and over a
window of idle steady state: store queries a second (PostgreSQL: ``pg_stat_statements`` calls, and
the rows they returned or touched; Redis: ``INFO commandstats`` calls), CPU per worker process and
of the whole fleet (percent of one core, from ``/proc``), CPU of the store's server, RSS per
process, and from the workers' own Prometheus metrics (multi-process mode, one directory per fleet):
ownership records read per worker cycle (``leaseboard_ownership_rows_read_total`` over the cycles
counted; "-" for workers too old to count them) and the cycle time's p50 and p95 (interpolated within
the buckets of ``leaseboard_cycle_duration_seconds``, as ``histogram_quantile`` does). The figures
are drawn as a PNG (matplotlib) beside the table; its path is printed.

``--baseline DIR`` runs every case a second time with the workers of another checkout (a ``git
worktree`` of an older commit), one after the other in the same run, so "before" and "after" share
the machine's load. A first section measures the pumps alone in this process: CPU of idle pumps
and the latency from an append to the handler, with the readers' wake-ups and with the 50 ms poll
that pumps used before (a reader that hides ``notify``).

Smaller: ``python -m tests.benchmarks.bench_fleet_cost --sizes 64/8,256/16 --store postgresql``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.benchmarks.django_env import temporary_django
from tests.benchmarks.size import size, tiny
from workers.sources.base import Position

SIZES = size(((64, 8), (256, 16), (1024, 64)), ((8, 2),))
# The tiny run (make test) cycles faster: its kill is balanced again in seconds, not one 10 s expiry.
INTERVAL, EXPIRY = size((2.0, 10.0), (0.5, 3.0))
WINDOW = size(20.0, 2.0)  # seconds of idle steady state measured
SETTLE = 2 * INTERVAL  # after balancing, before the window
BALANCE_TIMEOUT = 300.0
ROOT = Path(__file__).resolve().parents[2]
TICKS = os.sysconf("SC_CLK_TCK")
POSTGRES_SETTINGS = {
    "max_connections": "500",
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "top",
}


@dataclass
class Row:
    store: str
    code: str  # "after" (this checkout) or "before" (--baseline)
    partitions: int
    workers: int
    balance_cold: float | None = None
    balance_up: float | None = None  # from the moment every worker had announced itself (all processes up)
    balance_kill: float | None = None
    queries: float | None = None  # store calls a second, whole fleet
    rows: float | None = None  # rows a second (PostgreSQL)
    cpu_worker: float | None = None  # % of a core, mean per worker process
    cpu_fleet: float | None = None  # % of a core, all worker processes
    cpu_store: float | None = None  # % of a core, the store's server
    rss: float | None = None  # MB, mean per worker process
    rows_per_cycle: float | None = None  # ownership records read per worker cycle
    cycle_p50: float | None = None  # ms
    cycle_p95: float | None = None  # ms
    cycles: float | None = None  # worker cycles a second, whole fleet
    error: str = ""
    note: str = ""


# /proc --------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree(pid: int) -> list[int]:
    """``pid`` and its children (a PostgreSQL server's backends)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


# stores --------------------------------------------------------------------------------------------


class Meter:
    """The store's own count of calls (and rows) so far, and the pid of its server."""

    def __init__(self, kit: Any) -> None:
        self.kit = kit
        if kit.name == "postgresql":
            import psycopg

            self._conn = psycopg.connect(kit.database_url, autocommit=True)
            self._conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            self.server_pid = kit.cluster.process.pid
        else:
            import redis

            self._redis = redis.Redis.from_url(kit.server.url)
            self.server_pid = kit.server.process.pid

    def counts(self) -> tuple[float, float | None]:
        if self.kit.name == "postgresql":
            row = self._conn.execute(
                "SELECT coalesce(sum(calls), 0), coalesce(sum(rows), 0) FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND query NOT ILIKE '%pg_stat_statements%'"
            ).fetchone()
            assert row is not None
            return float(row[0]), float(row[1])
        stats = self._redis.info("commandstats")
        return float(sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")), None

    def close(self) -> None:
        if self.kit.name == "postgresql":
            self._conn.close()
        else:
            self._redis.close()


@dataclass
class Cycles:
    """The workers' cycle metrics summed over their processes (Prometheus multi-process files)."""

    buckets: dict[float, float]  # upper bound -> cumulative count
    count: float
    rows: float | None

    @classmethod
    def read(cls, path: Path) -> Cycles:
        from prometheus_client import CollectorRegistry, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(path))
        buckets: dict[float, float] = {}
        count, rows = 0.0, None
        for family in registry.collect():
            for sample in family.samples:
                if sample.name == "leaseboard_cycle_duration_seconds_bucket":
                    bound = float(sample.labels["le"])
                    buckets[bound] = buckets.get(bound, 0.0) + sample.value
                elif sample.name == "leaseboard_cycle_duration_seconds_count":
                    count += sample.value
                elif sample.name == "leaseboard_ownership_rows_read_total":
                    rows = (rows or 0.0) + sample.value
        return cls(buckets, count, rows)

    def since(self, before: Cycles) -> Cycles:
        rows = None if self.rows is None or before.rows is None else self.rows - before.rows
        buckets = {b: c - before.buckets.get(b, 0.0) for b, c in self.buckets.items()}
        return Cycles(buckets, self.count - before.count, rows)

    def quantile(self, q: float) -> float | None:
        """Seconds, interpolated linearly within the bucket the quantile falls in."""
        if self.count <= 0:
            return None
        target, lower, below = q * self.count, 0.0, 0.0
        for bound in sorted(self.buckets):
            cumulative = self.buckets[bound]
            if cumulative >= target:
                if math.isinf(bound):
                    return lower
                share = (target - below) / (cumulative - below) if cumulative > below else 1.0
                return lower + (bound - lower) * share
            lower, below = bound, cumulative
        return lower


def make_kit(store: str, cluster: Any, database_url: str) -> Any:
    from tests.chaos.stores import RedisKit, SqlKit

    return SqlKit(cluster, database_url) if store == "postgresql" else RedisKit(database_url)


# one fleet -------------------------------------------------------------------------------------


@dataclass
class Fleet:
    kit: Any
    root: Path
    repo: Path
    partitions: int
    workers: int
    hub_name: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def metrics_dir(self) -> Path:
        return self.root / "metrics"

    def start(self) -> None:
        from tests.support.processes import manage, worker_env

        env = worker_env(self.root, **self.kit.env(), LEASEBOARD_DEADLETTER_DIR=str(self.root / "deadletter"))
        self.metrics_dir.mkdir(exist_ok=True)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(self.metrics_dir)
        env.pop("LEASEBOARD_CLOCK_SKEW", None)
        env["PYTHONPATH"] = str(self.repo)
        # Workers as deployed: the dev settings' DEBUG keeps and formats every SQL statement a worker
        # sends (Django's query log), work a fleet on dashboard.production does not do.
        env["DJANGO_DEBUG"] = "0"
        for i in range(self.workers):
            name = f"w{i:03d}"
            command = manage(
                "runworkers",
                "--count",
                "1",
                "--owner-prefix",
                name,
                "--store",
                self.kit.store,
                "--source",
                "embedded",
                "--hub",
                self.hub_name,
                "--interval",
                str(INTERVAL),
                "--expiry",
                str(EXPIRY),
                "--shutdown-timeout",
                "5",
            )
            with (self.root / f"{name}.log").open("ab") as out:
                self.processes[f"{name}-0"] = subprocess.Popen(
                    command, cwd=self.repo, env=env, stdout=out, stderr=subprocess.STDOUT
                )

    def check(self) -> None:
        for owner, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.root / f"{owner[:-2]}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{owner} exited with {process.returncode}:\n{tail}")

    def kill_one(self) -> str:
        owner = sorted(self.processes)[0]
        process = self.processes.pop(owner)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        return owner

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
            if process.poll() is None:
                process.kill()
                process.wait(10)


def balanced(records: list[Any], now: float, partitions: int, owners: set[str]) -> bool:
    live = [r for r in records if r.owner_id and not r.expired(now, EXPIRY)]
    if len(live) != partitions:
        return False
    counts = Counter(r.owner_id for r in live)
    low, high = partitions // len(owners), -(-partitions // len(owners))
    return set(counts) == owners and all(low <= c <= high for c in counts.values())


async def until_balanced(store: Any, ref: Any, fleet: Fleet, started: float, row: Row | None = None) -> float:
    """Seconds from ``started`` until the fleet is balanced; with ``row``, also sets ``row.balance_up``:
    seconds from the first poll that found every worker announced (a member record each: every process
    up, past Django's start and its first cycle) to balanced, which is what balancing itself takes."""
    owners = set(fleet.processes)
    up: float | None = None
    while True:
        fleet.check()
        if row is not None and up is None and owners <= {m.owner_id for m in await store.list_members(ref)}:
            up = time.monotonic()
        records = await store.list_ownership(ref)
        if balanced(records, await store.now(), fleet.partitions, owners):
            if row is not None and up is not None:
                row.balance_up = time.monotonic() - up
            return time.monotonic() - started
        if time.monotonic() - started > BALANCE_TIMEOUT:
            raise TimeoutError(f"not balanced after {BALANCE_TIMEOUT:g}s")
        await asyncio.sleep(0.25)


async def measure(kit: Any, meter: Meter, row: Row, repo: Path, root: Path, window: float) -> None:
    from balancer.model import HubRef
    from workers.hub.embedded import EmbeddedHub

    hub_name = f"fleet-{row.code}-{row.partitions}-{row.workers}"
    ref = HubRef("localhost", hub_name, "$Default")
    EmbeddedHub(root / "hub", hub_name, partitions=row.partitions).close()
    store = await kit.open()
    fleet = Fleet(kit, root, repo, row.partitions, row.workers, hub_name)
    try:
        fleet.start()
        row.balance_cold = await until_balanced(store, ref, fleet, time.monotonic(), row)
        await asyncio.sleep(SETTLE)
        pids = [p.pid for p in fleet.processes.values()]
        server = tree(meter.server_pid)
        cycles0 = Cycles.read(fleet.metrics_dir)
        cpu0, store0, (calls0, rows0), t0 = (
            sum(map(cpu_seconds, pids)),
            sum(map(cpu_seconds, server)),
            meter.counts(),
            time.monotonic(),
        )
        await asyncio.sleep(window)
        fleet.check()
        server = [p for p in tree(meter.server_pid) if p in set(server)]  # backends alive through the window
        cpu1, store1, (calls1, rows1), t1 = (
            sum(map(cpu_seconds, pids)),
            sum(map(cpu_seconds, server)),
            meter.counts(),
            time.monotonic(),
        )
        seconds = t1 - t0
        row.cpu_fleet = 100 * (cpu1 - cpu0) / seconds
        row.cpu_worker = row.cpu_fleet / len(pids)
        row.cpu_store = 100 * (store1 - store0) / seconds
        row.queries = (calls1 - calls0) / seconds
        row.rows = None if rows0 is None or rows1 is None else (rows1 - rows0) / seconds
        row.rss = statistics.mean(rss_mb(p) for p in pids)
        cycles = Cycles.read(fleet.metrics_dir).since(cycles0)
        row.cycles = cycles.count / seconds
        if cycles.count:
            row.rows_per_cycle = None if cycles.rows is None else cycles.rows / cycles.count
            p50, p95 = cycles.quantile(0.5), cycles.quantile(0.95)
            row.cycle_p50 = None if p50 is None else 1000 * p50
            row.cycle_p95 = None if p95 is None else 1000 * p95
        logs = [(root / f"{owner[:-2]}.log").read_text(errors="replace") for owner in fleet.processes]
        if polled := sum("inotify unavailable" in text for text in logs):
            row.note = f"{polled} of {len(pids)} processes had no inotify (the per-user limit?): their pumps polled"
        fleet.kill_one()
        row.balance_kill = await until_balanced(store, ref, fleet, time.monotonic())
    finally:
        fleet.stop()
        await kit.close(store)


def run_store(store: str, cases: list[Row], repos: dict[str, Path], tmp: Path, window: float) -> None:
    """Every case of one store, on one server (each case on a hub of its own)."""
    from tests.chaos.stores import DASHBOARD_ALIAS, migrated_database
    from tests.support.databases import remove_django_database
    from tests.support.postgres import start_postgres

    cluster = start_postgres(POSTGRES_SETTINGS)
    try:
        kit = make_kit(store, cluster, migrated_database(cluster))
        try:
            meter = Meter(kit)
            try:
                for row in cases:
                    root = tmp / f"{store}-{row.code}-{row.partitions}"
                    root.mkdir()
                    try:
                        asyncio.run(measure(kit, meter, row, repos[row.code], root, window))
                    except Exception as exc:  # one case failing must not hide the others
                        first = str(exc).splitlines()[0] if str(exc) else ""
                        row.error = f"{type(exc).__name__}: {first[:200]}"
                    print(line(row) + (f"\n  note: {row.note}" if row.note else ""), flush=True)
            finally:
                meter.close()
        finally:
            getattr(kit, "finish", lambda: None)()
            server = getattr(kit, "server", None)
            if server is not None:
                server.stop()
    finally:
        remove_django_database(DASHBOARD_ALIAS)
        cluster.stop()


# pumps alone, in this process ------------------------------------------------------------------


class _Polled:
    """A source whose readers hide ``notify``: its pumps poll every 50 ms, as every pump did before."""

    def __init__(self, source: Any) -> None:
        self._source = source

    def reader(self, partition_id: str, position: Any) -> Any:
        inner = self._source.reader(partition_id, position)

        class Reader:
            receive = inner.receive
            close = inner.close

        return Reader()


async def pumps_alone(
    source: Any, writer: Any, pumps: int, seconds: float, notified: bool, settle: float = 2.0
) -> tuple[float, float, float]:
    """(CPU % of a core of this process with ``pumps`` idle pumps on ``source``, p50 and p99 ms from an
    append to ``writer`` (the embedded hub behind ``source``) to the handler)."""
    from balancer.model import HubRef, OwnershipRecord
    from balancer.stores.memory import MemoryStore
    from workers.runtime.config import PumpConfig
    from workers.runtime.deadletters import DeadLetters
    from workers.runtime.pump import PartitionPump

    ref = HubRef("localhost", "alone", "$Default")
    store = MemoryStore()
    await store.claim_ownership([OwnershipRecord(ref, str(p), "w") for p in range(pumps)])
    latencies: list[float] = []

    def handler(event: Any, ctx: Any) -> None:
        latencies.append(time.time() - event.enqueued_time)

    polled: Any = source if notified else _Polled(source)
    running = []
    for p in range(pumps):
        pump = PartitionPump(
            ref=ref,
            partition_id=str(p),
            owner_id="w",
            holds=lambda pid: True,
            checkpoints=store,
            source=polled,
            handler=handler,
            config=PumpConfig(dead_letter_dir=None, initial_position=Position(latest=True)),
            dead_letters=DeadLetters(None),
        )
        running.append((pump, asyncio.create_task(pump.run())))
    await asyncio.sleep(settle)  # readers open (over AMQP: every receiver attached)
    cpu0, t0 = time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    cpu = 100 * (time.process_time() - cpu0) / (time.monotonic() - t0)
    rng = random.Random(1)
    for _ in range(100):
        writer.send(b"{}", partition_id=str(rng.randrange(pumps)))
        await asyncio.sleep(0.02)
    deadline = time.monotonic() + 10
    while len(latencies) < 100 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for pump, _ in running:
        pump.stop()
    await asyncio.gather(*(task for _, task in running))
    ms = sorted(x * 1000 for x in latencies) or [math.nan]
    return cpu, statistics.median(ms), ms[min(len(ms) - 1, int(len(ms) * 0.99))]


def pumps_section(pumps: int, amqp_pumps: int, tmp: Path) -> None:
    """Idle pumps alone in this process, polled (before) and woken (after): the embedded hub's files,
    then the Event Hubs source over AMQP (``runhub``), where the SDK's receive is the long poll."""
    from tests.benchmarks.bench_amqp import HUB, start_runhub
    from workers.hub.embedded import EmbeddedHub
    from workers.sources.eventhubs import EventHubsSource

    logging.getLogger("leaseboard.pump").setLevel(logging.WARNING)  # a line per pump stopped otherwise
    seconds = size(5.0, 1.0)
    print(f"pumps alone in this process: CPU over {seconds:g}s idle, then 100 appends 20 ms apart")
    if pumps:
        for notified in (False, True):
            with EmbeddedHub(tmp / "alone", f"alone-{notified}", partitions=pumps) as hub:
                cpu, p50, p99 = asyncio.run(pumps_alone(hub, hub, pumps, seconds, notified))
            how = "woken (after)" if notified else "polled every 50 ms (before)"
            print(
                f"  embedded hub, {pumps} pumps, {how:<28} CPU {cpu:6.1f} % of a core; append to handler "
                f"p50 {p50:6.1f} ms, p99 {p99:6.1f} ms",
                flush=True,
            )
    if amqp_pumps:
        runhub = start_runhub(tmp / "amqp", amqp_pumps)
        try:
            for notified in (False, True):
                with (
                    EventHubsSource(HUB, connection_string=runhub.connection_string) as source,
                    EmbeddedHub(runhub.hub_dir, HUB) as writer,
                ):
                    cpu, p50, p99 = asyncio.run(pumps_alone(source, writer, amqp_pumps, seconds, notified, 6.0))
                how = "woken (after)" if notified else "polled every 50 ms (before)"
                print(
                    f"  AMQP (runhub), {amqp_pumps} pumps, {how:<28} CPU {cpu:6.1f} % of a core; append to "
                    f"handler p50 {p50:6.1f} ms, p99 {p99:6.1f} ms",
                    flush=True,
                )
        finally:
            runhub.process.terminate()
            runhub.process.wait(10)


# output ---------------------------------------------------------------------------------------------

HEADER = (
    f"{'store':<10} {'code':<6} {'size':>8}  {'balance s':>9}  {'all up s':>8}  {'after kill s':>12}  "
    f"{'queries/s':>9}  {'rows/s':>8}  {'CPU/worker %':>12}  {'fleet CPU %':>11}  {'store CPU %':>11}  {'RSS MB':>6}  "
    f"{'rows/cycle':>10}  {'cycle p50 ms':>12}  {'cycle p95 ms':>12}  {'cycles/s':>8}"
)


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def line(row: Row) -> str:
    size = f"{row.partitions}/{row.workers}"
    if row.error:
        return f"{row.store:<10} {row.code:<6} {size:>8}  FAILED: {row.error}"
    return (
        f"{row.store:<10} {row.code:<6} {size:>8}  {_f(row.balance_cold, '.1f'):>9}  {_f(row.balance_up, '.1f'):>8}  "
        f"{_f(row.balance_kill, '.1f'):>12}  "
        f"{_f(row.queries, '.0f'):>9}  {_f(row.rows, '.0f'):>8}  {_f(row.cpu_worker, '.2f'):>12}  "
        f"{_f(row.cpu_fleet, '.1f'):>11}  {_f(row.cpu_store, '.1f'):>11}  {_f(row.rss, '.0f'):>6}  "
        f"{_f(row.rows_per_cycle, '.1f'):>10}  {_f(row.cycle_p50, '.1f'):>12}  {_f(row.cycle_p95, '.1f'):>12}  "
        f"{_f(row.cycles, '.1f'):>8}"
    )


def chart(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (
            "seconds to balance\n(from the last start: solid; after a SIGKILL: dashed; after all were up: dotted)",
            ("balance_cold", "balance_kill", "balance_up"),
        ),
        ("store queries a second", ("queries",)),
        ("idle CPU, % of one core (fleet: solid, per worker: dashed)", ("cpu_fleet", "cpu_worker")),
        ("RSS per worker process, MB", ("rss",)),
        ("ownership records read per worker cycle", ("rows_per_cycle",)),
        ("cycle time, ms (p95: solid, p50: dashed)", ("cycle_p95", "cycle_p50")),
    ]
    fig, axes = plt.subplots(3, 2, figsize=(12, 12))
    series = sorted({(r.store, r.code) for r in rows if not r.error})
    sizes = sorted({(r.partitions, r.workers) for r in rows})
    for ax, (title, attrs) in zip(axes.flat, panels, strict=True):
        for (store, code), color in zip(series, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False):
            chosen = sorted(
                (r for r in rows if (r.store, r.code) == (store, code) and not r.error), key=lambda r: r.partitions
            )
            for attr, style in zip(attrs, ("-", "--", ":"), strict=False):
                points = [(r.partitions, getattr(r, attr)) for r in chosen if getattr(r, attr) is not None]
                if points:
                    xs, ys = zip(*points, strict=True)
                    label = f"{store} {code}" if style == "-" else None
                    ax.plot(xs, ys, style, marker="o", color=color, label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_xticks([p for p, _ in sizes], [f"{p}/{w}" for p, w in sizes])
        ax.minorticks_off()
        ax.set_xlabel("partitions/workers")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"idle fleets of runworkers processes: interval {INTERVAL:g}s, expiry {EXPIRY:g}s, no events")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """ "64/8,256/16" -> [(64, 8), (256, 16)]; "none": no fleets (the pumps-alone section only)."""
    if text.strip() in ("", "none"):
        return []
    sizes = []
    for part in text.split(","):
        partitions, workers = part.split("/")
        sizes.append((int(partitions), int(workers)))
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=list(SIZES),
        help="partitions/workers, comma-separated (default: 64/8,256/16,1024/64)",
    )
    parser.add_argument(
        "--store", choices=["postgresql", "redis"], action="append", help="default: postgresql and redis"
    )
    parser.add_argument("--baseline", type=Path, help="a checkout whose workers give the 'before' rows")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout whose workers give the 'after' rows")
    parser.add_argument("--window", type=float, default=WINDOW, help=f"seconds of idle measured (default {WINDOW:g})")
    parser.add_argument("--png", type=Path, help="where the chart goes (default: a file beside the temporary root)")
    parser.add_argument(
        "--pumps", type=int, default=size(256, 16), help="idle pumps on the embedded hub alone (0: none)"
    )
    parser.add_argument("--amqp-pumps", type=int, default=size(16, 2), help="idle pumps over AMQP alone (0: none)")
    options = parser.parse_args(sys.argv[1:] if argv is None else argv)
    stores = options.store or ["postgresql", "redis"]
    repos = {"after": options.repo.resolve()}
    if options.baseline is not None:
        repos["before"] = options.baseline.resolve()

    with temporary_django("bench-fleet-") as tmp:
        if options.pumps or options.amqp_pumps:
            pumps_section(options.pumps, options.amqp_pumps, tmp)
        rows: list[Row] = []
        if options.sizes:
            compared = ""
            if "before" in repos:
                compared = f"; 'before': workers of {repos['before']}, 'after': of {repos['after']}"
            print(
                f"\nidle fleets: one runworkers process per worker, embedded hub, interval {INTERVAL:g}s, expiry "
                f"{EXPIRY:g}s, no events; 'balance': seconds from the last start; 'after kill': from one SIGKILL; "
                f"queries, rows and CPU over {options.window:g}s of steady state" + compared
            )
            print(HEADER, flush=True)
            for store in stores:
                cases = [Row(store, code, p, w) for p, w in options.sizes for code in sorted(repos, reverse=True)]
                run_store(store, cases, repos, tmp, options.window)
                rows.extend(cases)
            where = Path(tmp) if tiny() else Path(tempfile.gettempdir())  # a tiny run's chart goes with its root
            png = options.png or where / f"bench_fleet_cost-{os.getpid()}.png"
            chart(rows, png)
            print(f"chart: {png}")
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
