"""One read of every record of a namespace, whatever the store (``read_everything``).

A store whose layout can be listed whole has a reader here, named by the store's class as
``LEASEBOARD_STORES`` names it and imported when that store is used (its client library only then):
the SQL store reads the namespace in one request, Redis with a ``SCAN`` and one pipeline, Blob
Storage with one List Blobs. Any other store (the in-memory one, or one added to
``LEASEBOARD_STORES``) is read hub by hub through the store protocols, for the groups this console
has in view (the configured one and those with a monitor): its requests grow with the groups.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.utils.module_loading import import_string

from balancer.model import Checkpoint, Control, HubRef, Member, OwnershipRecord
from workers.store_metrics import InstrumentedStore
from workers.wiring import Stores

# The reader of each store class (by its dotted path, as LEASEBOARD_STORES names it).
READERS: dict[str, str] = {
    "dashboard.sql.store.SqlStore": "dashboard.live.groups.sql.read_sql",
    "balancer.stores.redis.store.RedisStore": "dashboard.live.groups.redis.read_redis",
    "balancer.stores.blob.store.BlobStore": "dashboard.live.groups.blob.read_blob",
}


@dataclass
class Records:
    """The records of one hub and consumer group."""

    ownership: list[OwnershipRecord] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    members: list[Member] = field(default_factory=list)
    controls: list[Control] = field(default_factory=list)

    @property
    def known(self) -> bool:
        """Whether the store knows the group as ``Host.known`` does: an ownership record or a member."""
        return bool(self.ownership or self.members)


@dataclass(frozen=True, slots=True)
class Everything:
    """Every record of one namespace as one read saw them, at the store's clock ``now``;
    ``requests``: what the read cost the store."""

    now: float
    ownership: tuple[OwnershipRecord, ...]
    checkpoints: tuple[Checkpoint, ...]
    members: tuple[Member, ...]
    controls: tuple[Control, ...]
    requests: int

    @classmethod
    def of(
        cls,
        now: float,
        requests: int,
        ownership: Iterable[OwnershipRecord] = (),
        checkpoints: Iterable[Checkpoint] = (),
        members: Iterable[Member] = (),
        controls: Iterable[Control] = (),
    ) -> Everything:
        return cls(now, tuple(ownership), tuple(checkpoints), tuple(members), tuple(controls), requests)

    def groups(self) -> dict[HubRef, Records]:
        """The records of each group the store knows (``Records.known``), by hub then consumer group."""
        found: dict[HubRef, Records] = {}
        for records, name in (
            (self.ownership, "ownership"),
            (self.checkpoints, "checkpoints"),
            (self.members, "members"),
            (self.controls, "controls"),
        ):
            for record in records:
                getattr(found.setdefault(record.ref, Records()), name).append(record)
        known = (ref for ref, each in found.items() if each.known)
        return {ref: found[ref] for ref in sorted(known, key=lambda r: (r.hub, r.consumer_group))}


Reader = Callable[[Any, str], Awaitable[Everything]]


def _unwrapped(store: object) -> object:
    return store.wrapped if isinstance(store, InstrumentedStore) else store


def reader_of(stores: Stores) -> Reader | None:
    """The namespace reader of ``stores`` (one object behind all three protocols, as every adapter
    so far), or None when it has none."""
    store = _unwrapped(stores.ownership)
    if _unwrapped(stores.checkpoints) is not store or _unwrapped(stores.controls) is not store:
        return None
    path = READERS.get(f"{type(store).__module__}.{type(store).__qualname__}")
    return import_string(path) if path is not None else None


async def read_everything(stores: Stores, namespace: str, candidates: Iterable[HubRef] = ()) -> Everything:
    """Every record of ``namespace`` in ``stores``: one read where the store has a reader, else the
    ``candidates`` read one by one. Raises the store's error when it cannot be read."""
    reader = reader_of(stores)
    if reader is not None:
        return await reader(_unwrapped(stores.ownership), namespace)
    return await read_each(stores, [ref for ref in dict.fromkeys(candidates) if ref.namespace == namespace])


async def read_each(stores: Stores, refs: list[HubRef]) -> Everything:
    """``refs`` read through the protocols: the clock, then four listings each."""
    now = await stores.ownership.now()
    read = Records()
    for ref in refs:
        read.ownership += await stores.ownership.list_ownership(ref)
        read.checkpoints += await stores.checkpoints.list_checkpoints(ref)
        read.members += await stores.controls.list_members(ref)
        read.controls += await stores.controls.list_controls(ref)
    return Everything.of(now, 1 + 4 * len(refs), read.ownership, read.checkpoints, read.members, read.controls)
