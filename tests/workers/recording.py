"""A handler for end-to-end tests: records every event it handled, surviving a SIGKILL.

``--handler tests.workers.recording.RecordingHandler`` appends "partition,sequence,owner" to
``$LEASEBOARD_RECORD_DIR/<pid>.csv``, one line per event, flushed before the handler returns, so
every event a checkpoint covers is in the file even if the process is killed right after.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TextIO

from workers.deadletter.decode import properties_of
from workers.deadletter.replay import REPLAYED_FROM
from workers.handlers import PartitionContext
from workers.sources.base import ReceivedEvent


class RecordingHandler:
    def __init__(self) -> None:
        directory = Path(os.environ["LEASEBOARD_RECORD_DIR"])
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{os.getpid()}.csv"
        self._lock = threading.Lock()  # partitions are handled concurrently, one thread each
        self._file: TextIO = self.path.open("a", encoding="utf-8")

    def __call__(self, event: ReceivedEvent, ctx: PartitionContext) -> None:
        with self._lock:
            self._file.write(f"{event.partition_id},{event.sequence_number},{ctx.owner_id}\n")
            self._file.flush()


def read_records(directory: Path) -> list[tuple[str, int, str]]:
    """Every (partition, sequence number, owner) recorded under ``directory``, in file order."""
    out = []
    for path in sorted(directory.glob("*.csv")):
        complete = path.read_text(encoding="utf-8").split("\n")[:-1]  # a kill may cut the last line short
        for line in complete:
            partition, sequence, owner = line.split(",")
            out.append((partition, int(sequence), owner))
    return out


class FixableHandler(RecordingHandler):
    """A ``RecordingHandler`` that fails on a body ``broken`` until ``$LEASEBOARD_RECORD_DIR/fixed``
    exists (the bug fixed); it records the replay property of what it handled in ``<pid>.replays``."""

    def __call__(self, event: ReceivedEvent, ctx: PartitionContext) -> None:
        if event.body == b"broken" and not (self.path.parent / "fixed").exists():
            raise ValueError("cannot handle a broken body")
        super().__call__(event, ctx)
        replayed = properties_of(event.amqp).get(REPLAYED_FROM) if event.amqp else None
        if replayed is not None:
            with self._lock, self.path.with_suffix(".replays").open("a", encoding="utf-8") as f:
                f.write(f"{replayed},{event.sequence_number},{ctx.owner_id}\n")
