"""The handler the chaos workers run: records every event it is handed, on the shared monotonic clock.

``--handler tests.chaos.recording.Recorder`` appends ``partition,sequence,owner,monotonic,malformed``
to ``$LEASEBOARD_RECORD_DIR/<process id>.csv``, flushed before the handler returns, so every event a
checkpoint covers is on disk even if the process is killed the next moment. A body that is not a
JSON object (the producer's malformed events) is recorded and then refused with ``MalformedEvent``,
which the pump sets aside to its dead-letter file without retrying.

Each line's time is read first, then the lease is looked at (``ctx.holds()``); when it may have run
out nothing is recorded and ``NotHeld`` hands the event back to the pump, as the landing does before
its rename. So a recorded time is always one at which the worker's lease still held by its own
clock, even when the thread was stopped (SIGSTOP, a starved CPU) between the pump's look at the
lease and the handler's: the chaos suite once saw an event recorded 2 s after the lease had gone.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from tests.chaos.evidence import Handling
from tests.workers.recording import RecordingHandler
from workers.handlers import MalformedEvent, NotHeld, PartitionContext
from workers.sources.base import ReceivedEvent


class Recorder(RecordingHandler):
    """``RecordingHandler``'s file and locking, with the time and whether the body was malformed on each line."""

    def __call__(self, event: ReceivedEvent, ctx: PartitionContext) -> None:
        self.record([event], ctx)
        if not event.body.startswith(b"{"):
            raise MalformedEvent(f"not a JSON object: {event.body[:20]!r}")

    def record(self, events: Sequence[ReceivedEvent], ctx: PartitionContext) -> None:
        """One line per event, all with the time read before the lease was found still held."""
        at = time.monotonic()
        if not ctx.holds():
            raise NotHeld(f"partition {ctx.partition_id}: the lease of {ctx.owner_id} may have run out")
        lines = "".join(
            f"{e.partition_id},{e.sequence_number},{ctx.owner_id},{at:.6f},{int(not e.body.startswith(b'{'))}\n"
            for e in events
        )
        with self._lock:
            self._file.write(lines)
            self._file.flush()


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
