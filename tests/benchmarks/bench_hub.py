"""Raw speed of the embedded hub on one partition: writes, then a sequential read of everything.

Run: ``.venv/bin/python -m tests.benchmarks.bench_hub [--events N] [--body BYTES] [--batch K]``.
Not collected by pytest (no ``test_`` prefix). Prints one table.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from tests.benchmarks.size import size
from workers.hub.embedded import EmbeddedHub
from workers.sources.base import Position

Row = tuple[str, float, float | None, float | None]


def bench(events: int, body_size: int, batch: int, read_batch: int) -> list[Row]:
    """Rows of (what, seconds, events/s, MB/s)."""
    rows: list[Row] = []
    body = os.urandom(body_size)
    with tempfile.TemporaryDirectory() as root, EmbeddedHub(Path(root), "bench", partitions=1) as hub:
        started = time.perf_counter()
        for _ in range(events // batch):
            hub.send_batch([body] * batch, partition_id="0")
        written = time.perf_counter() - started
        size = (Path(root) / "bench" / "0.log").stat().st_size
        rows.append((f"write, batches of {batch}", written, events / written, size / written / 1e6))

        single = min(events, 100_000)
        started = time.perf_counter()
        for _ in range(single):
            hub.send(body, partition_id="0")
        elapsed = time.perf_counter() - started
        grown = (Path(root) / "bench" / "0.log").stat().st_size - size
        size += grown
        rows.append(("write, one event per send", elapsed, single / elapsed, grown / elapsed / 1e6))

        reader = hub.reader("0", Position.earliest())
        started = time.perf_counter()
        seen = 0
        while got := reader.receive(read_batch):
            seen += len(got)
        elapsed = time.perf_counter() - started
        reader.close()
        assert seen >= events, f"read {seen} of {events} events"
        rows.append((f"sequential read, receive({read_batch})", elapsed, seen / elapsed, size / elapsed / 1e6))

        started = time.perf_counter()
        properties = EmbeddedHub(Path(root), "bench").properties("0")
        rows.append(("properties() of the full log, new object", time.perf_counter() - started, None, None))
        assert properties.last_enqueued_sequence_number == seen - 1

        started = time.perf_counter()
        reader = hub.reader("0", Position.after(seen - 2))  # no offset: a scan from the start
        assert len(reader.receive(10)) == 1
        rows.append(("resume by sequence number alone (scan)", time.perf_counter() - started, None, None))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=size(1_000_000, 5_000))
    parser.add_argument("--body", type=int, default=100, help="body size in bytes")
    parser.add_argument("--batch", type=int, default=1000, help="events per send_batch")
    parser.add_argument("--read-batch", type=int, default=1000, help="max_events per receive")
    args = parser.parse_args()
    print(f"embedded hub, one partition, {args.events} events of {args.body} bytes")
    print(f"{'what':<42} {'seconds':>9} {'events/s':>12} {'MB/s':>8}")
    for what, seconds, rate, mbps in bench(args.events, args.body, args.batch, args.read_batch):
        rate_text = "-" if rate is None else f"{rate:,.0f}"
        mbps_text = "-" if mbps is None else f"{mbps:.1f}"
        print(f"{what:<42} {seconds:>9.4f} {rate_text:>12} {mbps_text:>8}")


if __name__ == "__main__":
    main()
