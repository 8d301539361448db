"""A worker's parts built from settings: the hub it works on, its event source, its coordinator and
the process's event sink."""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from balancer.lease import Coordinator
from balancer.model import BalancerEvent, HubRef
from balancer.notices import Released
from balancer.protocol import Balancer, CheckpointStore, PartitionSource
from balancer.protocol import EventSink as BalancerEventSink
from balancer.race.backend import RaceBackend
from balancer.race.times import LoadWeights, RaceTimes
from balancer.strategies import RACE, Strategy

from ..runtime.sink import EventSink
from ..sources.base import EventSource
from .race import build_race_coordinator, race_backend
from .stores import Stores, _import

SOURCES = {
    "embedded": "workers.hub.embedded.EmbeddedHub",
    "eventhubs": "workers.sources.eventhubs.EventHubsSource",
}


def hub_ref(hub: str | None = None, consumer_group: str | None = None, namespace: str | None = None) -> HubRef:
    """The hub and consumer group to work on: the options given, else the settings."""
    return HubRef(
        namespace or settings.LEASEBOARD_NAMESPACE,
        hub or settings.LEASEBOARD_HUB,
        consumer_group or settings.LEASEBOARD_CONSUMER_GROUP,
    )


def build_source(name: str | None = None, hub: str | None = None, consumer_group: str | None = None) -> EventSource:
    """The event source for ``--source name`` (default: ``LEASEBOARD_SOURCE``) reading ``hub`` as
    ``consumer_group`` (the embedded hub has no consumer groups: every reader sees every event)."""
    key = name or settings.LEASEBOARD_SOURCE
    if key not in SOURCES:
        raise ImproperlyConfigured(f"unknown source {key!r}; choose one of: {', '.join(SOURCES)}")
    cls = _import(SOURCES[key], f"source {key!r}")
    if key == "embedded":
        return cls(  # type: ignore[no-any-return]
            settings.LEASEBOARD_HUB_DIR, hub or settings.LEASEBOARD_HUB, partitions=settings.LEASEBOARD_PARTITIONS
        )
    return cls(  # type: ignore[no-any-return]
        hub=hub or settings.LEASEBOARD_HUB,
        consumer_group=consumer_group or settings.LEASEBOARD_CONSUMER_GROUP,
        connection_string=settings.EVENTHUB_CONNECTION_STRING,
        prefetch=settings.EVENTHUB_PREFETCH,
    )


def build_coordinator(
    ref: HubRef,
    owner_id: str,
    stores: Stores,
    partitions: PartitionSource,
    *,
    strategy: Strategy,
    expiry: float,
    on_event: BalancerEventSink,
    clock: Callable[[], float] = time.time,
    race_times: RaceTimes | None = None,
    race_load: LoadWeights | None = None,
    race_on: RaceBackend | None = None,
    interval: float | None = None,
    on_released: Callable[[Released], None] | None = None,
    announce_joining: bool = False,
    checkpoints: CheckpointStore | None = None,
    rng: random.Random | None = None,
) -> Balancer:
    """The coordinator of one worker, built with everything it needs: 001's lease race for the
    ``race`` strategy (its spans from ``race_times``, its measured load from ``race_load``; on
    ``race_on``, by default Redis when ``REDIS_URL`` is set, else a race inside this process), else
    the lease-table coordinator planning with ``strategy``, telling ``on_released`` what it releases
    (and, with ``announce_joining``, that it joined) and measuring a load-weighted strategy's rates
    from ``checkpoints``. ``rng``: its randomness (default: a fresh, unseeded one). Both satisfy
    ``Balancer``."""
    rng = rng if rng is not None else random.Random()
    if strategy.name == RACE.name:
        backend = race_on if race_on is not None else race_backend(ref, stores.ownership, settings.REDIS_URL or None)
        return build_race_coordinator(
            ref,
            owner_id,
            stores.ownership,
            partitions,
            backend=backend,
            times=race_times,
            controls=stores.controls,
            on_event=on_event,
            load=race_load,
            rng=rng,
        )
    return Coordinator(
        ref=ref,
        owner_id=owner_id,
        store=stores.ownership,
        partitions=partitions,
        strategy=strategy,
        expiry=expiry,
        controls=stores.controls,
        on_event=on_event,
        rng=rng,
        clock=clock,
        interval=interval,
        on_released=on_released,
        announce_joining=announce_joining,
        checkpoints=checkpoints,
    )


def event_publisher() -> Callable[[BalancerEvent], Any] | None:
    """``LEASEBOARD_EVENT_PUBLISHER`` resolved (None when it is empty)."""
    path: str = settings.LEASEBOARD_EVENT_PUBLISHER
    if not path:
        return None
    publish = _import(path, "LEASEBOARD_EVENT_PUBLISHER")
    if not callable(publish):
        raise ImproperlyConfigured(f"LEASEBOARD_EVENT_PUBLISHER {path!r} is a {type(publish).__name__}, not a callable")
    return publish  # type: ignore[no-any-return]


def build_sink(broadcast: bool = True) -> EventSink:
    """The process's event sink: logs and counts every balancer event and, with ``broadcast``, hands
    it to ``LEASEBOARD_EVENT_PUBLISHER``."""
    publish = event_publisher() if broadcast else None
    return EventSink(publish=publish, is_async=publish is not None and inspect.iscoroutinefunction(publish))
