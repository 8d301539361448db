"""``manage.py runworkers --count N``: N event processors (workers) in one process.

Each worker has its own owner id ("<hostname>-<pid>-<i>" unless ``--owner-prefix`` says
otherwise) and its own coordinator; they share the store, the event source and the handler.
SIGTERM or SIGINT stops them gracefully (final checkpoints, then partitions released); a second
signal stops waiting. The loop is ``workers.runtime.processor``; this command only builds the objects.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from balancer.race.build import (
    add_race_options,
    close_race_stores,
    probes_of,
    race_times,
    races_in_process,
    wait_until_reachable,
)
from balancer.race.coordinator import RaceCoordinator
from balancer.race.times import LoadWeights
from balancer.strategies import DEFAULT, NAMES, RACE, get_strategy, load_weighted
from workers import metrics
from workers.handlers import DEFAULT_HANDLER, HandlerNotFound, resolve_handler
from workers.releases import Notices
from workers.runtime.config import PumpConfig
from workers.runtime.deadletters import DeadLetters
from workers.runtime.processor import EventProcessor, run_workers
from workers.runtime.sink import EventSink
from workers.sources.base import EventSource, Position
from workers.sources.partitions import PartitionList
from workers.wiring import (
    SOURCES,
    Stores,
    build_coordinator,
    build_sink,
    build_source,
    build_stores,
    close_stores,
    hub_ref,
    instrument,
    is_process_wide,
    store_names,
)

log = logging.getLogger("leaseboard.worker")


class Command(BaseCommand):
    help = "Runs N event processors (workers) that balance the hub's partitions and handle their events."
    count_option = "--count"
    default_count = 1
    # A worker serves no page: Django's system checks (URL resolvers, templates, models) would load the
    # whole console at every start, about 0.15 s before the first cycle. `serve` runs them.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        add = parser.add_argument
        add(self.count_option, type=int, default=self.default_count, dest="count",
            help=f"workers in this process (default {self.default_count})")
        add("--strategy", help=f"planning strategy: {', '.join(sorted(NAMES))} (default: {DEFAULT})")
        add("--store", choices=sorted(store_names()), help="ownership and checkpoint store (default: LEASEBOARD_STORE)")
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
        add("--release-notices", action=argparse.BooleanOptionalAction, default=None,
            help="tell a worker waiting for a partition of its release at once, over the store's channel where "
                 "it has one, else the channel layer where it reaches other processes (REDIS_URL) "
                 "(default: LEASEBOARD_RELEASE_NOTICES, on)")
        add("--metrics-port", type=int, default=0, help="serve Prometheus metrics on ADDR:PORT (default: off)")
        add("--metrics-addr", default="127.0.0.1", help="interface of --metrics-port (default 127.0.0.1)")
        add_race_options(parser)

    # building ------------------------------------------------------------------------------

    def build(self, options: dict[str, Any], source: EventSource | None = None) -> Built:
        """The workers the options describe (on ``source`` if given). Raises CommandError."""
        count: int = options["count"]
        interval = options["interval"] if options["interval"] is not None else settings.LEASEBOARD_INTERVAL
        expiry = options["expiry"] if options["expiry"] is not None else settings.LEASEBOARD_EXPIRY
        if count < 1:
            raise CommandError(f"{self.count_option} must be at least 1, got {count}")
        # Named as the user gave them: an option, or the environment variable behind its default.
        interval_name = "--interval" if options["interval"] is not None else "LEASEBOARD_INTERVAL"
        expiry_name = "--expiry" if options["expiry"] is not None else "LEASEBOARD_EXPIRY"
        if interval <= 0:
            raise CommandError(f"{interval_name} must be more than 0 seconds, got {interval}")
        if expiry <= interval:
            raise CommandError(f"{expiry_name} ({expiry:g}s) must be longer than {interval_name} ({interval:g}s)")
        if expiry < 3 * interval:
            log.warning(
                "%s (%gs) is under three %s (%gs): one slow or missed cycle can let a lease lapse and move a "
                "partition; keep the expiry at three intervals or more (the defaults: 30s over 10s)",
                expiry_name, expiry, interval_name, interval,
            )  # fmt: skip
        check_limits(options)
        skew = clock_skew()
        clock = skewed_clock(skew)
        if skew:
            log.warning("%s=%g: this process's wall clock runs %+gs off (a test hook)", CLOCK_SKEW_ENV, skew, skew)
        weighted = bool(options.get("load_weighted") or settings.LEASEBOARD_LOAD_WEIGHTED)
        try:
            strategy = get_strategy(options["strategy"] or settings.LEASEBOARD_STRATEGY or None)
            if weighted:  # the default's weighted variant (race weighs by its own options)
                strategy = load_weighted(strategy)
            handler = resolve_handler(options["handler"])
            ref = hub_ref(options["hub"], options["consumer_group"], options["namespace"])
            config = PumpConfig.from_settings(
                checkpoint_events=options["checkpoint_events"],
                checkpoint_seconds=options["checkpoint_seconds"],
                initial_position=Position(latest=True) if options["initial_position"] == "latest" else None,
            )
            if config.checkpoint_seconds <= 0:
                seconds = config.checkpoint_seconds
                raise ValueError(f"LEASEBOARD_CHECKPOINT_SECONDS must be more than 0, got {seconds:g}")
            times = race_times(options, interval) if strategy.name == RACE.name else None
            with source_beside(source, options["source"], ref.hub) as pending:
                built_stores = build_stores(options["store"])
                check_resolution(built_stores.ownership, expiry, expiry_name)
                stores = instrument(built_stores)
                source = pending()
        except (ValueError, TypeError, HandlerNotFound, ImproperlyConfigured) as exc:
            raise CommandError(str(exc)) from exc
        store_name = options["store"] or settings.LEASEBOARD_STORE
        if is_process_wide(store_name) and self.count_option == "--count":
            log.warning("--store %s is not shared with other processes: use it for one process only", store_name)

        prefix = options["owner_prefix"] or f"{socket.gethostname()}-{os.getpid()}"
        sink = build_sink()
        dead_letters = DeadLetters(config.dead_letter_dir)
        # A cycle waits at most a quarter interval for the hub's partition list, then balances the last one.
        partitions = PartitionList(
            source.partition_ids, max(0.2, interval / 4), f"event hub {ref.hub}", expiry,
            local=getattr(source, "lists_partitions_locally", False),
        )  # fmt: skip

        wanted = options.get("release_notices")
        across = settings.LEASEBOARD_RELEASE_NOTICES if wanted is None else wanted
        notices = Notices(built_stores.ownership, ref, across_processes=across)
        processors: list[EventProcessor] = []
        for i in range(count):
            load = None  # 001's lease race, load-weighted, weighs what this worker's processor handled
            if weighted and times is not None:
                load = LoadWeights(processed_by(processors, i), unit=options["load_unit"])
            coordinator = build_coordinator(
                ref, f"{prefix}-{i}", stores, partitions, strategy=strategy, expiry=expiry, on_event=sink,
                clock=clock, race_times=times, race_load=load, interval=interval,
                on_released=notices.publisher(),  # a planned move wakes its receiver at once
                announce_joining=True,  # news for workers waiting quietly (``quiet_until``)
                checkpoints=stores.checkpoints,  # where --load-weighted measures rates
            )  # fmt: skip
            processor = EventProcessor(
                coordinator, checkpoints=stores.checkpoints, source=source, handler=handler, interval=interval,
                pump_config=config, dead_letters=dead_letters, shutdown_timeout=options["shutdown_timeout"],
            )
            processor.poll_waiting = not notices.across_processes
            processors.append(processor)
            # 001's lease race: where it races is its backend's, which only the race coordinator has.
            if i == 0 and isinstance(coordinator, RaceCoordinator) and races_in_process(coordinator.backend):
                log.warning("--strategy race without REDIS_URL races in this process only")
        log.info(
            "%d worker(s) %s-0..%d on %s/%s/%s: strategy %s, store %s, interval %gs, expiry %gs, handler %s",
            count, prefix, count - 1, ref.namespace, ref.hub, ref.consumer_group,
            f"{strategy.name} (load-weighted)" if weighted else strategy.name,
            options["store"] or settings.LEASEBOARD_STORE, interval, expiry, options["handler"],
        )
        log.info("release notices: %s", notices.kind)
        return Built(processors, sink, stores, source, notices)

    def handle(self, *args: Any, **options: Any) -> None:
        built = self.build(options)
        if options["metrics_port"]:
            metrics.serve(options["metrics_port"], options["metrics_addr"])
        try:
            asyncio.run(self._run(built))
        finally:
            built.source.close()

    async def _run(self, built: Built) -> None:
        listener = asyncio.get_running_loop().create_task(built.notices.listen(built.processors), name="notices")
        try:
            if await wait_for_stores(built):
                await run_workers(built.processors, sink=built.sink)
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            await built.notices.aclose()
            await close_stores(built.stores)
            await close_race_stores()


@contextlib.contextmanager
def source_beside(given: EventSource | None, name: str | None, hub: str) -> Iterator[Callable[[], EventSource]]:
    """The event source built on a thread of its own while the caller builds the stores: an Event Hubs
    source asks the service for its partitions as it is built (a management link, about 0.4 s even on
    loopback, mostly the SDK's waiting), and the stores' imports need the CPU meanwhile. Yields a call
    that waits for the source (raising what building it raised). A source built for a ``with`` body
    that raised is closed."""
    if given is not None:
        yield lambda: given
        return
    pool = ThreadPoolExecutor(1, thread_name_prefix="source")
    future = pool.submit(build_source, name, hub)
    pool.shutdown(wait=False)
    try:
        yield future.result
    except BaseException:
        future.add_done_callback(_close_built)  # without waiting for a hub that may not answer
        raise


def _close_built(future: Future[EventSource]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()


# A test hook: seconds added to the wall clock the workers of this process read (their
# coordinators' ``clock``), to run one worker as if its machine's clock were off. Leases are judged
# by the store's clock with the default strategy, so a skew must change nothing; the fault-injection
# suite (tests/chaos) proves it. Not for production use.
CLOCK_SKEW_ENV = "LEASEBOARD_CLOCK_SKEW"


def clock_skew() -> float:
    """Seconds of ``LEASEBOARD_CLOCK_SKEW`` (0 when unset). Raises CommandError for a value that is not."""
    raw = os.environ.get(CLOCK_SKEW_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        skew = float(raw)
    except ValueError:
        skew = math.nan
    if not math.isfinite(skew):
        raise CommandError(f"{CLOCK_SKEW_ENV} must be a number of seconds, got {raw!r}")
    return skew


def skewed_clock(skew: float) -> Callable[[], float]:
    """``time.time``, or ``time.time`` plus ``skew`` seconds."""
    if not skew:
        return time.time
    return lambda: time.time() + skew


def check_resolution(store: object, expiry: float, name: str) -> None:
    """Refuse an expiry the store's clock cannot judge: one that is no whole number of its ticks (the
    Blob store's Last-Modified counts whole seconds, so a 3.5 s lease could be taken up to half a
    second before its holder stops). Raises ValueError."""
    tick = getattr(store, "clock_resolution", None)
    if tick and abs(expiry / tick - round(expiry / tick)) > 1e-9:
        raise ValueError(
            f"{name} ({expiry:g}s) must be a whole number of {tick:g}s with this store: its clock counts whole "
            f"{tick:g}s ticks, so a lease's age is judged to within one; try {math.ceil(expiry / tick) * tick:g}"
        )


def check_limits(options: dict[str, Any]) -> None:
    """Refuse option values that cannot work, in one line naming the option. Raises CommandError."""
    limits: list[tuple[str, str, float, bool]] = [  # option, dest, lowest, lowest allowed itself
        ("--checkpoint-events", "checkpoint_events", 1, True),
        ("--checkpoint-seconds", "checkpoint_seconds", 0, False),
        ("--shutdown-timeout", "shutdown_timeout", 0, False),
        ("--metrics-port", "metrics_port", 0, True),
    ]
    for option, dest, lowest, inclusive in limits:
        value = options.get(dest)
        if value is None:
            continue
        if value < lowest or (value == lowest and not inclusive):
            bound = f"at least {lowest:g}" if inclusive else f"more than {lowest:g}"
            raise CommandError(f"{option} must be {bound}, got {value:g}")
    if options.get("metrics_port") and options["metrics_port"] > 65535:
        raise CommandError(f"--metrics-port must be a TCP port (1-65535, or 0 for none), got {options['metrics_port']}")


async def wait_for_stores(built: Built) -> bool:
    """Wait, with backoff and one clear line per attempt, until the stores answer (a store that is
    down at start); False if SIGTERM or SIGINT came first (nothing is held yet)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        stores = (built.stores.ownership, built.stores.checkpoints, built.stores.controls)
        return await wait_until_reachable(probes_of(stores, [p.coordinator for p in built.processors]), stop)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def processed_by(processors: list[EventProcessor], i: int) -> Callable[[str], int]:
    """Events the ``i``th of ``processors`` handled so far on a partition (what the load-weighted race
    measures): looked up when asked, so a race coordinator is built, with its load, before its processor."""

    def processed(pid: str) -> int:
        stats = processors[i].stats().get(pid)
        return stats.processed if stats is not None else 0

    return processed


@dataclass
class Built:
    processors: list[EventProcessor]
    sink: EventSink
    stores: Stores
    source: EventSource
    notices: Notices


