"""Event Hubs reader: how long an event waits in the SDK, by prefetch, over AMQP from the embedded hub.

The SDK (azure-eventhub's pyamqp) hands a read's events over only when the read ends: at a silence
of its socket timeout (0.2 s) or after ``prefetch`` frames. Events that arrive more often than every
0.2 s therefore come in bursts of ``prefetch``. Measured here with ``EventHubsReader`` (the source
``runworkers --source eventhubs`` uses) on one partition of an AMQP hub served in this process:

- latency: events appended one at a time at a steady rate for ``--seconds``; per event, the time
  from the append until ``receive`` returned it (median, p95, max);
- throughput: a partition holding ``--events`` events read from the start.

Rows for Microsoft's default prefetch (300, what its processor uses) and Leaseboard's (20,
``EVENTHUB_PREFETCH``). Run: ``.venv/bin/python -m tests.benchmarks.bench_prefetch [--seconds S]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import django

from tests.benchmarks.size import size

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django.setup()

from tests.amqp.conftest import serve  # noqa: E402
from workers.hub.embedded import EmbeddedHub  # noqa: E402
from workers.sources.eventhubs.reader import EventHubsReader  # noqa: E402
from workers.sources.eventhubs.sdk import sdk_client  # noqa: E402
from workers.sources.eventhubs.source import DEFAULT_PREFETCH  # noqa: E402

BODY = b'{"event_id":"0","home":"home-00042","sensor":"door","sensor_id":"door-1","event":"opened","armed":false}'
MICROSOFT = 300  # azure-eventhub's default prefetch


def _reader(connection_string: str, prefetch: int, position: str) -> EventHubsReader:
    client = sdk_client(connection_string, "bench", "$Default")
    return EventHubsReader(
        client, hub="bench", partition_id="0", starting_position=position, owner_level=0, prefetch=prefetch
    )


def latency(rate: float, prefetch: int, seconds: float) -> tuple[float, float, float, int]:
    """(median, p95, max) seconds from append to receive, and the events measured."""
    with tempfile.TemporaryDirectory() as root:
        EmbeddedHub(Path(root), "bench", partitions=1).close()
        served = serve(Path(root))
        hub = EmbeddedHub(Path(root), "bench")
        reader = _reader(served.connection_string, prefetch, "@latest")
        try:
            # the receiver is attached (at the end of the log) once a probe comes back; then a silence
            # ends the SDK's read, so the rows start with no read under way
            deadline = time.monotonic() + 30
            while not reader.receive(1000):
                if time.monotonic() > deadline:
                    raise RuntimeError("the reader never received a probe")
                hub.send(BODY, partition_id="0")
                time.sleep(0.3)
            time.sleep(0.5)
            reader.receive(1000)
            sent: dict[int, float] = {}

            def produce() -> None:
                end = time.monotonic() + seconds
                following = time.monotonic()
                while following < end:
                    sent[hub.send(BODY, partition_id="0").sequence_number] = time.monotonic()
                    following += 1 / rate
                    time.sleep(max(0.0, following - time.monotonic()))  # the producer's own rhythm

            producer = threading.Thread(target=produce, name="producer")
            producer.start()
            waited: list[float] = []
            deadline = time.monotonic() + seconds + 120
            while time.monotonic() < deadline and (producer.is_alive() or len(waited) < len(sent)):
                for event in reader.receive(1000):
                    if event.sequence_number in sent:
                        waited.append(time.monotonic() - sent[event.sequence_number])
                time.sleep(0.002)  # a pump's poll here; the runtime's pumps wake on the reader's notify
            producer.join()
        finally:
            reader.close()
            hub.close()
            served.thread.stop()
    waited.sort()
    return statistics.median(waited), waited[int(len(waited) * 0.95)], waited[-1], len(waited)


def throughput(prefetch: int, events: int) -> float:
    """Events a second reading a full partition from the start."""
    with tempfile.TemporaryDirectory() as root:
        with EmbeddedHub(Path(root), "bench", partitions=1) as hub:
            for _ in range(events // 500):
                hub.send_batch([BODY] * 500, partition_id="0")
        served = serve(Path(root))
        started = time.monotonic()
        reader = _reader(served.connection_string, prefetch, "-1")
        try:
            seen = 0
            while seen < events // 500 * 500:
                seen += len(reader.receive(1000))
                time.sleep(0.001)
            return seen / (time.monotonic() - started)
        finally:
            reader.close()
            served.thread.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--seconds", type=float, default=size(8.0, 1.0), help="seconds of steady appends per latency row"
    )
    parser.add_argument("--rates", default=size("6,20,100", "20"), help="events a second per latency row")
    parser.add_argument("--events", type=int, default=size(20_000, 2_000), help="events in the throughput rows")
    args = parser.parse_args()
    print(
        f"one partition over AMQP, {args.seconds:g} s of steady appends per row; "
        f"prefetch {MICROSOFT} is Microsoft's default, {DEFAULT_PREFETCH} Leaseboard's"
    )
    print(f"{'events/s':>8} {'prefetch':>8} {'events':>7} {'median ms':>10} {'p95 ms':>8} {'max ms':>8}")
    for rate in (float(r) for r in args.rates.split(",")):
        for prefetch in (MICROSOFT, DEFAULT_PREFETCH):
            median, p95, worst, count = latency(rate, prefetch, args.seconds)
            print(
                f"{rate:>8g} {prefetch:>8} {count:>7} {median * 1000:>10.0f} {p95 * 1000:>8.0f} {worst * 1000:>8.0f}",
                flush=True,
            )
    rates = {prefetch: throughput(prefetch, args.events) for prefetch in (MICROSOFT, DEFAULT_PREFETCH)}
    print(
        f"read from the start, {args.events} events: "
        + ", ".join(f"prefetch {p}: {r:,.0f} events/s" for p, r in rates.items())
        + f" (ratio {rates[DEFAULT_PREFETCH] / rates[MICROSOFT]:.2f})"
    )


if __name__ == "__main__":
    main()
