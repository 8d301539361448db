"""The store contract on the in-memory reference store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import replace
from typing import Any

import pytest

from balancer.stores.memory import MemoryStore

from .base import DAMAGES, FUTURE, GARBAGE_ETAG, GHOST, REF, StoreContract
from .changes import ChangeFeedContract

# What a test or the simulator could plant (nothing else writes this store): the value as stored.
TIMES: dict[str, Any] = {
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": float("-inf"),
    "garbage": "garbage",
    "missing": None,
}


class TestMemoryStore(ChangeFeedContract, StoreContract):
    notices = True

    async def delete_by_hand(self, store: MemoryStore, partition_id: str) -> None:
        del store._ownership[(REF, partition_id)]  # nothing but a test can: the store never deletes

    async def start_over(self, store: MemoryStore) -> MemoryStore:
        return MemoryStore()  # a process that restarted: a new store, whose cursors are its own

    @pytest.fixture
    async def store(self) -> AsyncIterator[MemoryStore]:
        yield MemoryStore()

    def connect(self, store: MemoryStore) -> AbstractAsyncContextManager[MemoryStore]:
        return nullcontext(store)  # one process, one lock: every thread shares the instance

    damages = DAMAGES - {
        ("ownership", "unreadable"),  # records in memory are made by the store itself: all can be read
        ("ownership", "partition"),  # records in memory are made (and their partition ids checked) by the store
        ("checkpoint", "sequence"),  # a checkpoint's sequence number is checked when the record is made
        ("member", "info"),  # a member's info is typed in memory: nothing can plant garbage there
    }

    async def corrupt(self, store: MemoryStore, kind: str, key: str, edit: str) -> None:
        records: Any = {"ownership": store._ownership, "checkpoint": store._checkpoints, "member": store._members}
        table = records[kind]
        current = table.get((REF, key))
        if (kind, edit) == ("member", "time"):
            table[(REF, key)] = replace(current, last_seen=float("nan"))
        elif (kind, edit) == ("checkpoint", "time"):
            table[(REF, key)] = replace(current, last_modified="garbage")
        elif edit.startswith("time:"):
            table[(REF, key)] = replace(current, last_modified=TIMES[edit.removeprefix("time:")])
        elif edit.startswith("etag:"):
            table[(REF, key)] = replace(current, etag=GARBAGE_ETAG if edit == "etag:garbage" else None)
        elif edit == "ghost":
            table[(REF, key)] = replace(current, owner_id=GHOST, etag=GARBAGE_ETAG, last_modified=float("nan"))
        else:
            assert edit == "future", f"{kind} {edit} is not among {type(self).__name__}.damages"
            table[(REF, key)] = replace(current, last_modified=FUTURE)
