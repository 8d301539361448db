"""The Blob Storage store's namespace: one List Blobs of ``<namespace>/`` with metadata (one request per
5,000 blobs), read as the store reads each hub's (``balancer.stores.blob.layout``).

Blob names are lowercased whole, as Microsoft's checkpoint store writes them, so a listing gives
``$default`` for ``$Default``: the configured hub and consumer group are given their configured
spelling back, the others keep the blobs' (the store reads either alike). The namespace is the
configured one. The listing uses a container client of its own, made from the same settings as the
store's (``LEASEBOARD_STORES``) and kept as long as the store, so a refresh costs only the listing
once the container is known.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from azure.storage.blob import BlobProperties
from django.conf import settings

from balancer.model import HubRef
from balancer.stores.blob.layout import parse_checkpoint, parse_control, parse_member, parse_ownership
from balancer.stores.blob.service import BlobContainer
from balancer.stores.blob.store import BlobStore
from workers.wiring.stores import store_arguments

from ..state import close_with_stores
from .everything import Everything, Records

# Where each kind of record sits below ``<namespace>/<hub>/<consumer group>/``, and how it is read.
KINDS: tuple[tuple[str, str, Callable[[HubRef, str, Any], Any]], ...] = (
    ("ownership/", "ownership", parse_ownership),
    ("checkpoint/", "checkpoints", parse_checkpoint),
    ("leaseboard/members/", "members", parse_member),
    ("leaseboard/controls/", "controls", parse_control),
)

# One container client per store, closed with the stores (``state.forget_stores``).
_containers: weakref.WeakKeyDictionary[BlobStore, BlobContainer] = weakref.WeakKeyDictionary()


def container_for(store: BlobStore) -> BlobContainer:
    """The listing's container client for ``store`` (made from the configured store's settings, once)."""
    found = _containers.get(store)
    if found is None:
        arguments = store_arguments(settings.LEASEBOARD_STORES[settings.LEASEBOARD_STORE])
        found = _containers[store] = BlobContainer(
            arguments.get("connection_string"),
            store.container,
            timeout=arguments.get("timeout", 10.0),
            retries=arguments.get("retries", 1),
        )
        close_with_stores(found.aclose)
    return found


def _spelled(namespace: str, hub: str, group: str) -> HubRef:
    configured = (settings.LEASEBOARD_HUB, settings.LEASEBOARD_CONSUMER_GROUP)
    if (hub, group) == (configured[0].lower(), configured[1].lower()):
        hub, group = configured
    return HubRef(namespace, hub, group)


def _read(blob: BlobProperties, prefix: str, namespace: str, found: Records) -> None:
    hub, _, rest = blob.name[len(prefix) :].partition("/")
    group, _, rest = rest.partition("/")
    for start, kind, parse in KINDS:
        if rest.startswith(start):
            try:
                ref = _spelled(namespace, hub, group)
                record = parse(ref, rest[len(start) :], blob)
            except ValueError:  # unreadable, or no record of ours: skipped, as the store's listing skips it
                return
            getattr(found, kind).append(record)
            return


async def read_blob(store: BlobStore, namespace: str) -> Everything:
    """Every record of ``namespace``. Raises StoreError (StoreUnavailable) as the store's calls do."""
    container = container_for(store)
    before = container.requests
    prefix = f"{namespace}/".lower()
    blobs = await container.list(prefix)
    now = await container.now()  # the listing's Date header: no request
    found = Records()
    for blob in blobs:
        _read(blob, prefix, namespace, found)
    requests = container.requests - before
    return Everything.of(now, requests, found.ownership, found.checkpoints, found.members, found.controls)
