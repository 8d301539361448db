"""The handler the partition suite's workers run, and what the checker reads back from the landing.

``--handler tests.netsplit.landing.LandingRecorder``: the production landing (``workers.landing``:
one durable Parquet file per batch, its writer in the file's metadata, a range landed again kept
beside the first file, never over it), which also records every event it is handed the way the
chaos suite's ``Recorder`` does (partition, sequence, owner, monotonic time), before landing it.

``read_landing`` reads every landing file of a hub, hidden copies included: partition, the sequence
numbers it holds, the writer its metadata names (owner and tenure) and when the kernel says it was
written (its ``st_mtime``, the machine's wall clock: the stores' clock here). The workers set
neither after the fact; the checker (``landed``) judges them against the store's history.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.chaos.recording import Recorder
from workers.handlers import NotHeld, PartitionContext, batch_handler
from workers.landing import MAX_EVENTS, LandingHandler, sequence_range, writer_of
from workers.sensors import SensorEvent
from workers.sources.base import ReceivedEvent

LINGER = 0.2  # seconds: a file per partition about five times a second under the producer's trickle


@batch_handler(max_events=MAX_EVENTS)
class LandingRecorder(LandingHandler):
    """``LandingHandler`` with every event recorded (``tests.chaos.recording``) before it lands."""

    def __init__(self) -> None:
        super().__init__(linger=LINGER, alerts=False)  # the fast alerts are not what this suite checks
        self._recorder = Recorder()
        self._recorded: dict[str, str] = {}  # partition -> when its batch being handled was recorded

    def __call__(self, events: list[ReceivedEvent], ctx: PartitionContext) -> None:
        # raises NotHeld (nothing recorded) once the lease may have run out
        self._recorded[ctx.partition_id] = self._recorder.record(events, ctx)
        super().__call__(events, ctx)

    def land(self, ctx: PartitionContext, landed: Sequence[tuple[ReceivedEvent, SensorEvent]]) -> Path:
        """The production landing; when it refuses the batch (``NotHeld``: the lease may have run out
        between the recording and the file's rename, nothing landed) the recording of its events is
        retracted, since the pump hands them on again (a store slow under load did this once: the same
        120 events then counted as handled twice with no fault to explain it)."""
        try:
            return super().land(ctx, landed)
        except NotHeld:
            self._recorder.retract([event for event, _ in landed], ctx, self._recorded[ctx.partition_id])
            raise


@dataclass(frozen=True, slots=True)
class LandedFile:
    """One landing file as the checker reads it."""

    partition: str
    name: str
    sequences: tuple[int, ...]
    owner: str  # "" when the file names no writer
    tenure: str
    written: float  # st_mtime: wall clock, seconds since the epoch

    @property
    def writer(self) -> tuple[str, str]:
        return (self.owner, self.tenure)


def read_landing(root: Path, hub: str) -> tuple[list[LandedFile], list[str]]:
    """Every landing file under ``root/hub`` (a partition's folder each; hidden copies included, temporary
    files not), and what could not be read (each a problem: a landing file is complete or absent)."""
    files, problems = [], []
    folder = root / hub
    for partition in (
        sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
        if folder.is_dir()
        else []
    ):
        for path in sorted(partition.iterdir()):
            visible = sequence_range(path.name) is not None
            if not visible and not (path.name.startswith(".") and ".parquet." in path.name):
                continue  # a temporary file (".tmp-..."): never a landed one
            try:
                writer = writer_of(path) or {}
                sequences = pq.read_table(path, columns=["sequence_number"]).column(0).to_pylist()
                written = os.stat(path).st_mtime
            except (OSError, pa.ArrowException) as exc:
                problems.append(f"landing: {path.relative_to(root)} cannot be read: {exc}")
                continue
            files.append(
                LandedFile(
                    partition.name,
                    path.name,
                    tuple(sequences),
                    str(writer.get("owner_id", "")),
                    str(writer.get("tenure", "")),
                    written,
                )
            )
    return files, problems
