"""Throughput of one worker against the embedded hub's raw read rate, and its memory over 10 million events.

Run: ``.venv/bin/python -m tests.benchmarks.bench_throughput [--events N] [--repeat R] [--memory-events M]``
(``make bench`` runs it with the defaults). Not collected by pytest. Prints one table:

- the raw sequential read rate of one partition (``HubReader.receive`` in a loop, 100 and 1000 events
  per call): the floor no processor can beat; the better of the two is the 100 % of the last column;
- one worker (the real ``EventProcessor``: coordinator, pump, lane thread, checkpoints every 1000
  events, in-memory store) over the same events with a trivial sync handler, with batch handlers,
  with an async handler, and owning 16 partitions at once (the same number of events spread over them);
- a worker owning 16 partitions in a subprocess over ``--memory-events`` (10 million) events that a
  producer writes meanwhile; its resident memory is sampled twice a second: RSS once the first
  million was handled, the peak, and the growth in between (flat memory: a few MB at most).

Each rate is the best of ``--repeat`` runs, interleaved (this machine is shared: the best run is the
one least disturbed); a worker is timed from the moment it holds its partitions to the moment its
last event was handled (balancing itself is what bench_strategies measures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import django

from tests.benchmarks.size import size

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django.setup()

from balancer.model import HubRef  # noqa: E402
from balancer.stores.memory import MemoryStore  # noqa: E402
from balancer.strategies import get_strategy  # noqa: E402
from workers.handlers import PartitionContext, batch_handler  # noqa: E402
from workers.hub.embedded import EmbeddedHub  # noqa: E402
from workers.progress import progress as progress_line  # noqa: E402
from workers.runtime.config import PumpConfig  # noqa: E402
from workers.runtime.processor import EventProcessor  # noqa: E402
from workers.runtime.sink import EventSink  # noqa: E402
from workers.sources.base import Position, ReceivedEvent  # noqa: E402
from workers.wiring import Stores, build_coordinator  # noqa: E402

REF = HubRef("bench", "throughput", "$Default")
BODY = b'{"event_id":"0","home":"home-00042","sensor":"door","sensor_id":"door-1","event":"opened","armed":false}'
ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT_EVENTS = 1000


def trivial(event: ReceivedEvent, ctx: PartitionContext) -> None:
    """Does nothing with the event."""


async def trivial_async(event: ReceivedEvent, ctx: PartitionContext) -> None:
    """The same, on the event loop."""


@batch_handler(max_events=100)  # type: ignore[untyped-decorator]  # batch_handler(...) is typed as Any
def batch_100(events: list[ReceivedEvent], ctx: PartitionContext) -> None:
    """The same, 100 events per call."""


@batch_handler(max_events=1000)  # type: ignore[untyped-decorator]  # batch_handler(...) is typed as Any
def batch_1000(events: list[ReceivedEvent], ctx: PartitionContext) -> None:
    """The same, 1000 events per call."""


def fill(hub: EmbeddedHub, per_partition: int) -> None:
    for pid in hub.partition_ids():
        for start in range(0, per_partition, 1000):
            hub.send_batch([BODY] * min(1000, per_partition - start), partition_id=pid)


def raw_rate(hub: EmbeddedHub, read_size: int) -> tuple[float, float]:
    """(events/s, CPU seconds) of reading partition 0 from the start to the end."""
    reader = hub.reader("0", Position.earliest())
    started, cpu = time.perf_counter(), time.process_time()
    seen = 0
    while got := reader.receive(read_size):
        seen += len(got)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    reader.close()
    return seen / elapsed, cpu


def processor(hub: EmbeddedHub, handler: Callable[..., Any], max_events: int = 100) -> EventProcessor:
    """One worker on ``hub`` with a fresh in-memory store, checkpointing every 1000 events or second."""
    store = MemoryStore()

    async def partition_ids() -> tuple[str, ...]:
        return hub.partition_ids()

    coordinator = build_coordinator(
        REF,
        "bench-0",
        Stores(store, store, store),
        partition_ids,
        strategy=get_strategy(None),
        expiry=30.0,
        on_event=EventSink(),
        rng=random.Random(0),
    )
    config = PumpConfig(checkpoint_events=CHECKPOINT_EVENTS, checkpoint_seconds=1.0, max_events=max_events)
    return EventProcessor(coordinator, checkpoints=store, source=hub, handler=handler, interval=0.1, pump_config=config)


def processed(worker: EventProcessor) -> int:
    return sum(s.processed for s in worker.stats().values())


async def worker_rate(hub: EmbeddedHub, handler: Callable[..., Any], total: int) -> tuple[float, float]:
    """(events/s, CPU seconds) of one worker handling all ``total`` events of ``hub``, from the claim on."""
    worker = processor(hub, handler)
    runner = asyncio.create_task(worker.run())
    partitions = len(hub.partition_ids())
    while len(worker.pumping) < partitions:
        await asyncio.sleep(0.001)
    started, cpu = time.perf_counter(), time.process_time()
    while processed(worker) < total:
        await asyncio.sleep(0.01)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    worker.stop()
    await runner
    checkpoints = {c.partition_id: c.sequence_number for c in await worker._checkpoints.list_checkpoints(REF)}
    expected = {p: total // partitions - 1 for p in hub.partition_ids()}
    assert checkpoints == expected, f"final checkpoints {checkpoints}, expected {expected}"
    return total / elapsed, cpu


Row = tuple[str, int, float, float, float | None, str]  # case, events, seconds, events/s, % of floor, note


def throughput(events: int, repeat: int) -> list[Row]:
    logging.getLogger("leaseboard").setLevel(logging.WARNING)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        one = EmbeddedHub(Path(tmp), "one", partitions=1)
        sixteen = EmbeddedHub(Path(tmp), "sixteen", partitions=16)
        fill(one, events)
        fill(sixteen, events // 16)
        cases: list[tuple[str, Callable[[], tuple[float, float]]]] = [
            ("raw read, receive(100)", lambda: raw_rate(one, 100)),
            ("raw read, receive(1000)", lambda: raw_rate(one, 1000)),
            ("worker, 1 partition, sync handler", lambda: asyncio.run(worker_rate(one, trivial, events))),
            ("worker, 1 partition, batch handler (100)", lambda: asyncio.run(worker_rate(one, batch_100, events))),
            ("worker, 1 partition, batch handler (1000)", lambda: asyncio.run(worker_rate(one, batch_1000, events))),
            ("worker, 1 partition, async handler", lambda: asyncio.run(worker_rate(one, trivial_async, events))),
            (
                "worker, 16 partitions, sync handler",
                lambda: asyncio.run(worker_rate(sixteen, trivial, events // 16 * 16)),
            ),
        ]
        best: dict[str, tuple[float, float]] = {}
        with progress_line("throughput cases", total=repeat * len(cases), unit="runs") as task:  # a terminal only
            for _ in range(repeat):
                for title, run in cases:
                    task.update(info=title)
                    rate, cpu = run()
                    if title not in best or rate > best[title][0]:
                        best[title] = (rate, cpu)
                    task.advance()
        one.close()
        sixteen.close()
    floor = max(best["raw read, receive(100)"][0], best["raw read, receive(1000)"][0])
    for title, _ in cases:
        rate, cpu = best[title]
        total = events // 16 * 16 if "16 partitions" in title else events
        rows.append((title, total, total / rate, rate, 100 * rate / floor, f"{cpu:.2f} CPU s"))
    return rows


# memory ----------------------------------------------------------------------------------------------


def child(hub_dir: str, total: int) -> None:
    """In the subprocess: one worker on the 16-partition hub until ``total`` events were handled;
    prints one JSON line with the stats."""
    logging.getLogger("leaseboard").setLevel(logging.WARNING)
    hub = EmbeddedHub(Path(hub_dir), "memory", partitions=16)

    async def main() -> dict[str, Any]:
        worker = processor(hub, trivial)
        runner = asyncio.create_task(worker.run())
        started = time.perf_counter()
        while (done := processed(worker)) < total:
            print(json.dumps({"processed": done}), flush=True)
            await asyncio.sleep(0.5)
        elapsed = time.perf_counter() - started
        worker.stop()
        await runner
        return {"processed": processed(worker), "seconds": elapsed, "finished": True}

    print(json.dumps(asyncio.run(main())), flush=True)


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MB (0 once it has gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def memory(total: int) -> list[Row]:
    """A producer (this process) writes ``total`` events over 16 partitions while a worker in a
    subprocess handles them; its RSS is sampled every half second."""
    per_partition = total // 16
    total = per_partition * 16
    with tempfile.TemporaryDirectory() as tmp:
        hub = EmbeddedHub(Path(tmp), "memory", partitions=16)
        module = "tests.benchmarks.bench_throughput"
        command = [sys.executable, "-m", module, "--child", tmp, "--memory-events", str(total)]
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        progress = {"handled": 0}

        def follow() -> None:  # the child's progress lines, off the producing thread
            assert process.stdout is not None
            for line in process.stdout:
                progress["handled"] = max(progress["handled"], json.loads(line)["processed"])

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        samples: list[tuple[int, float]] = []  # (events handled, RSS MB)
        written, last_sample = 0, 0.0
        with progress_line("memory run: events handled", total=total, unit="events") as task:  # a terminal only
            while process.poll() is None:
                if written < per_partition:  # one batch of up to 1000 per partition per round
                    batch = min(1000, per_partition - written)
                    for pid in hub.partition_ids():
                        hub.send_batch([BODY] * batch, partition_id=pid)
                    written += batch
                else:
                    time.sleep(0.05)
                if time.perf_counter() - last_sample >= 0.5:
                    last_sample = time.perf_counter()
                    samples.append((progress["handled"], rss_mb(process.pid)))
                    task.update(completed=progress["handled"], info=f"RSS {samples[-1][1]:.0f} MB")
        follower.join(10)
        handled = progress["handled"]
        elapsed = time.perf_counter() - started
        assert process.wait(30) == 0, f"the worker process exited with {process.returncode}"
        hub.close()
    assert handled >= total, f"the worker handled {handled} of {total} events"
    warm = [rss for n, rss in samples if n >= 1_000_000] or [rss for _, rss in samples]
    at_warm, peak = warm[0], max(rss for _, rss in samples)
    note = f"RSS {at_warm:.0f} MB after 1M, peak {peak:.0f} MB, growth {peak - at_warm:+.1f} MB"
    return [("worker, 16 partitions, 10M events (memory)", total, elapsed, total / elapsed, None, note)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--events", type=int, default=size(1_000_000, 10_000), help="events per throughput case (default 1e6)"
    )
    parser.add_argument("--repeat", type=int, default=size(3, 1), help="runs per case; the best is shown (default 3)")
    parser.add_argument(
        "--memory-events", type=int, default=size(10_000_000, 32_000), help="events of the memory run (1e7; 0: none)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv if argv is not None else sys.argv[1:])
    if args.child:
        child(args.child, args.memory_events)
        return
    load = os.getloadavg()[0]
    print(
        f"embedded hub, {len(BODY)}-byte events, checkpoint every {CHECKPOINT_EVENTS} events, in-memory store; "
        f"best of {args.repeat}; {os.cpu_count()} cores, load average {load:.1f} at start"
    )
    rows = throughput(args.events, args.repeat)
    if args.memory_events:
        rows += memory(args.memory_events)
    print(f"{'case':<44} {'events':>10} {'seconds':>8} {'events/s':>10} {'of raw':>7}  note")
    for title, total, seconds, rate, share, note in rows:
        share_text = "-" if share is None else f"{share:.0f}%"
        print(f"{title:<44} {total:>10,} {seconds:>8.2f} {rate:>10,.0f} {share_text:>7}  {note}", flush=True)


if __name__ == "__main__":
    main()
