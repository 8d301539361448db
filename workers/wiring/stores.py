"""The one place that builds stores, event sources, the event sink and coordinators from settings.

Stores and the event publisher are named in settings by dotted path (``LEASEBOARD_STORES``,
``LEASEBOARD_EVENT_PUBLISHER``), the way Channels resolves ``CHANNEL_LAYERS``: the SQL store and
the publisher live in the dashboard, above this package, and the workers reach them only through
configuration. Classes are imported when chosen, so a store's client library is needed only when
that store is used. Everything raises ``ImproperlyConfigured`` with the setting to fix.
"""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from balancer.lease import Coordinator
from balancer.model import BalancerEvent, HubRef
from balancer.notices import Released
from balancer.protocol import Balancer, CheckpointStore, ControlStore, OwnershipStore, PartitionSource
from balancer.protocol import EventSink as BalancerEventSink
from balancer.race.build import build_race_coordinator
from balancer.race.times import LoadWeights, RaceTimes
from balancer.strategies import RACE, Strategy

from . import metrics
from .runtime.sink import EventSink
from .sources.base import EventSource

SOURCES = {
    "embedded": "workers.hub.embedded.EmbeddedHub",
    "eventhubs": "workers.sources.eventhubs.EventHubsSource",
}


@dataclass(frozen=True, slots=True)
class Stores:
    ownership: OwnershipStore
    checkpoints: CheckpointStore
    controls: ControlStore


def _import(path: str, what: str) -> Any:
    try:
        return import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"{what} {path!r} is not available here: {exc}") from exc


def store_names() -> tuple[str, ...]:
    """The names ``--store`` accepts: the keys of ``LEASEBOARD_STORES``."""
    return tuple(settings.LEASEBOARD_STORES)


def _store_entry(name: str) -> Mapping[str, Any]:
    table: Mapping[str, Mapping[str, Any]] = settings.LEASEBOARD_STORES
    try:
        entry = table[name]
    except KeyError:
        raise ImproperlyConfigured(
            f"unknown store {name!r}; choose one of: {', '.join(table)} (LEASEBOARD_STORES)"
        ) from None
    if not isinstance(entry, Mapping) or not isinstance(entry.get("BACKEND"), str):
        raise ImproperlyConfigured(f'LEASEBOARD_STORES[{name!r}] needs a "BACKEND": a dotted path to a class')
    config = entry.get("CONFIG", {})
    if not isinstance(config, Mapping):
        raise ImproperlyConfigured(f'LEASEBOARD_STORES[{name!r}]["CONFIG"] must be a dict of keyword arguments')
    return entry


_process_wide: dict[str, Any] = {}


def is_process_wide(name: str) -> bool:
    """Whether store ``name`` lives in this process only (``"PROCESS_WIDE"``: not shared with others)."""
    return bool(_store_entry(name).get("PROCESS_WIDE"))


def build_stores(name: str | None = None) -> Stores:
    """The stores for ``--store name`` (default: ``LEASEBOARD_STORE``); close them with ``close_stores``.

    One object serves all three protocols in every adapter so far; ownership and checkpoints may be
    split later. Raises ImproperlyConfigured for an unknown name or a backend that cannot be imported.
    """
    key = name or settings.LEASEBOARD_STORE
    entry = _store_entry(key)
    store = _process_wide.get(key) if entry.get("PROCESS_WIDE") else None
    if store is None:
        store = _import(entry["BACKEND"], f"store {key!r}")(**entry.get("CONFIG", {}))
        if entry.get("PROCESS_WIDE"):
            _process_wide[key] = store
    return Stores(ownership=store, checkpoints=store, controls=store)


async def close_stores(stores: Stores) -> None:
    """Close the stores that hold connections (each object once; process-wide ones stay open)."""
    keep = {id(store) for store in _process_wide.values()}
    seen: set[int] = set()
    for store in (stores.ownership, stores.checkpoints, stores.controls):
        # Judged by the store itself, not by a metrics wrapper around it (``instrument``).
        inner = store.wrapped if isinstance(store, metrics.InstrumentedStore) else store
        aclose = getattr(inner, "aclose", None)
        if aclose is not None and id(inner) not in seen | keep:
            seen.add(id(inner))
            await aclose()


def instrument(stores: Stores) -> Stores:
    """``stores`` with every call counted and timed in Prometheus (``workers.metrics.instrumented``).

    One wrapper per distinct store, so ``ownership is controls`` stays true where it was, and with it
    the one-request snapshot. Raises TypeError when a store lacks the protocol of its place.
    """
    wrapped: dict[int, object] = {}

    def wrap(store: object) -> object:
        return wrapped.setdefault(id(store), metrics.instrumented(store))

    ownership, checkpoints, controls = wrap(stores.ownership), wrap(stores.checkpoints), wrap(stores.controls)
    if not isinstance(ownership, OwnershipStore):
        raise TypeError(f"the ownership store {stores.ownership!r} is not an OwnershipStore")
    if not isinstance(checkpoints, CheckpointStore):
        raise TypeError(f"the checkpoint store {stores.checkpoints!r} is not a CheckpointStore")
    if not isinstance(controls, ControlStore):
        raise TypeError(f"the control store {stores.controls!r} is not a ControlStore")
    return Stores(ownership=ownership, checkpoints=checkpoints, controls=controls)


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
        hub=hub or settings.LEASEBOARD_HUB, consumer_group=consumer_group or settings.LEASEBOARD_CONSUMER_GROUP
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
    interval: float | None = None,
    on_released: Callable[[Released], None] | None = None,
    announce_joining: bool = False,
    checkpoints: CheckpointStore | None = None,
) -> Balancer:
    """The coordinator of one worker, built with everything it needs: 001's lease race for the
    ``race`` strategy (its spans from ``race_times``, its measured load from ``race_load``; Redis when
    ``REDIS_URL`` is set, else a race inside this process), else the lease-table coordinator planning
    with ``strategy``, telling ``on_released`` what it releases (and, with ``announce_joining``, that
    it joined) and measuring a load-weighted strategy's rates from ``checkpoints``. Both satisfy
    ``Balancer``."""
    if strategy.name == RACE.name:
        return build_race_coordinator(
            ref, owner_id, stores.ownership, partitions, times=race_times, controls=stores.controls,
            redis_url=settings.REDIS_URL or None, on_event=on_event, load=race_load, rng=random.Random(),
        )  # fmt: skip
    return Coordinator(
        ref=ref, owner_id=owner_id, store=stores.ownership, partitions=partitions, strategy=strategy,
        expiry=expiry, controls=stores.controls, on_event=on_event, rng=random.Random(), clock=clock,
        interval=interval, on_released=on_released, announce_joining=announce_joining, checkpoints=checkpoints,
    )  # fmt: skip


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
