"""Replaying dead letters in place: handed to the handler of the worker that owns their partition,
not sent to the hub again.

The console writes a request, ``<hub>/inplace/<partition>.<id>.json`` beside the dead-letter
files (``request``): the consumer group, the sequence numbers, who asked and when. Under the replay
markers' lock it checks that none was replayed before (``AlreadyReplayed`` unless forced) and marks
each *pending* (``"to": "in place (pending)"``), so a replay to the hub meanwhile is refused.

The owner of the partition finds the request (``workers.runtime.inplace``), and while its lease
holds hands each dead letter, as it was read, with the property ``leaseboard-replayed-from`` added,
to its handler: its checkpoint does not move. Each outcome is a marker: ``"to": "in place by
<owner>"``, or ``"failed"`` with the error (the dead letter is then not replayed, and may be
replayed again). The request file is removed once every dead letter in it has an outcome. A worker
that loses the partition half way leaves the rest to the next owner, which skips those done
(their marker is no longer this request's pending one): each is handled at least once, and twice
only when a worker stops between a handler call and its marker.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.sources.base import ReceivedEvent

from .decode import with_property
from .files import Entry, add_marker, b64, markers_locked
from .replay import REPLAYED_FROM, AlreadyReplayed

REQUESTS = "inplace"  # the folder of the requests, beside the dead-letter files
PENDING = "in place (pending)"
_NAME = re.compile(r"(0|[1-9][0-9]{0,5})\.([0-9a-f]{32})\.json")


def requests_folder(folder: Path) -> Path:
    return folder / REQUESTS


@dataclass(frozen=True, slots=True)
class Request:
    """One in-place replay the console asked for."""

    path: Path
    id: str
    consumer_group: str
    partition_id: str
    sequence_numbers: tuple[int, ...]
    user: str

    @classmethod
    def load(cls, path: Path) -> Request:
        """The request in ``path``. Raises OSError (gone, unreadable) or ValueError (not a request)."""
        found = _NAME.fullmatch(path.name)
        if found is None:
            raise ValueError(f"{path.name} is not the name of an in-place request")
        try:
            data = json.loads(path.read_bytes())
            sequences = tuple(int(n) for n in data["sequence_numbers"])
            group, user = str(data["consumer_group"]), str(data.get("user") or "")
        except (KeyError, TypeError, ValueError, RecursionError):
            raise ValueError(f"{path.name} is not an in-place request") from None
        return cls(path, found.group(2), group, found.group(1), sequences, user)


def partition_of(path: Path) -> str | None:
    """The partition a request file's name says, None for a file that is no request."""
    found = _NAME.fullmatch(path.name)
    return None if found is None else found.group(1)


def request(
    folder: Path,
    consumer_group: str,
    partition: str,
    sequences: Sequence[int],
    *,
    user: str,
    force: bool = False,
    clock: Callable[[], float] = time.time,
) -> Request:
    """Ask the owner of ``partition`` to hand these dead letters to its handler; the request. Raises
    AlreadyReplayed (nothing asked) when one was replayed (or asked for) before and ``force`` is off."""
    with markers_locked(folder, partition, consumer_group) as (markers, f):
        before = {n: markers[n] for n in sequences if n in markers}
        if before and not force:
            raise AlreadyReplayed(before)
        rid = uuid.uuid4().hex
        path = requests_folder(folder) / f"{partition}.{rid}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"consumer_group": consumer_group, "sequence_numbers": list(sequences), "user": user, "at": clock()}
        staged = path.with_name(f".{path.name}.tmp")
        staged.write_text(json.dumps(body), encoding="utf-8")
        os.replace(staged, path)  # whole or not at all: a worker never reads half a request
        for n in sequences:
            add_marker(f, _marker(consumer_group, partition, n, rid, user, clock(), to=PENDING, again=n in before))
        return Request(path, rid, consumer_group, partition, tuple(sequences), user)


def _marker(group: str, partition: str, n: int, rid: str, user: str, at: float, **more: Any) -> Entry:
    fields = {"consumer_group": group, "partition_id": partition, "sequence_number": n, "request": rid}
    return {**fields, "user": user, "replayed_at": at, **more}


def to_handle(req: Request, markers: dict[int, Entry]) -> list[int]:
    """The sequence numbers of ``req`` still waiting for it: their marker is its pending one (a
    forced replay since, or an owner before this one, decided the others)."""
    return [n for n in req.sequence_numbers if (m := markers.get(n)) and m.get("request") == req.id and _pending(m)]


def _pending(marker: Entry) -> bool:
    return marker.get("to") == PENDING


def event_of(entry: Entry) -> ReceivedEvent:
    """The event a dead letter was, with ``leaseboard-replayed-from`` among its properties. Raises
    ValueError for an entry that cannot be one."""
    try:
        body, amqp = b64(entry["body_base64"]), b64(entry.get("amqp_base64"))
        partition, sequence = str(entry["partition_id"]), int(entry["sequence_number"])
        offset, enqueued = str(entry.get("offset") or ""), float(entry.get("enqueued_time") or 0.0)
        amqp = with_property(amqp, REPLAYED_FROM, f"{partition}:{sequence}")
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"dead letter {entry.get('sequence_number')} cannot be read: {exc}") from None
    key = entry.get("partition_key")
    return ReceivedEvent(partition, sequence, offset, enqueued, str(key) if key else None, body, amqp)


def settle(folder: Path, req: Request, outcomes: dict[int, str | None], owner: str, clock: Callable[[], float]) -> None:
    """Mark what happened to each dead letter of ``req`` handled now (``outcomes``: None when its
    handler call went through, else the error), and remove the request once none waits for it."""
    with markers_locked(folder, req.partition_id, req.consumer_group) as (markers, f):
        for n, error in outcomes.items():
            if not (m := markers.get(n)) or m.get("request") != req.id or not _pending(m):
                continue  # decided meanwhile (a forced replay)
            more = {"to": f"in place by {owner}"} if error is None else {"failed": error, "owner": owner}
            marker = _marker(req.consumer_group, req.partition_id, n, req.id, req.user, clock(), **more)
            add_marker(f, marker)
            markers[n] = marker
        if not to_handle(req, markers):
            req.path.unlink(missing_ok=True)
