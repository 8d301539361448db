"""The handler the chaos workers run: records every event it is handed, on the shared monotonic clock.

``--handler tests.chaos.recording.Recorder`` appends ``partition,sequence,owner,monotonic,malformed``
to ``$LEASEBOARD_RECORD_DIR/<process id>.csv``, flushed before the handler returns, so every event a
checkpoint covers is on disk even if the process is killed the next moment. A body that is not a
JSON object (the producer's malformed events) is recorded and then refused with ``MalformedEvent``,
which the pump sets aside to its dead-letter file without retrying.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from tests.chaos.evidence import Handling
from tests.workers.recording import RecordingHandler
from workers.handlers import MalformedEvent, PartitionContext
from workers.sources.base import ReceivedEvent


class Recorder(RecordingHandler):
    """``RecordingHandler``'s file and locking, with the time and whether the body was malformed on each line."""

    def __call__(self, event: ReceivedEvent, ctx: PartitionContext) -> None:
        malformed = not event.body.startswith(b"{")
        line = f"{event.partition_id},{event.sequence_number},{ctx.owner_id},{time.monotonic():.6f},{int(malformed)}\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
        if malformed:
            raise MalformedEvent(f"not a JSON object: {event.body[:20]!r}")


def read_handlings(directory: Path) -> list[Handling]:
    """Every handling recorded under ``directory`` (a line cut short by a kill is dropped)."""
    out = []
    for path in sorted(directory.glob("*.csv")):
        for line in path.read_text(encoding="utf-8").split("\n")[:-1]:
            partition, sequence, owner, at, malformed = line.split(",")
            out.append(Handling(partition, int(sequence), owner, float(at), malformed == "1"))
    return out


def stuck(event: ReceivedEvent, ctx: PartitionContext) -> None:
    """A handler that never returns (after leaving a mark): a graceful stop must give up on it."""
    (Path(os.environ["LEASEBOARD_RECORD_DIR"]) / "stuck").touch()
    threading.Event().wait()
