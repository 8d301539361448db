"""Events a pump set aside after its handler failed on them, kept for an operator to look at.

Each goes to ``<dead_letter_dir>/<hub>/<partition>.jsonl``, one JSON object per line with
partition, sequence number, offset, error, the body in base64 and, when the event had any, its
other AMQP sections (its properties) in base64 (and the latest ones in memory, for tests and status
output). ``workers.deadletter`` reads, replays and purges them. Setting an event aside moves the
checkpoint past it: the pump's retry policy (``workers.runtime.pump``) decides when.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path
from typing import Any

from balancer.model import HubRef
from workers.deadletter.files import append_line
from workers.sources.base import ReceivedEvent


class DeadLetters:
    """Events set aside: appended to ``<directory>/<hub>/<partition>.jsonl``, the latest kept here."""

    def __init__(self, directory: Path | None, keep: int = 1000) -> None:
        self.directory = directory
        self.entries: list[dict[str, Any]] = []
        self.keep = keep
        self._lock = threading.Lock()  # one DeadLetters serves every pump thread of a process

    def path(self, ref: HubRef, partition_id: str) -> Path | None:
        """The file of ``partition_id``'s dead letters; None when they are kept in memory only."""
        return None if self.directory is None else self.directory / ref.hub / f"{partition_id}.jsonl"

    def add(self, ref: HubRef, owner_id: str, event: ReceivedEvent, error: BaseException, attempts: int) -> None:
        """Record ``event`` (blocking file I/O: call it from a pump's thread). Raises OSError when
        the file cannot be written."""
        entry = {
            "namespace": ref.namespace,
            "hub": ref.hub,
            "consumer_group": ref.consumer_group,
            "partition_id": event.partition_id,
            "sequence_number": event.sequence_number,
            "offset": event.offset,
            "enqueued_time": event.enqueued_time,
            "partition_key": event.partition_key,
            "owner_id": owner_id,
            "attempts": attempts,
            "error": f"{type(error).__name__}: {error}",
            "set_aside_at": time.time(),
            "body_base64": base64.b64encode(event.body).decode("ascii"),
        }
        if event.amqp:
            entry["amqp_base64"] = base64.b64encode(event.amqp).decode("ascii")
        path = self.path(ref, event.partition_id)
        with self._lock:
            if path is not None:
                # One write of one line, under the file's lock: a purge (workers.deadletter) loses none.
                append_line(path, json.dumps(entry, sort_keys=True) + "\n")
            self.entries.append(entry)
            del self.entries[: -self.keep]
