"""Reading the Redis store's records: each hash field's JSON back into the model's records.

Every ``parse_*`` raises ValueError saying what is wrong with a field (a hand edit, another
program's data); the store logs it once and skips the field (see ``RedisStore.corrupt``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from balancer.errors import CorruptRecord
from balancer.model import Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord, check_partition_id

log = logging.getLogger("balancer.stores.redis")  # the store's own log: operators look for it there
T = TypeVar("T")


def text(value: bytes | str) -> str:
    """A Redis reply as text (bytes decoded as UTF-8, undecodable bytes replaced)."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def texts(raw: Mapping[Any, Any]) -> dict[str, str]:
    """A hash as Redis returned it, keys and values as text."""
    return {text(k): text(v) for k, v in raw.items()}


def server_time(seconds: Any, micros: Any) -> float:
    """Redis ``TIME``'s pair as seconds, exactly as the scripts write ``now`` (decimal, microseconds)."""
    return float(f"{int(seconds)}.{int(micros):06d}")


def _object(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        raise ValueError(f"{raw[:80]!r} is not JSON") from None
    if not isinstance(value, dict):
        raise ValueError(f"{raw[:80]!r} is not a JSON object")
    return value


def _string(value: Mapping[str, Any], key: str) -> str:
    found = value.get(key)
    if not isinstance(found, str):
        raise ValueError(f"{key!r} is {found!r}, not a string")
    return found


def _time(value: Mapping[str, Any], key: str) -> float:
    stamp = _string(value, key)
    try:
        return float(stamp)
    except ValueError:
        raise ValueError(f"{key!r} is {stamp!r}, not a time") from None


def parse_ownership(ref: HubRef, field: str, raw: str) -> OwnershipRecord:
    value = _object(raw)
    level = value.get("level", 0)
    if not isinstance(level, int):
        raise ValueError(f"'level' is {level!r}, not an integer")
    return OwnershipRecord(
        ref, check_partition_id(field), _string(value, "owner"), _string(value, "etag"), _time(value, "modified"), level
    )


def parse_checkpoint(ref: HubRef, field: str, raw: str) -> Checkpoint:
    value = _object(raw)
    sequence = _string(value, "sequence")
    if not sequence.isdigit():
        raise ValueError(f"'sequence' is {sequence!r}, not a sequence number")
    offset = value.get("offset")
    if offset is not None and not isinstance(offset, str):
        raise ValueError(f"'offset' is {offset!r}, not a string")
    return Checkpoint(ref, check_partition_id(field), int(sequence), offset, _time(value, "modified"))


def parse_member(ref: HubRef, field: str, raw: str) -> Member:
    value = _object(raw)
    info = value.get("info", {})
    if not isinstance(info, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in info.items()):
        raise ValueError(f"'info' is {info!r}, not an object of strings")
    if not field:
        raise ValueError("empty owner id")
    return Member(ref, field, _time(value, "seen"), info)


def parse_control(ref: HubRef, field: str, raw: str) -> Control:
    kind_text, _, target = field.partition("/")
    try:
        kind = ControlKind(kind_text)
    except ValueError:
        raise ValueError(f"unknown control kind {kind_text!r}") from None
    if not target:
        raise ValueError(f"{field!r} is not <kind>/<target>")
    value = _object(raw)
    return Control(ref, kind, target, _string(value, "value"), _time(value, "created"))


class Skipped:
    """The fields the latest listing of each hash could not read (``RedisStore.corrupt``)."""

    def __init__(self) -> None:
        self._found: dict[tuple[str, str], CorruptRecord] = {}

    @property
    def records(self) -> list[CorruptRecord]:
        return list(self._found.values())

    def parsed(self, key: str, raw: Mapping[str, str], parse: Callable[[str, str], T]) -> list[T]:
        """Every field of hash ``key`` (read as ``raw``) that parses. The rest are logged, once each
        until what is wrong with them changes, and remembered until they read again or are gone."""
        out: list[T] = []
        for field, value in raw.items():
            where = (key, field)
            try:
                out.append(parse(field, value))
            except ValueError as exc:
                problem = CorruptRecord(f"{key} field {field!r}", str(exc))
                known = self._found.get(where)
                if known is None or known.problem != problem.problem:
                    log.warning("%s; skipped", problem)
                self._found[where] = problem
                continue
            self._found.pop(where, None)
        for where in [w for w in self._found if w[0] == key and w[1] not in raw]:
            del self._found[where]
        return out
