"""Microsoft's processor against Leaseboard's workers, side by side, on the embedded hub over AMQP.

One ``manage.py runhub`` process serves a hub filled with ``--events`` events over ``--partitions``
partitions; Azurite holds each fleet's ownership and checkpoints (a container per fleet). Each
fleet, in turn, runs as separate OS processes on the same hub and events:

- Microsoft: ``EventHubConsumerClient.receive`` (azure-eventhub, asyncio) with
  ``BlobCheckpointStore`` (azure-eventhub-checkpointstoreblob-aio), checkpoint every 100 events;
- Leaseboard: ``manage.py runworkers --source eventhubs --store blob`` (default strategy),
  checkpoint every 100 events or 1 s.

Both record every event they handle (one line, flushed, per event), load-balance every
``--interval`` seconds and let a lease expire after ``--expiry`` seconds. Measured per fleet:

- events/s: two workers start on the full hub; handled events (distinct) over the time from the
  first to the last one, and the wall time from start to the last one;
- balance after a join: a third worker starts on a balanced pair; seconds from its start (process
  start included) until every partition is owned, by all three, counts differing by at most one;
- balance after a kill: one of three is SIGKILLed; seconds until the other two own everything, balanced;
- blob requests per minute: Azurite's access log lines for the fleet's container over ``--steady``
  seconds of two balanced, idle workers.

Run: ``.venv/bin/python -m tests.benchmarks.bench_amqp [--events N] [--partitions P] [--steady S]``.

``--readers N`` measures only the Event Hubs source's readers instead: N of them started at once in
this process on a hub of N partitions of 1,000 events each, the wall time and this process's CPU
until every one has its first event and until all events are in (the SDK's event processor made
that CPU-bound; see ``workers/sources/eventhubs/reader.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.benchmarks.size import size

ROOT = Path(__file__).resolve().parents[2]
HUB = "bench"
BODY = b'{"event_id":"0","home":"home-00042","sensor":"door","sensor_id":"door-1","event":"opened","armed":false}'


# -- Microsoft's processor, as a worker process of its own ----------------------------------------


def microsoft_worker(label: str) -> None:
    """Runs Microsoft's processor until SIGTERM, recording "partition,sequence,label" per event."""
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubConsumerClient, PartitionContext
    from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore

    record_dir = Path(os.environ["LEASEBOARD_RECORD_DIR"])
    record_dir.mkdir(parents=True, exist_ok=True)
    out = (record_dir / f"{os.getpid()}.csv").open("a", encoding="utf-8")
    interval = float(os.environ["BENCH_INTERVAL"])

    async def run() -> None:
        store = BlobCheckpointStore.from_connection_string(
            os.environ["AZURE_STORAGE_CONNECTION_STRING"], os.environ["LEASEBOARD_BLOB_CONTAINER"]
        )
        client = EventHubConsumerClient.from_connection_string(
            os.environ["EVENTHUB_CONNECTION_STRING"],
            consumer_group="$Default",
            eventhub_name=os.environ["BENCH_HUB"],
            checkpoint_store=store,
            load_balancing_interval=interval,
            partition_ownership_expiration_interval=float(os.environ["BENCH_EXPIRY"]),
        )
        counts: Counter[str] = Counter()

        async def on_event(context: PartitionContext, event: EventData | None) -> None:
            if event is None:
                return
            out.write(f"{context.partition_id},{event.sequence_number},{label}\n")
            out.flush()
            counts[context.partition_id] += 1
            if counts[context.partition_id] % 100 == 0:
                await context.update_checkpoint(event)

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        task = asyncio.create_task(client.receive(on_event, starting_position="-1"))
        await stop.wait()
        await client.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await store.close()

    asyncio.run(run())


# -- the harness --------------------------------------------------------------------------------


@dataclass
class Hub:
    process: subprocess.Popen[str]
    connection_string: str
    namespace: str
    hub_dir: Path


