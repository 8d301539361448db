"""The pipeline's dedupe state after 1 M and 10 M events: counted ranges (``workers.pipeline.ranges``)
against the key per event the former ``dropDuplicates`` state kept.

Run: ``.venv/bin/python -m tests.benchmarks.bench_pipeline_state`` (or ``make bench``). The landing is
what ``runworkers`` lands: 16 partitions, files of up to 5000 events named by their range, plus the
duplicates of a fleet's life: every 50th file landed again by a new owner with another cut (a worker
killed before its checkpoint), and files listed out of order (a late file within a window of 40). The
batches (40 files each) are planned by the job's own code, and the state after the last batch is
measured as the job stores it (JSON per partition, ``CountedRange``), beside the former state's
key count (one RocksDB key per distinct event, never dropped). Then the time to list the landing
at 10 M events, never cleaned and as ``cleanSource`` keeps it.

Prints one table. Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

from tests.benchmarks.size import size
from workers.pipeline import ranges

PARTITIONS = 16
PER_FILE = 5000
BATCH_FILES = 40
EVENTS = size((1_000_000, 10_000_000), (80_000, 400_000))  # the rows; the listing is at the last


def landing_uris(events: int, rng: random.Random) -> list[str]:
    uris = []
    per_partition = events // PARTITIONS
    for p in range(PARTITIONS):
        for first in range(0, per_partition, PER_FILE):
            last = min(first + PER_FILE, per_partition) - 1
            uris.append(f"file:///landing/sensors/{p}/{first:020d}-{last:020d}.parquet")
            if rng.random() < 0.02:  # landed again from an older checkpoint, cut differently
                again = max(0, first - rng.randrange(1, PER_FILE))
                uris.append(f"file:///landing/sensors/{p}/{again:020d}-{last:020d}.parquet")
    rng.shuffle(uris)  # partitions land in parallel, so their files interleave
    uris.sort(key=lambda u: int(u.rsplit("/", 1)[1][:20]) + rng.randrange(0, 40 * PER_FILE))  # late files
    return uris


def measure(events: int) -> tuple[int, int, int, float]:
    """(intervals, bytes of the stored state, most intervals at any batch, seconds planning every batch)."""
    uris = landing_uris(events, random.Random(events))
    counted: ranges.Ranges = {}
    widest = 0
    started = time.perf_counter()
    for start in range(0, len(uris), BATCH_FILES):
        plan = ranges.plan(counted, uris[start : start + BATCH_FILES])
        assert plan.after is not None
        counted = plan.after
        widest = max(widest, ranges.size(counted))
    seconds = time.perf_counter() - started
    assert ranges.covered(counted) == events // PARTITIONS * PARTITIONS
    return ranges.size(counted), len(ranges.dumps(counted).encode()), widest, seconds


def listing_seconds(files: int) -> float:
    """Seconds to list a landing of ``files`` files in 16 partition folders (the file source lists the
    landing every trigger): empty files, as listing reads names, not contents."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for n in range(files):
            folder = root / str(n % PARTITIONS)
            folder.mkdir(exist_ok=True)
            (folder / f"{n:020d}-{n:020d}.parquet").touch()
        started = time.perf_counter()
        for _ in range(10):
            listed = [p for p in root.rglob("*.parquet")]
        assert len(listed) == files
        return (time.perf_counter() - started) / 10


def main(argv: list[str] | None = None) -> None:
    print(
        f"{'events':>12} {'files':>6} {'intervals':>9} {'max during':>10} {'state bytes':>11} "
        f"{'plan s (all batches)':>20} {'former state: keys':>20}"
    )
    for events in EVENTS:
        files = len(landing_uris(events, random.Random(events)))
        intervals, size, widest, seconds = measure(events)
        print(f"{events:>12,} {files:>6} {intervals:>9} {widest:>10} {size:>11,} {seconds:>20.3f} {events:>20,}")
    every, kept = len(landing_uris(EVENTS[-1], random.Random(1))), BATCH_FILES * 2
    print(
        f"listing the landing per trigger at {EVENTS[-1] / 1e6:g}M events: {every} files, never cleaned: "
        f"{listing_seconds(every) * 1000:.1f} ms; cleaned (cleanSource, about two batches left): "
        f"{listing_seconds(kept) * 1000:.2f} ms"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
