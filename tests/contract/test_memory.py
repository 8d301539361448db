"""The store contract on the in-memory reference store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, nullcontext

import pytest

from balancer.stores.memory import MemoryStore

from .base import StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    async def store(self) -> AsyncIterator[MemoryStore]:
        yield MemoryStore()

    def connect(self, store: MemoryStore) -> AbstractAsyncContextManager[MemoryStore]:
        return nullcontext(store)  # one process, one lock: every thread shares the instance
