"""The stores ``--store`` names, built from ``LEASEBOARD_STORES`` with their connections from settings.

A store's ``"BACKEND"`` is a dotted path resolved as Channels resolves ``CHANNEL_LAYERS``; its
keyword arguments are the connection the settings give it (``CONNECTIONS``: Redis's ``REDIS_URL``,
Blob Storage's ``AZURE_STORAGE_CONNECTION_STRING`` and ``LEASEBOARD_BLOB_CONTAINER``) under its
``"CONFIG"``, which wins. No adapter reads the environment itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from balancer.protocol import CheckpointStore, ControlStore, OwnershipStore

from ..store_metrics import InstrumentedStore, instrumented


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


# The connection each adapter is given from settings (read when a store is built), by backend path.
CONNECTIONS: dict[str, Callable[[], dict[str, Any]]] = {
    "balancer.stores.redis.store.RedisStore": lambda: {"url": settings.REDIS_URL},
    "balancer.stores.blob.store.BlobStore": lambda: {
        "connection_string": settings.AZURE_STORAGE_CONNECTION_STRING,
        "container": settings.LEASEBOARD_BLOB_CONTAINER,
        "timeout": settings.LEASEBOARD_BLOB_TIMEOUT,
    },
}


def store_arguments(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of a ``LEASEBOARD_STORES`` entry's backend: its connection from settings,
    then its ``"CONFIG"``."""
    connection = CONNECTIONS.get(entry["BACKEND"])
    return {**(connection() if connection is not None else {}), **entry.get("CONFIG", {})}


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
        store = _import(entry["BACKEND"], f"store {key!r}")(**store_arguments(entry))
        if entry.get("PROCESS_WIDE"):
            _process_wide[key] = store
    return Stores(ownership=store, checkpoints=store, controls=store)


async def close_stores(stores: Stores) -> None:
    """Close the stores that hold connections (each object once; process-wide ones stay open)."""
    keep = {id(store) for store in _process_wide.values()}
    seen: set[int] = set()
    for store in (stores.ownership, stores.checkpoints, stores.controls):
        # Judged by the store itself, not by a metrics wrapper around it (``instrument``).
        inner = store.wrapped if isinstance(store, InstrumentedStore) else store
        aclose = getattr(inner, "aclose", None)
        if aclose is not None and id(inner) not in seen | keep:
            seen.add(id(inner))
            await aclose()


def instrument(stores: Stores) -> Stores:
    """``stores`` with every call counted and timed in Prometheus (``workers.store_metrics.instrumented``).

    One wrapper per distinct store, so ``ownership is controls`` stays true where it was, and with it
    the one-request snapshot. Raises TypeError when a store lacks the protocol of its place.
    """
    wrapped: dict[int, object] = {}

    def wrap(store: object) -> object:
        return wrapped.setdefault(id(store), instrumented(store))

    ownership, checkpoints, controls = wrap(stores.ownership), wrap(stores.checkpoints), wrap(stores.controls)
    if not isinstance(ownership, OwnershipStore):
        raise TypeError(f"the ownership store {stores.ownership!r} is not an OwnershipStore")
    if not isinstance(checkpoints, CheckpointStore):
        raise TypeError(f"the checkpoint store {stores.checkpoints!r} is not a CheckpointStore")
    if not isinstance(controls, ControlStore):
        raise TypeError(f"the control store {stores.controls!r} is not a ControlStore")
    return Stores(ownership=ownership, checkpoints=checkpoints, controls=controls)
