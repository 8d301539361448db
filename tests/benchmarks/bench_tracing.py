"""What tracing costs one worker: handled events per second with the tracing hooks taken out (the
floor), with tracing off as shipped (no ``OTEL_*`` variable set), and with tracing on (the SDK, a
``BatchSpanProcessor`` and an exporter that discards what it gets), each as a ratio to the floor.

The same real EventProcessor as ``bench_worker`` (one pump per partition, a trivial sync handler,
the memory store, checkpoints every 100 events or 1 s) on an embedded hub whose events all carry a
``traceparent``. The cases take turns, ``--rounds`` times, and each keeps its best round, so the
machine's drift hits them alike. Off should read 1.00 give or take the noise: its per-event cost is
nil (the handler is not wrapped).

Run: ``.venv/bin/python -m tests.benchmarks.bench_tracing [--events N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from unittest import mock

from tests.benchmarks import bench_worker  # django.setup(), before the imports of workers below
from tests.benchmarks.size import size
from workers.runtime import tracing
from workers.runtime.tracecarrier import properties_section

PARTITIONS = 4
CONTEXT = properties_section({"traceparent": f"00-{1:032x}-{1:016x}-01"})


@contextmanager
def floor() -> Iterator[None]:
    """The runtime as if the tracing hooks were not there."""
    with (
        mock.patch("workers.runtime.handling.traced", lambda handler, ctx: handler),
        mock.patch("workers.runtime.checkpoints.pump_trace", lambda *key: None),
        mock.patch("workers.runtime.tracing.ownership", lambda event: None),
    ):
        yield


@contextmanager
def off() -> Iterator[None]:
    """Tracing as it ships with no ``OTEL_*`` variable set."""
    with mock.patch.object(tracing, "_active", None):
        yield


class Discarding:
    """A span exporter that counts the spans it is given and drops them."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


EXPORTED = Discarding()


@contextmanager
def on() -> Iterator[None]:
    """Tracing on: a provider of its own (not the global one), spans batched to ``EXPORTED``."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(EXPORTED))  # type: ignore[arg-type]
    with mock.patch.object(tracing, "_active", tracing.Tracing(provider)):
        yield
    provider.shutdown()


async def run(events: int) -> float:
    """Seconds one worker takes to handle ``events`` events (each with a context) on PARTITIONS partitions."""
    return await bench_worker.run(events, PARTITIONS, bench_worker.trivial, "memory", 100, amqp=CONTEXT)


# (title, what it runs under, the share of --events it handles: tracing on is some twenty times slower)
CASES = [
    ("floor: tracing hooks taken out", floor, 1),
    ("tracing off (no OTEL_* set)", off, 1),
    ("tracing on", on, 10),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=size(200_000, 2_000), help="events per round (default 200000)")
    parser.add_argument("--rounds", type=int, default=size(5, 1), help="rounds of each case (default 5)")
    args = parser.parse_args(argv or [])
    logging.getLogger("leaseboard").setLevel(logging.WARNING)
    best: dict[str, tuple[int, float]] = {}  # title -> (events, best seconds)
    for _ in range(args.rounds):
        for title, case, share in CASES:
            events = max(PARTITIONS, args.events // share // PARTITIONS * PARTITIONS)
            with case():
                seconds = asyncio.run(run(events))
            best[title] = (events, min(seconds, best.get(title, (0, float("inf")))[1]))
    print(f"one worker, {PARTITIONS} partitions, events with a traceparent, sync trivial handler, memory store;")
    print(f"best of {args.rounds} round(s) each; {os.cpu_count()} cores")
    print(f"{'case':<34} {'events':>8} {'seconds':>8} {'events/s':>10} {'vs floor':>9}")
    floor_events, floor_seconds = best[CASES[0][0]]
    for title, _, _ in CASES:
        events, seconds = best[title]
        rate = events / seconds
        print(f"{title:<34} {events:>8} {seconds:>8.2f} {rate:>10,.0f} {rate / (floor_events / floor_seconds):>9.2f}")
    print(f"spans exported while on: {EXPORTED.spans} (a full queue drops spans rather than wait)", flush=True)


if __name__ == "__main__":
    main()
