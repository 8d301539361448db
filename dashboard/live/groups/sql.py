"""The SQL store's namespace, in one request of the store (``SqlStore.read_namespace``)."""

from __future__ import annotations

from ...sql.store import SqlStore
from .everything import Everything


async def read_sql(store: SqlStore, namespace: str) -> Everything:
    read = await store.read_namespace(namespace)
    return Everything.of(read.now, 1, read.ownership, read.checkpoints, read.members, read.controls)
