"""Every contract test leaves no store thread (and so no store connection) behind."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _no_store_threads_left() -> Iterator[None]:
    yield
    left = [t.name for t in threading.enumerate() if t.name.startswith("sqlstore-")]
    assert not left, f"store threads still running (a store was not closed): {left}"
