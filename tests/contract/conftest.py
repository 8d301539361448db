"""Every contract test leaves no store thread (and so no store connection) behind; and a corrupt-record
test (marked ``damage(kind, *edits)``) runs once per edit of its kind that its store's class declares
in ``damages``, and is not collected at all for a store that holds none of them: nothing is skipped."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from .base import DAMAGES, EDITS, StoreContract


def held_edits(cls: type | None, test: Any) -> list[str] | None:
    """The edits ``test`` runs with on ``cls``'s store, in the order the marker names them; None if
    ``test`` is no corrupt-record test."""
    marks = [m for m in getattr(test, "pytestmark", []) if m.name == "damage"]
    if not marks:
        return None
    [mark] = marks
    kind, *edits = mark.args
    unknown = [e for e in edits if e not in EDITS.get(kind, ())]
    if unknown or not edits:
        raise pytest.UsageError(f"{test.__qualname__}: damage({kind!r}, ...) names no known edit or {unknown}")
    if cls is None or not issubclass(cls, StoreContract):
        raise pytest.UsageError(f"{test.__qualname__}: a damage test belongs to a StoreContract class")
    declared = getattr(cls, "damages", None)
    if not isinstance(declared, frozenset):
        raise pytest.UsageError(f"{cls.__name__} declares no damages (a frozenset of (kind, edit))")
    if declared - DAMAGES:
        raise pytest.UsageError(f"{cls.__name__}.damages names damages EDITS does not: {sorted(declared - DAMAGES)}")
    return [e for e in edits if (kind, e) in declared]


def pytest_pycollect_makeitem(collector: pytest.Module | pytest.Class, name: str, obj: object) -> list[Any] | None:
    """A corrupt-record test whose store holds none of its damages is not collected for it."""
    if isinstance(collector, pytest.Class) and collector.funcnamefilter(name) and callable(obj):
        edits = held_edits(collector.cls, obj)
        if edits == []:
            return []
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    edits = held_edits(metafunc.cls, metafunc.function)
    if edits is not None:
        metafunc.parametrize("edit", edits)


@pytest.fixture(autouse=True)
def _no_store_threads_left() -> Iterator[None]:
    yield
    left = [t.name for t in threading.enumerate() if t.name.startswith("sqlstore-")]
    assert not left, f"store threads still running (a store was not closed): {left}"
