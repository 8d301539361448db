"""Reading the Redis store's records: each hash field's JSON back into the model's records.

Every ``parse_*`` raises ValueError saying what is wrong with a field it cannot read at all (not a
JSON object, no owner, a partition id or sequence number that is none: a hand edit, another
program's data), and notes in ``flaws`` what it read around in a record it still returns (a time
that is not a finite number read as None, an ETag that is no non-empty string listed as a made-up
one, an owner level that is no integer read as 0: see ``balancer.stores.flaws``). The store logs
either once and skips the field it cannot read (see ``RedisStore.corrupt``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from balancer.errors import CorruptRecord
from balancer.model import Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord, check_partition_id
from balancer.stores.flaws import finite_time, made_up_etag, time_flaw

log = logging.getLogger("balancer.stores.redis")  # the store's own log: operators look for it there
T = TypeVar("T")


ENCODING_ERRORS = "surrogateescape"  # the clients' decoding: bytes that are not UTF-8 survive a round trip


def text(value: bytes | str) -> str:
    """A Redis reply as text (bytes decoded as UTF-8, undecodable bytes replaced)."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def stored_bytes(value: str) -> bytes:
    """The bytes Redis holds for a value the client decoded (see ``ENCODING_ERRORS``)."""
    return value.encode("utf-8", errors=ENCODING_ERRORS)


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
    """A time the record cannot be read without (ValueError when it is not a finite number)."""
    stamp = value.get(key)
    found = finite_time(stamp) if isinstance(stamp, str | int | float) else None
    if found is None:
        raise ValueError(f"{key!r} is {stamp!r}, not a time")
    return found


def _loose_time(value: Mapping[str, Any], key: str, flaws: list[str]) -> float | None:
    """A time the record can be read without: None (noted in ``flaws``) when it is not a finite number."""
    stamp = value.get(key)
    found = finite_time(stamp) if isinstance(stamp, str | int | float) else None
    if found is None:
        flaws.append(time_flaw(repr(key), stamp))
    return found


def parse_ownership(ref: HubRef, field: str, raw: str, flaws: list[str]) -> OwnershipRecord:
    value = _object(raw)
    owner = _string(value, "owner")
    pid = check_partition_id(field)
    level = value.get("level", 0)
    if not isinstance(level, int) or isinstance(level, bool):
        flaws.append(f"'level' is {level!r}, not an integer: read as 0")
        level = 0
    etag = value.get("etag")
    if not isinstance(etag, str) or not etag:
        listed = made_up_etag(stored_bytes(raw))  # what the scripts make up for it too (layout._READ)
        flaws.append(f"'etag' is {etag!r}, not a non-empty string: listed as {listed!r}")
        etag = listed
    return OwnershipRecord(ref, pid, owner, etag, _loose_time(value, "modified", flaws), level)


def parse_checkpoint(ref: HubRef, field: str, raw: str, flaws: list[str]) -> Checkpoint:
    value = _object(raw)
    sequence = value.get("sequence")
    if isinstance(sequence, int) and not isinstance(sequence, bool) and sequence >= 0:
        sequence = str(sequence)
    if not isinstance(sequence, str) or not sequence.isdigit():
        raise ValueError(f"'sequence' is {sequence!r}, not a sequence number")
    offset = value.get("offset")
    if isinstance(offset, int) and not isinstance(offset, bool):
        offset = str(offset)
    if offset is not None and not isinstance(offset, str):
        flaws.append(f"'offset' is {offset!r}, not a string: read as None")
        offset = None
    return Checkpoint(ref, check_partition_id(field), int(sequence), offset, _loose_time(value, "modified", flaws))


def parse_member(ref: HubRef, field: str, raw: str, flaws: list[str]) -> Member:
    """A member whose ``seen`` is not a finite number cannot be read: not alive (skipped until its
    worker's next heartbeat rewrites it)."""
    value = _object(raw)
    info = value.get("info", {})
    if not isinstance(info, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in info.items()):
        raise ValueError(f"'info' is {info!r}, not an object of strings")
    if not field:
        raise ValueError("empty owner id")
    return Member(ref, field, _time(value, "seen"), info)


def parse_control(ref: HubRef, field: str, raw: str, flaws: list[str]) -> Control:
    kind_text, _, target = field.partition("/")
    try:
        kind = ControlKind(kind_text)
    except ValueError:
        raise ValueError(f"unknown control kind {kind_text!r}") from None
    if not target:
        raise ValueError(f"{field!r} is not <kind>/<target>")
    value = _object(raw)
    return Control(ref, kind, target, _string(value, "value"), _loose_time(value, "created", flaws))


class Skipped:
    """The fields the latest listing of each hash could not read in full (``RedisStore.corrupt``), and
    the made-up ETags of the ownership fields it skipped (a first claim may replace those: ``etag_of``)."""

    def __init__(self) -> None:
        self._found: dict[tuple[str, str], CorruptRecord] = {}
        self._unread: dict[tuple[str, str], str] = {}  # skipped (hash, field) -> the made-up ETag of its value

    @property
    def records(self) -> list[CorruptRecord]:
        return list(self._found.values())

    def etag_of(self, key: str, field: str) -> str | None:
        """The made-up ETag of field ``field`` of hash ``key`` if the latest listing skipped it: a
        caller that saw its partition as never owned claims it with this, and so replaces it only
        if it is still the value that was skipped."""
        return self._unread.get((key, field))

    def unread(self, key: str) -> int:
        """How many fields of hash ``key`` the latest listings skipped as unreadable."""
        return sum(1 for k, _ in self._unread if k == key)

    def parsed(
        self, key: str, raw: Mapping[str, str], parse: Callable[[str, str, list[str]], T], whole: bool = True
    ) -> list[T]:
        """Every field of hash ``key`` (read as ``raw``: the whole hash, or with ``whole`` False some of
        its fields) that parses, whole or in part. Those that do not parse, or only in part, are logged
        once each until what is wrong with them changes, and remembered until they read again or (in
        a whole read) are gone."""
        out: list[T] = []
        for field, value in raw.items():
            where = (key, field)
            flaws: list[str] = []
            try:
                out.append(parse(field, value, flaws))
            except ValueError as exc:
                self._note(where, CorruptRecord(f"{key} field {field!r}", str(exc)), "skipped")
                self._unread[where] = made_up_etag(stored_bytes(value))
                continue
            self._unread.pop(where, None)
            if flaws:
                self._note(where, CorruptRecord(f"{key} field {field!r}", "; ".join(flaws)), "read in part")
            else:
                self._found.pop(where, None)
        if not whole:
            return out
        for where in [w for w in self._found if w[0] == key and w[1] not in raw]:
            del self._found[where]
        for where in [w for w in self._unread if w[0] == key and w[1] not in raw]:
            del self._unread[where]
        return out

    def _note(self, where: tuple[str, str], problem: CorruptRecord, done: str) -> None:
        known = self._found.get(where)
        if known is None or known.problem != problem.problem:
            log.warning("%s; %s", problem, done)
        self._found[where] = problem
