"""``manage.py runworkers --count N``: N event processors (workers) in one process.

Each worker has its own owner id ("<hostname>-<pid>-<i>" unless ``--owner-prefix`` says
otherwise) and its own coordinator; they share the store, the event source and the handler.
SIGTERM or SIGINT stops them gracefully (final checkpoints, then partitions released); a second
signal stops waiting. The loop is ``workers.runtime``; this command only builds the objects.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from balancer.coordinator import Coordinator
from balancer.strategies import DEFAULT, STRATEGIES, get_strategy
from workers.bootstrap import SOURCES, STORES, Stores, build_source, build_stores, hub_ref
from workers.handlers import DEFAULT_HANDLER, HandlerNotFound, resolve_handler
from workers.pump import DeadLetters, PumpConfig
from workers.runtime import EventProcessor, run_workers
from workers.sink import EventSink
from workers.source import EventSource, Position

log = logging.getLogger("leaseboard.worker")


class Command(BaseCommand):
    help = "Runs N event processors (workers) that balance the hub's partitions and handle their events."
    count_option = "--count"
    default_count = 1

    def add_arguments(self, parser: CommandParser) -> None:
        add = parser.add_argument
        add(self.count_option, type=int, default=self.default_count, dest="count",
            help=f"workers in this process (default {self.default_count})")
        add("--strategy", help=f"planning strategy: {', '.join(sorted(STRATEGIES))} (default: {DEFAULT})")
        add("--store", choices=sorted(STORES), help="ownership and checkpoint store (default: LEASEBOARD_STORE)")
        add("--source", choices=sorted(SOURCES), help="event source (default: LEASEBOARD_SOURCE)")
        add("--hub", help="hub name (default: LEASEBOARD_HUB)")
        add("--consumer-group", help="consumer group (default: LEASEBOARD_CONSUMER_GROUP)")
        add("--namespace", help="namespace (default: LEASEBOARD_NAMESPACE)")
        add("--handler", default=DEFAULT_HANDLER, help=f"dotted path of the handler (default: {DEFAULT_HANDLER})")
        add("--interval", type=float, help="seconds between load-balancing cycles (default: LEASEBOARD_INTERVAL)")
        add("--expiry", type=float,
            help="seconds without renewal after which a lease is free; > --interval (default: LEASEBOARD_EXPIRY)")
        add("--owner-prefix", help="owner ids are '<prefix>-<i>' (default: '<hostname>-<pid>')")
        add("--checkpoint-events", type=int,
            help="checkpoint after this many events (default: LEASEBOARD_CHECKPOINT_EVENTS)")
        add("--checkpoint-seconds", type=float,
            help="checkpoint after this many seconds (default: LEASEBOARD_CHECKPOINT_SECONDS)")
        add("--initial-position", choices=["earliest", "latest"], default="earliest",
            help="where a partition without a checkpoint starts (default: earliest)")
        add("--shutdown-timeout", type=float, default=10.0,
            help="seconds a graceful stop waits for handlers, and again for the release (default 10)")
        add("--metrics-port", type=int, default=0, help="serve Prometheus metrics on 127.0.0.1:PORT (default: off)")

    # building ------------------------------------------------------------------------------

    def build(self, options: dict[str, Any], source: EventSource | None = None) -> Built:
        """The workers the options describe (on ``source`` if given). Raises CommandError."""
        count: int = options["count"]
        interval = options["interval"] if options["interval"] is not None else settings.LEASEBOARD_INTERVAL
        expiry = options["expiry"] if options["expiry"] is not None else settings.LEASEBOARD_EXPIRY
        if count < 1:
            raise CommandError(f"{self.count_option} must be at least 1, got {count}")
        if interval <= 0:
            raise CommandError(f"--interval must be more than 0 seconds, got {interval}")
        if expiry <= interval:
            raise CommandError(f"--expiry ({expiry:g}s) must be longer than --interval ({interval:g}s)")
        try:
            strategy = get_strategy(options["strategy"] or settings.LEASEBOARD_STRATEGY or None)
            handler = resolve_handler(options["handler"])
            ref = hub_ref(options["hub"], options["consumer_group"], options["namespace"])
            config = PumpConfig.from_settings(
                checkpoint_events=options["checkpoint_events"],
                checkpoint_seconds=options["checkpoint_seconds"],
                initial_position=Position(latest=True) if options["initial_position"] == "latest" else None,
            )
            stores = build_stores(options["store"])
            source = source or build_source(options["source"], ref.hub)
        except (ValueError, TypeError, HandlerNotFound, ImproperlyConfigured) as exc:
            raise CommandError(str(exc)) from exc
        if (options["store"] or settings.LEASEBOARD_STORE) == "memory" and self.count_option == "--count":
            log.warning("--store memory is not shared with other processes: use it for one process only")

        prefix = options["owner_prefix"] or f"{socket.gethostname()}-{os.getpid()}"
        sink = EventSink()
        dead_letters = DeadLetters(config.dead_letter_dir)
        opened = source

        async def partitions() -> tuple[str, ...]:
            return await asyncio.to_thread(opened.partition_ids)

        processors = []
        for i in range(count):
            coordinator = Coordinator(
                ref=ref, owner_id=f"{prefix}-{i}", store=stores.ownership, partitions=partitions,
                strategy=strategy, expiry=expiry, controls=stores.controls, on_event=sink, rng=random.Random(),
            )
            processors.append(EventProcessor(
                coordinator, checkpoints=stores.checkpoints, source=source, handler=handler, interval=interval,
                pump_config=config, dead_letters=dead_letters, shutdown_timeout=options["shutdown_timeout"],
            ))
        log.info(
            "%d worker(s) %s-0..%d on %s/%s/%s: strategy %s, store %s, interval %gs, expiry %gs, handler %s",
            count, prefix, count - 1, ref.namespace, ref.hub, ref.consumer_group, strategy.name,
            options["store"] or settings.LEASEBOARD_STORE, interval, expiry, options["handler"],
        )
        return Built(processors, sink, stores, source)

    def handle(self, *args: Any, **options: Any) -> None:
        built = self.build(options)
        if options["metrics_port"]:
            from prometheus_client import start_http_server

            start_http_server(options["metrics_port"], addr="127.0.0.1")
        try:
            asyncio.run(self._run(built))
        finally:
            built.source.close()

    async def _run(self, built: Built) -> None:
        try:
            await run_workers(built.processors, sink=built.sink)
        finally:
            await close_stores(built.stores)


@dataclass
class Built:
    processors: list[EventProcessor]
    sink: EventSink
    stores: Stores
    source: EventSource


async def close_stores(stores: Stores) -> None:
    """Close the stores that hold connections (each object once)."""
    seen: set[int] = set()
    for store in (stores.ownership, stores.checkpoints, stores.controls):
        aclose = getattr(store, "aclose", None)
        if aclose is not None and id(store) not in seen:
            seen.add(id(store))
            await aclose()