def start_runhub(root: Path, partitions: int) -> Hub:
    env = {
        **os.environ,
        "LEASEBOARD_VAR_DIR": str(root / "var"),
        "LEASEBOARD_HUB_DIR": str(root / "hub"),
        "LEASEBOARD_LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }
    process = subprocess.Popen(
        [sys.executable, "manage.py", "runhub", "--port", "0", "--hub", HUB, "--partitions", str(partitions)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        found = re.match(r"EVENTHUB_CONNECTION_STRING=(\S+)", line)
        if found:
            port = re.search(r"sb://127\.0\.0\.1:(\d+)", found.group(1))
            assert port is not None
            return Hub(process, found.group(1), f"127.0.0.1:{port.group(1)}", root / "hub")
        if process.poll() is not None:
            break
    process.kill()
    raise RuntimeError("runhub did not print its connection string")


@dataclass
class Fleet:
    kind: str  # "microsoft" or "leaseboard"
    root: Path
    hub: Hub
    azurite: Any
    interval: float
    expiry: float
    container: str = field(default_factory=lambda: f"bench-{uuid.uuid4().hex[:12]}")
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list)

    @property
    def record_dir(self) -> Path:
        return self.root / f"records-{self.kind}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "EVENTHUB_CONNECTION_STRING": self.hub.connection_string,
            "AZURE_STORAGE_CONNECTION_STRING": self.azurite.connection_string,
            "LEASEBOARD_BLOB_CONTAINER": self.container,
            "LEASEBOARD_RECORD_DIR": str(self.record_dir),
            "LEASEBOARD_VAR_DIR": str(self.root / f"var-{self.kind}"),
            "LEASEBOARD_LOG_LEVEL": "WARNING",
            "BENCH_HUB": HUB,
            "BENCH_INTERVAL": str(self.interval),
            "BENCH_EXPIRY": str(self.expiry),
            "DATABASE_URL": f"sqlite:///{self.root / 'workers.sqlite3'}",
        }

    def start_worker(self) -> subprocess.Popen[bytes]:
        i = len(self.workers)
        if self.kind == "microsoft":
            command = [sys.executable, "-m", "tests.benchmarks.bench_amqp", "--microsoft-worker", f"ms-{i}"]
        else:
            command = [
                sys.executable,
                "manage.py",
                "runworkers",
                "--count",
                "1",
                "--owner-prefix",
                f"lb{i}",
                "--source",
                "eventhubs",
                "--store",
                "blob",
                "--hub",
                HUB,
                "--namespace",
                self.hub.namespace,
                "--interval",
                str(self.interval),
                "--expiry",
                str(self.expiry),
                "--handler",
                "tests.workers.recording.RecordingHandler",
                "--checkpoint-events",
                "100",
                "--checkpoint-seconds",
                "1",
            ]
        log = (self.root / f"{self.kind}-{i}.log").open("ab")
        self._logs.append(log)
        worker = subprocess.Popen(command, cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT)
        self.workers.append(worker)
        return worker

    def handled(self) -> int:
        """Distinct (partition, sequence) pairs recorded so far."""
        seen: set[tuple[str, str]] = set()
        for path in self.record_dir.glob("*.csv"):
            for line in path.read_text(encoding="utf-8").split("\n")[:-1]:
                partition, sequence, _ = line.split(",")
                seen.add((partition, sequence))
        return len(seen)

    def stop(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)
        for log in self._logs:
            log.close()


async def owners(store: Any, ref: Any) -> dict[str, str]:
    """Partition -> owner id, unowned (released) partitions left out."""
    return {r.partition_id: r.owner_id for r in await store.list_ownership(ref) if r.owner_id}


def is_balanced(held: dict[str, str], partitions: int, workers: int) -> bool:
    counts = Counter(held.values())
    return len(held) == partitions and len(counts) == workers and max(counts.values()) - min(counts.values()) <= 1


async def wait(condition: Callable[[], Any], timeout: float, what: str, step: float = 0.1) -> float:
    """Seconds until ``condition`` (sync or async) holds, looked at every ``step`` seconds (the figure's
    resolution); RuntimeError after ``timeout``."""
    started = time.monotonic()
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(step)


def access_lines(azurite: Any, container: str, since: int) -> tuple[int, int]:
    """(requests for ``container`` in Azurite's access log after byte ``since``, the log's size now)."""
    data = azurite.log_path.read_bytes()
    needle = f"/devstoreaccount1/{container}".encode()
    return sum(1 for line in data[since:].splitlines() if needle in line), len(data)


async def measure(fleet: Fleet, events: int, partitions: int, steady: float) -> dict[str, float]:
    from balancer.model import HubRef
    from balancer.stores.blob.store import BlobStore

    ref = HubRef(fleet.hub.namespace, HUB, "$Default")
    result: dict[str, float] = {}
    async with BlobStore(fleet.azurite.connection_string, fleet.container) as store:
        await store.now()  # creates the container (Microsoft's store expects it to exist)
        started = time.monotonic()
        cpu = hub_cpu(fleet.hub)
        fleet.start_worker()
        fleet.start_worker()
        # Looked at every 20 ms (the records on local disk; the store is not asked): the two fleets
        # start within a tenth of a second of each other, which a 0.1 s step could not tell apart.
        first = await wait(lambda: fleet.handled() > 0, 120, "the first handled event", step=0.02)
        done = await wait(lambda: fleet.handled() >= events, 600, f"{events} handled events", step=0.02)
        result["first_event_s"] = first
        result["all_events_s"] = time.monotonic() - started
        result["events_per_s"] = events / max(done, 1e-9)
        result["hub_cpu_s"] = hub_cpu(fleet.hub) - cpu
        await wait(lambda: owners(store, ref), 60, "ownership")
        await wait(lambda: _balanced(store, ref, partitions, 2), 120, "two balanced workers")

        _, mark = access_lines(fleet.azurite, fleet.container, 0)
        window = time.monotonic()
        await asyncio.sleep(steady)  # the measurement window itself: nothing to wait for
        requests, _ = access_lines(fleet.azurite, fleet.container, mark)
        result["blob_requests_per_min"] = requests * 60.0 / (time.monotonic() - window)

        fleet.start_worker()
        result["join_s"] = await wait(lambda: _balanced(store, ref, partitions, 3), 180, "balance after a join")
        fleet.workers[0].kill()
        fleet.workers[0].wait(10)
        result["kill_s"] = await wait(lambda: _balanced(store, ref, partitions, 2), 180, "balance after a kill")
    return result


def hub_cpu(hub: Hub) -> float:
    """CPU seconds the runhub process has used so far (user + system)."""
    fields = Path(f"/proc/{hub.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _balanced(store: Any, ref: Any, partitions: int, workers: int) -> bool:
    return is_balanced(await owners(store, ref), partitions, workers)


def fill(hub_dir: Path, events: int, partitions: int) -> None:
    from workers.hub.embedded import EmbeddedHub

    with EmbeddedHub(hub_dir, HUB, partitions=partitions) as hub:
        per = events // partitions
        for p in hub.partition_ids():
            for start in range(0, per, 1000):
                hub.send_batch([BODY] * min(1000, per - start), partition_id=p)


def readers_start(readers: int, per_partition: int = 1000) -> str:
    """N EventHubsReaders started at once on a fresh hub over AMQP; the figures as one line."""
    import threading

    from workers.sources.base import Position
    from workers.sources.eventhubs import EventHubsSource

    with tempfile.TemporaryDirectory(prefix="bench-amqp-readers-") as tmp:
        root = Path(tmp)
        fill(root / "hub", per_partition * readers, readers)
        hub = start_runhub(root, readers)
        try:
            with EventHubsSource(HUB, connection_string=hub.connection_string, owner_id="bench") as source:
                got = {str(p): 0 for p in range(readers)}
                woken = threading.Event()  # the readers say when a batch arrives: no polling to count
                started, cpu = time.monotonic(), time.process_time()
                opened = [source.reader(pid, Position.earliest()) for pid in got]
                for reader in opened:
                    reader.notify(woken.set)
                first: tuple[float, float] | None = None
                while sum(got.values()) < per_partition * readers:
                    if not woken.wait(60):
                        raise RuntimeError(f"no events for 60 s; got {got}")
                    woken.clear()
                    for reader in opened:
                        got[reader.partition_id] += len(reader.receive(1000))
                    if first is None and all(got.values()):
                        first = (time.monotonic() - started, time.process_time() - cpu)
                assert first is not None
                return (
                    f"{readers} readers in one process: every one has its first event after {first[0]:.2f} s"
                    f" ({first[1]:.2f} s CPU); all {per_partition * readers} events after"
                    f" {time.monotonic() - started:.2f} s ({time.process_time() - cpu:.2f} s CPU)"
                )
        finally:
            hub.process.terminate()
            hub.process.wait(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=size(24_000, 800))
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--interval", type=float, default=2.0, help="load-balancing interval, both fleets")
    parser.add_argument("--expiry", type=float, default=10.0, help="ownership expiry, both fleets")
    parser.add_argument(
        "--steady", type=float, default=size(20.0, 1.0), help="seconds over which blob requests are counted"
    )
    parser.add_argument("--readers", type=int, metavar="N", help="only time N Event Hubs readers starting at once")
    parser.add_argument("--microsoft-worker", metavar="LABEL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.microsoft_worker:
        microsoft_worker(args.microsoft_worker)
        return
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    import django

    django.setup()
    if args.readers:
        print(readers_start(args.readers))
        return
    from tests.support.azurite import start_azurite

    events = args.events - args.events % args.partitions
    with tempfile.TemporaryDirectory(prefix="bench-amqp-") as tmp:
        root = Path(tmp)
        hub = start_runhub(root, args.partitions)
        azurite = None
        results: dict[str, dict[str, float]] = {}
        try:
            azurite = start_azurite()  # in the try: the hub is stopped when Azurite cannot start
            fill(hub.hub_dir, events, args.partitions)
            database = {**os.environ, "DATABASE_URL": f"sqlite:///{root / 'workers.sqlite3'}"}
            subprocess.run(  # the workers' balancer event log, as the dashboard reads it
                [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=database, check=True
            )
            for kind in ("microsoft", "leaseboard"):
                fleet = Fleet(kind, root, hub, azurite, args.interval, args.expiry)
                try:
                    results[kind] = asyncio.run(measure(fleet, events, args.partitions, args.steady))
                except RuntimeError as exc:
                    print(f"{kind}: {exc}; last log lines:")
                    for log in sorted(root.glob(f"{kind}-*.log")):
                        print("  " + "\n  ".join(log.read_text(errors="replace").splitlines()[-5:]))
                finally:
                    fleet.stop()
        finally:
            hub.process.terminate()
            hub.process.wait(15)
            if azurite is not None:
                azurite.stop()
    print(
        f"\n{events} events, {args.partitions} partitions, interval {args.interval:g}s, expiry {args.expiry:g}s,"
        " embedded hub over AMQP (runhub), blob store on Azurite; each fleet in its own processes\n"
    )
    rows = [
        ("events/s, 2 workers from cold", "events_per_s", "{:.0f}"),
        ("first event after start (s)", "first_event_s", "{:.2f}"),
        ("all events handled after (s)", "all_events_s", "{:.2f}"),
        ("AMQP hub CPU for those events (s)", "hub_cpu_s", "{:.1f}"),
        ("balanced after a 3rd joins (s)", "join_s", "{:.2f}"),
        ("balanced after one is killed (s)", "kill_s", "{:.2f}"),
        ("blob requests/min, 2 idle workers", "blob_requests_per_min", "{:.0f}"),
    ]
    print(f"{'':36} {'Microsoft processor':>20} {'Leaseboard workers':>20}")
    for title, key, fmt in rows:
        cells = [
            fmt.format(results[k][key]) if k in results and key in results[k] else "failed"
            for k in ("microsoft", "leaseboard")
        ]
        print(f"{title:36} {cells[0]:>20} {cells[1]:>20}")


if __name__ == "__main__":
    main()
