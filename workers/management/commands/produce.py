"""``manage.py produce``: write home-security sensor events to the embedded hub until told to stop."""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers.hub.embedded import EmbeddedHub
from workers.progress import Tracker, progress
from workers.runtime.tracedsend import traced_sends
from workers.sensors import run_producer


class Command(BaseCommand):
    help = "Writes home-security sensor events (homes as partition keys) to the embedded hub."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--hub", default=None, help="hub name (default: LEASEBOARD_HUB)")
        parser.add_argument("--rate", type=float, default=100.0, help="events per second; 0 = as fast as possible")
        parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
        parser.add_argument("--count", type=int, default=None, help="stop after this many events")
        parser.add_argument(
            "--partitions",
            type=int,
            default=None,
            help="create the hub with this many partitions, or grow it to this many (default: LEASEBOARD_PARTITIONS)",
        )
        parser.add_argument("--homes", type=int, default=1000, help="number of homes (partition keys)")
        parser.add_argument("--seed", type=int, default=None, help="seed for a reproducible stream")

    def handle(self, *args: Any, **options: Any) -> None:
        name: str = options["hub"] or settings.LEASEBOARD_HUB
        rate, duration, count = options["rate"], options["duration"], options["count"]
        partitions: int | None = options["partitions"]
        if rate < 0:
            raise CommandError(f"--rate must be 0 (as fast as possible) or more, got {rate}")
        if duration is not None and duration <= 0:
            raise CommandError(f"--duration must be more than 0 seconds, got {duration}")
        if count is not None and count < 0:
            raise CommandError(f"--count must be 0 or more, got {count}")
        if options["homes"] < 1:
            raise CommandError(f"--homes must be at least 1, got {options['homes']}")
        if partitions is not None and partitions < 1:
            raise CommandError(f"--partitions must be at least 1, got {partitions}")

        hub = self._open_hub(name, partitions)
        stop = threading.Event()
        try:
            # A progress line on a terminal (stderr) only; the hub is wrapped only while it shows.
            with _stop_on_signals(stop), progress(f"hub {name!r}", total=count, unit="events") as task:
                sender = traced_sends(hub, name)  # the hub itself unless OTEL_* turn tracing on (docs/tracing.md)
                target = cast(EmbeddedHub, _Counting(sender, task)) if task.enabled else sender
                produced = run_producer(
                    target,
                    rate,
                    stop,
                    random.Random(options["seed"]),
                    homes=options["homes"],
                    count=count,
                    duration=duration,
                )
        finally:
            hub.close()
        self.stdout.write(
            f"wrote {produced.count} events to hub {name!r} ({hub.partition_count} partitions)"
            f" in {produced.seconds:.2f} s ({produced.rate:.0f} events/s)"
        )

    def _open_hub(self, name: str, partitions: int | None) -> EmbeddedHub:
        root = settings.LEASEBOARD_HUB_DIR
        existed = EmbeddedHub.exists(root, name)
        try:
            hub = EmbeddedHub(root, name, partitions=partitions or settings.LEASEBOARD_PARTITIONS)
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        if existed and partitions is not None:
            current = hub.partition_count
            if partitions < current:
                hub.close()
                raise CommandError(
                    f"hub {name!r} already has {current} partitions, more than --partitions {partitions};"
                    " partitions can't be removed (leave --partitions out, or use another --hub)"
                )
            if partitions > current:
                hub.add_partitions(partitions)
                self.stdout.write(f"grew hub {name!r} from {current} to {partitions} partitions")
        return hub


class _Counting:
    """The hub, counting each event sent into a progress line."""

    def __init__(self, hub: EmbeddedHub, task: Tracker) -> None:
        self._hub = hub
        self._task = task

    def send(self, body: bytes, **where: Any) -> Any:
        sent = self._hub.send(body, **where)
        self._task.advance()
        return sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hub, name)


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Ctrl-C and SIGTERM set ``stop`` (so the loop ends after the event in hand) while inside."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed from the main thread
        return
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
