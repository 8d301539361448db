"""Builds the stores, the event source and the hub reference from settings and options.

The one place that knows which class serves which ``--store`` and ``--source`` name. Classes are
imported lazily, so a store's client library is needed only when that store is chosen.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from balancer.model import HubRef
from balancer.protocol import CheckpointStore, ControlStore, OwnershipStore
from workers.sources.base import EventSource

STORES = {
    "sql": "dashboard.sqlstore.SqlStore",
    "memory": "balancer.stores.memory.MemoryStore",
    "redis": "balancer.stores.redis.RedisStore",
    "blob": "balancer.stores.azure_blob.BlobStore",
}
SOURCES = {
    "embedded": "workers.hub.embedded.EmbeddedHub",
    "eventhubs": "workers.sources.eventhubs.EventHubsSource",
}


@dataclass(frozen=True, slots=True)
class Stores:
    ownership: OwnershipStore
    checkpoints: CheckpointStore
    controls: ControlStore


def _load(table: dict[str, str], kind: str, name: str) -> Any:
    try:
        path = table[name]
    except KeyError:
        raise ImproperlyConfigured(f"unknown {kind} {name!r}; choose one of: {', '.join(table)}") from None
    module, _, attr = path.rpartition(".")
    try:
        return getattr(import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ImproperlyConfigured(f"{kind} {name!r} is not available here: {exc}") from exc


def hub_ref(hub: str | None = None, consumer_group: str | None = None, namespace: str | None = None) -> HubRef:
    """The hub and consumer group to work on: the options given, else the settings."""
    return HubRef(
        namespace or settings.LEASEBOARD_NAMESPACE,
        hub or settings.LEASEBOARD_HUB,
        consumer_group or settings.LEASEBOARD_CONSUMER_GROUP,
    )


@functools.cache
def _memory_store() -> Any:
    # One per process, so embedded workers and the dashboard in one process see the same leases.
    return _load(STORES, "store", "memory")()


def build_stores(name: str | None = None) -> Stores:
    """The stores for ``--store name`` (default: ``LEASEBOARD_STORE``). One object serves all three
    protocols in every adapter so far; ownership and checkpoints may be split later."""
    key = name or settings.LEASEBOARD_STORE
    store = _memory_store() if key == "memory" else _load(STORES, "store", key)()
    return Stores(ownership=store, checkpoints=store, controls=store)


def build_source(name: str | None = None, hub: str | None = None, consumer_group: str | None = None) -> EventSource:
    """The event source for ``--source name`` (default: ``LEASEBOARD_SOURCE``) reading ``hub`` as
    ``consumer_group`` (the embedded hub has no consumer groups: every reader sees every event)."""
    key = name or settings.LEASEBOARD_SOURCE
    cls = _load(SOURCES, "source", key)
    if key == "embedded":
        return cls(  # type: ignore[no-any-return]
            settings.LEASEBOARD_HUB_DIR, hub or settings.LEASEBOARD_HUB, partitions=settings.LEASEBOARD_PARTITIONS
        )
    return cls(  # type: ignore[no-any-return]
        hub=hub or settings.LEASEBOARD_HUB, consumer_group=consumer_group or settings.LEASEBOARD_CONSUMER_GROUP
    )
