"""The one place that builds a fleet: the workers of one process, with the sink, stores, event
source and release notices they share (``build_fleet``), for ``runworkers``, ``serve``, the race and
the benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from balancer.model import HubRef
from balancer.race.backend import RaceBackend
from balancer.race.build import race_times
from balancer.race.times import LoadWeights, RaceTimes
from balancer.strategies import RACE, Strategy, get_strategy, load_weighted

from ..handlers import Handler, HandlerNotFound, resolve_handler
from ..releases import Notices
from ..runtime.config import PumpConfig
from ..runtime.deadletters import DeadLetters
from ..runtime.processor import EventProcessor
from ..runtime.sink import EventSink
from ..runtime.tracing import setup as setup_tracing
from ..sources.base import EventSource, Position
from ..sources.partitions import PartitionList
from .config import FleetConfig, FleetError, Timing, check_limits, check_resolution, check_timing, log, workers_clock
from .parts import build_coordinator, build_sink, build_source, hub_ref
from .race import probes_of, race_backend, races_in_process, wait_until_reachable
from .stores import Stores, build_stores, instrument, is_process_wide


@dataclass
class Fleet:
    processors: list[EventProcessor]
    sink: EventSink
    stores: Stores
    source: EventSource
    notices: Notices
    race_backends: list[RaceBackend] = field(default_factory=list)  # where each race worker races


@dataclass(frozen=True, slots=True)
class _Plan:
    """What every worker of the fleet shares besides its stores and source."""

    strategy: Strategy
    weighted: bool
    handler: Handler
    ref: HubRef
    pump: PumpConfig
    times: RaceTimes | None


def build_fleet(config: FleetConfig, source: EventSource | None = None) -> Fleet:
    """The workers ``config`` describes (on ``source`` if given). Raises FleetError naming what to fix."""
    timing = check_timing(config)
    check_limits(config)
    setup_tracing()  # OpenTelemetry spans, when the OTEL_* variables ask for them (docs/tracing.md)
    clock = workers_clock()
    weighted = bool(config.load_weighted or settings.LEASEBOARD_LOAD_WEIGHTED)
    try:
        plan = _plan(config, timing, weighted)
        with source_beside(source, config.source, plan.ref.hub) as pending:
            built_stores = build_stores(config.store)
            check_resolution(built_stores.ownership, timing.expiry, timing.expiry_name)
            stores = instrument(built_stores)
            source = pending()
    except (ValueError, TypeError, HandlerNotFound, ImproperlyConfigured) as exc:
        raise FleetError(str(exc)) from exc
    # serve's workers share their process with the console: the store need not cross processes there.
    if is_process_wide(config.store_name) and config.count_option == "--count":
        log.warning("--store %s is not shared with other processes: use it for one process only", config.store_name)
    prefix = config.owner_prefix or f"{socket.gethostname()}-{os.getpid()}"
    sink = build_sink()
    wanted = config.release_notices
    across = settings.LEASEBOARD_RELEASE_NOTICES if wanted is None else wanted
    notices = Notices(built_stores.ownership, plan.ref, across_processes=across)
    fleet = Fleet([], sink, stores, source, notices)
    _add_workers(fleet, config, plan, timing, prefix, clock)
    log.info(
        "%d worker(s) %s-0..%d on %s/%s/%s: strategy %s, store %s, interval %gs, expiry %gs, handler %s",
        config.count,
        prefix,
        config.count - 1,
        plan.ref.namespace,
        plan.ref.hub,
        plan.ref.consumer_group,
        f"{plan.strategy.name} (load-weighted)" if weighted else plan.strategy.name,
        config.store_name,
        timing.interval,
        timing.expiry,
        config.handler,
    )
    log.info("release notices: %s", notices.kind)
    return fleet


def _plan(config: FleetConfig, timing: Timing, weighted: bool) -> _Plan:
    """The strategy, handler, hub, checkpoint policy and race spans. Raises ValueError and the like."""
    strategy = get_strategy(config.strategy or settings.LEASEBOARD_STRATEGY or None)
    if weighted:  # the default's weighted variant (race weighs by its own options)
        strategy = load_weighted(strategy)
    handler = resolve_handler(config.handler)
    ref = hub_ref(config.hub, config.consumer_group, config.namespace)
    pump = PumpConfig.from_settings(
        checkpoint_events=config.checkpoint_events,
        checkpoint_seconds=config.checkpoint_seconds,
        handler_timeout=config.handler_timeout,
        reader_stuck=config.reader_stuck,
        initial_position=Position(latest=True) if config.initial_position == "latest" else None,
    )
    if pump.checkpoint_seconds <= 0:
        seconds = pump.checkpoint_seconds
        raise ValueError(f"LEASEBOARD_CHECKPOINT_SECONDS must be more than 0, got {seconds:g}")
    times = race_times(dict(config.race_spans), timing.interval) if strategy.name == RACE.name else None
    return _Plan(strategy, weighted, handler, ref, pump, times)


def _add_workers(
    fleet: Fleet, config: FleetConfig, plan: _Plan, timing: Timing, prefix: str, clock: Callable[[], float]
) -> None:
    """``config.count`` workers, each a coordinator and its event processor, into ``fleet``."""
    dead_letters = DeadLetters(plan.pump.dead_letter_dir)
    source, stores = fleet.source, fleet.stores
    # A cycle waits at most a quarter interval for the hub's partition list, then balances the last one.
    partitions = PartitionList(
        source.partition_ids,
        max(0.2, timing.interval / 4),
        f"event hub {plan.ref.hub}",
        timing.expiry,
        local=getattr(source, "lists_partitions_locally", False),
    )
    for i in range(config.count):
        load = None  # 001's lease race, load-weighted, weighs what this worker's processor handled
        backend = None
        if plan.times is not None:
            if plan.weighted:
                load = LoadWeights(processed_by(fleet.processors, i), unit=config.load_unit)
            backend = race_backend(plan.ref, stores.ownership, settings.REDIS_URL or None)
            fleet.race_backends.append(backend)
        coordinator = build_coordinator(
            plan.ref,
            f"{prefix}-{i}",
            stores,
            partitions,
            strategy=plan.strategy,
            expiry=timing.expiry,
            on_event=fleet.sink,
            clock=clock,
            race_times=plan.times,
            race_load=load,
            race_on=backend,
            interval=timing.interval,
            on_released=fleet.notices.publisher(),  # a planned move wakes its receiver at once
            announce_joining=True,  # news for workers waiting quietly (``quiet_until``)
            checkpoints=stores.checkpoints,  # where --load-weighted measures rates
        )
        processor = EventProcessor(
            coordinator,
            checkpoints=stores.checkpoints,
            source=source,
            handler=plan.handler,
            interval=timing.interval,
            pump_config=plan.pump,
            dead_letters=dead_letters,
            shutdown_timeout=config.shutdown_timeout,
        )
        processor.poll_waiting = not fleet.notices.across_processes
        fleet.processors.append(processor)
        if i == 0 and backend is not None and races_in_process(backend):
            log.warning("--strategy race without REDIS_URL races in this process only")


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


def processed_by(processors: list[EventProcessor], i: int) -> Callable[[str], int]:
    """Events the ``i``th of ``processors`` handled so far on a partition (what the load-weighted race
    measures): looked up when asked, so a race coordinator is built, with its load, before its processor."""

    def processed(pid: str) -> int:
        stats = processors[i].stats().get(pid)
        return stats.processed if stats is not None else 0

    return processed


async def wait_for_stores(fleet: Fleet) -> bool:
    """Wait, with backoff and one clear line per attempt, until the stores answer (a store that is
    down at start); False if SIGTERM or SIGINT came first (nothing is held yet)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        stores = (fleet.stores.ownership, fleet.stores.checkpoints, fleet.stores.controls)
        return await wait_until_reachable(probes_of(stores, fleet.race_backends), stop)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
