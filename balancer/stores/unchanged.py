"""Small listings read again unchanged are not parsed again.

Every cycle of every worker lists the hub's members and controls in full. They rarely change, and
parsing them (JSON, converters, checks) cost more than reading them, so a store keeps the last
whole read of each, as the store gave it, beside the records it made of them: a read equal to it
gives the same records again. Records are immutable, so sharing them is safe; each caller gets a
list of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class LastReads:
    """Per listing (a key of the store's choosing), its last read as the store gave it and its records."""

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[Any, list[Any]]] = {}

    def records(self, key: Hashable, raw: Any, parse: Callable[[], list[T]]) -> list[T]:
        """``parse()``'s records of ``raw``, the listing ``key`` as just read; the last ones again
        when ``raw`` equals the last read of ``key``. ``raw`` must not change afterwards."""
        last = self._last.get(key)
        if last is not None and last[0] == raw:
            return list(last[1])
        records = parse()
        self._last[key] = (raw, records)
        return list(records)
