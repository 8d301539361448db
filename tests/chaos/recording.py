"""The handler the chaos workers run: records every event it is handed, on the shared monotonic clock.

``--handler tests.chaos.recording.Recorder`` appends ``partition,sequence,owner,monotonic,malformed``
(``malformed`` 0 or 1; ``r`` on a line that retracts the handling of the same partition, sequence,
owner and time, see ``Recorder.retract``) to ``$LEASEBOARD_RECORD_DIR/<process id>.csv``, flushed
before the handler returns, so every event a checkpoint covers is on disk even if the process is
killed the next moment. A body that is not a
JSON object (the producer's malformed events) is recorded and then refused with ``MalformedEvent``,
which the pump sets aside to its dead-letter file without retrying. A partition named by ``stall``
gets one handler call that never returns (the "stuck-handler" fault); one named by ``slow``, calls
slower than the handler timeout in one process (the "slow-handler" fault).

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
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.chaos.evidence import Handling
from tests.workers.recording import RecordingHandler
from workers.handlers import MalformedEvent, NotHeld, PartitionContext
from workers.sources.base import ReceivedEvent

RETRACTED = "r"  # the last field of a line that takes back a handling recorded before (``retract``)
STALL = "stall-"  # a file named so and the partition id, in the record directory: ``stall``
SLOW = "slow-"  # likewise: ``slow``


def slow(directory: Path, partition_id: str, process_id: int, seconds: float) -> None:
    """Every handler call on ``partition_id`` in the process ``process_id`` takes ``seconds`` more (the
    "slow-handler" fault: a handler slower than the timeout on every event, on one worker), until ``fast``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{SLOW}{partition_id}"
    temporary = path.with_name(f".{path.name}")
    temporary.write_text(f"{process_id} {seconds}", encoding="ascii")
    temporary.replace(path)


def fast(directory: Path, partition_id: str) -> None:
    (directory / f"{SLOW}{partition_id}").unlink(missing_ok=True)


def stall(directory: Path, partition_id: str) -> None:
    """The next handler call on ``partition_id`` (in any worker recording into ``directory``) never returns."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{STALL}{partition_id}").touch()


class Recorder(RecordingHandler):
    """``RecordingHandler``'s file and locking, with the time and whether the body was malformed on each line."""

    def __call__(self, event: ReceivedEvent, ctx: PartitionContext) -> None:
        self._stall_if_asked(event.partition_id)
        self._slow_if_asked(event.partition_id)
        self.record([event], ctx)
        if not event.body.startswith(b"{"):
            raise MalformedEvent(f"not a JSON object: {event.body[:20]!r}")

    def _stall_if_asked(self, partition_id: str) -> None:
        """The "stuck-handler" fault (``stall``): the first call on ``partition_id`` that finds the
        fault's file takes it and never returns (its thread waits for ever; the worker must give it up)."""
        asked = self.path.parent / f"{STALL}{partition_id}"
        if not asked.exists():
            return
        try:
            asked.unlink()  # one call takes it, in whichever process
        except FileNotFoundError:
            return
        threading.Event().wait()

    def _slow_if_asked(self, partition_id: str) -> None:
        """The "slow-handler" fault (``slow``): this call takes the fault's seconds more, in its process."""
        try:
            process, seconds = (self.path.parent / f"{SLOW}{partition_id}").read_text(encoding="ascii").split()
        except (FileNotFoundError, ValueError):
            return
        if process == str(os.getpid()):
            time.sleep(float(seconds))  # the fault itself: a handler this slow

    def record(self, events: Sequence[ReceivedEvent], ctx: PartitionContext) -> str:
        """One line per event, all with the time read before the lease was found still held; that time
        as written (what ``retract`` names)."""
        at = f"{time.monotonic():.6f}"
        if not ctx.holds():
            raise NotHeld(f"partition {ctx.partition_id}: the lease of {ctx.owner_id} may have run out")
        self._write(events, ctx, at, lambda e: str(int(not e.body.startswith(b"{"))))
        return at

    def retract(self, events: Sequence[ReceivedEvent], ctx: PartitionContext, at: str) -> None:
        """The handling of ``events`` recorded at ``at`` took no effect: the handler refused them
        (``NotHeld`` before anything landed) and the pump hands them on again, to this worker once its
        lease is renewed or to the next owner. Not a handling, so not a duplicate when they come back."""
        self._write(events, ctx, at, lambda _: RETRACTED)

    def _write(
        self, events: Sequence[ReceivedEvent], ctx: PartitionContext, at: str, last: Callable[[ReceivedEvent], str]
    ) -> None:
        lines = "".join(f"{e.partition_id},{e.sequence_number},{ctx.owner_id},{at},{last(e)}\n" for e in events)
        with self._lock:
            self._file.write(lines)
            self._file.flush()


def read_handlings(directory: Path) -> list[Handling]:
    """Every handling recorded under ``directory`` and not retracted (a line cut short by a kill is
    dropped)."""
    recorded, retracted = [], set()
    for path in sorted(directory.glob("*.csv")):
        for line in path.read_text(encoding="utf-8").split("\n")[:-1]:
            partition, sequence, owner, at, last = line.split(",")
            if last == RETRACTED:
                retracted.add((partition, sequence, owner, at))
            else:
                recorded.append((partition, sequence, owner, at, last == "1"))
    return [
        Handling(partition, int(sequence), owner, float(at), malformed)
        for partition, sequence, owner, at, malformed in recorded
        if (partition, sequence, owner, at) not in retracted
    ]


def stuck(event: ReceivedEvent, ctx: PartitionContext) -> None:
    """A handler that never returns (after leaving a mark): a graceful stop must give up on it."""
    (Path(os.environ["LEASEBOARD_RECORD_DIR"]) / "stuck").touch()
    threading.Event().wait()
