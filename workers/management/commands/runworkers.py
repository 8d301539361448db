"""``manage.py runworkers --count N``: N event processors (workers) in one process.

Each worker has its own owner id ("<hostname>-<pid>-<i>" unless ``--owner-prefix`` says
otherwise) and its own coordinator; they share the store, the event source and the handler.
SIGTERM or SIGINT stops them gracefully (final checkpoints, then partitions released); a second
signal stops waiting. The loop is ``workers.runtime.processor``; the fleet is built by
``workers.wiring.build_fleet``; this command only parses its options into a ``FleetConfig``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from balancer.race.build import add_race_options
from balancer.strategies import DEFAULT, NAMES
from workers import metrics
from workers.handlers import DEFAULT_HANDLER
from workers.runtime.runner import run_workers
from workers.sources.base import EventSource
from workers.wiring import (
    SOURCES,
    Fleet,
    FleetConfig,
    FleetError,
    build_fleet,
    close_race_stores,
    close_stores,
    store_names,
    wait_for_stores,
)

log = logging.getLogger("leaseboard.worker")


def add_worker_options(parser: CommandParser, count_option: str = "--count", default_count: int = 1) -> None:
    """The options of a fleet (``FleetConfig.from_options`` reads them); ``serve`` names the count ``--workers``."""
    add = parser.add_argument
    add(
        count_option,
        type=int,
        default=default_count,
        dest="count",
        help=f"workers in this process (default {default_count})",
    )
    add("--strategy", help=f"planning strategy: {', '.join(sorted(NAMES))} (default: {DEFAULT})")
    add("--store", choices=sorted(store_names()), help="ownership and checkpoint store (default: LEASEBOARD_STORE)")
    add("--source", choices=sorted(SOURCES), help="event source (default: LEASEBOARD_SOURCE)")
    add("--hub", help="hub name (default: LEASEBOARD_HUB)")
    add("--consumer-group", help="consumer group (default: LEASEBOARD_CONSUMER_GROUP)")
    add("--namespace", help="namespace (default: LEASEBOARD_NAMESPACE)")
    add("--handler", default=DEFAULT_HANDLER, help=f"dotted path of the handler (default: {DEFAULT_HANDLER})")
    add("--interval", type=float, help="seconds between load-balancing cycles (default: LEASEBOARD_INTERVAL)")
    add(
        "--expiry",
        type=float,
        help="seconds without renewal after which a lease is free; > --interval (default: LEASEBOARD_EXPIRY)",
    )
    add("--owner-prefix", help="owner ids are '<prefix>-<i>' (default: '<hostname>-<pid>')")
    add_pump_options(parser)
    add(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="seconds a graceful stop waits for handlers, and again for the release (default 10)",
    )
    add(
        "--release-notices",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tell a worker waiting for a partition of its release at once, over the store's channel where "
        "it has one, else the channel layer where it reaches other processes (REDIS_URL) "
        "(default: LEASEBOARD_RELEASE_NOTICES, on)",
    )
    add("--metrics-port", type=int, default=0, help="serve Prometheus metrics on ADDR:PORT (default: off)")
    add("--metrics-addr", default="127.0.0.1", help="interface of --metrics-port (default 127.0.0.1)")
    add_race_options(parser)


def add_pump_options(parser: CommandParser) -> None:
    """The options of every partition's pump: checkpoints, stuck handlers, where a partition starts."""
    add = parser.add_argument
    add(
        "--checkpoint-events",
        type=int,
        help="checkpoint after this many events (default: LEASEBOARD_CHECKPOINT_EVENTS)",
    )
    add(
        "--checkpoint-seconds",
        type=float,
        help="checkpoint after this many seconds (default: LEASEBOARD_CHECKPOINT_SECONDS)",
    )
    add(
        "--handler-timeout",
        type=float,
        help="seconds one handler call may run before its partition counts as stuck: the call's thread is "
        "abandoned and the partition restarted from its checkpoint; after LEASEBOARD_HANDLER_ABANDON_MAX (3) "
        "abandoned threads the worker stops, for its supervisor to restart it; 0: never "
        "(default: LEASEBOARD_HANDLER_TIMEOUT, 300)",
    )
    add(
        "--reader-stuck",
        type=float,
        help="seconds a partition's reader may keep failing (restarted at every cycle) before the worker "
        "releases the partition for another to take, and takes it no more for 5 minutes; also how long an "
        "Event Hubs namespace may leave this worker unanswered before it hands every partition over until "
        "it answers again; 0: never (default: LEASEBOARD_READER_STUCK, 30). A reader that has handed nothing "
        "over for LEASEBOARD_READER_WEDGED seconds (15; 0: never) while events wait behind it counts as failing",
    )
    add(
        "--initial-position",
        choices=["earliest", "latest"],
        default="earliest",
        help="where a partition without a checkpoint starts (default: earliest)",
    )


def fleet_of(options: dict[str, Any], count_option: str = "--count", source: EventSource | None = None) -> Fleet:
    """The fleet the parsed ``options`` describe (on ``source`` if given). Raises CommandError."""
    try:
        return build_fleet(FleetConfig.from_options(options, count_option), source)
    except FleetError as exc:
        raise CommandError(str(exc)) from exc


class Command(BaseCommand):
    help = "Runs N event processors (workers) that balance the hub's partitions and handle their events."
    # A worker serves no page: Django's system checks (URL resolvers, templates, models) would load the
    # whole console at every start, about 0.15 s before the first cycle. `serve` runs them.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        add_worker_options(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        fleet = fleet_of(options)
        if options["metrics_port"]:
            metrics.serve(options["metrics_port"], options["metrics_addr"])
        try:
            asyncio.run(self._run(fleet))
        finally:
            closing = time.monotonic()
            fleet.source.close()
            log.info("hub source closed in %.1fs", time.monotonic() - closing)
        failures = [p.failure for p in fleet.processors if p.failure is not None]
        if failures:  # a non-zero exit, for the supervisor to restart the process
            raise CommandError("; ".join(failures))

    async def _run(self, fleet: Fleet) -> None:
        listener = asyncio.get_running_loop().create_task(fleet.notices.listen(fleet.processors), name="notices")
        try:
            if await wait_for_stores(fleet):
                await run_workers(fleet.processors, sink=fleet.sink)
        finally:
            closing = time.monotonic()
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            await fleet.notices.aclose()
            await close_stores(fleet.stores)
            await close_race_stores()
            log.info("notices and stores closed in %.1fs", time.monotonic() - closing)
