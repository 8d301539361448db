"""Landing: each partition's sensor events as Parquet micro-batches, the Spark pipeline's input.

``--handler workers.landing.LandingHandler`` (a batch handler). Each call writes the batch's
events as ONE Parquet file ``<root>/<hub>/<partition>/<first>-<last>.parquet``, named by the
partition's sequence range, where ``root`` is ``LEASEBOARD_LANDING_DIR`` (default
``<var>/landing``; any path the workers and Spark share).

Durability before checkpoint. The file is written under a hidden temporary name in the same
folder, fsynced, moved into place (a hard link, then the temporary name removed) and the folder
fsynced, all before the handler returns; the pump checkpoints only after the handler returns
(``workers.runtime.pump``). A crash at any point leaves
either no file (the events come again from the old checkpoint) or a complete one, never a torn
one under a final name. Spark ignores hidden names (leading "." or "_"), so it never reads a
temporary file.

Only inside the lease. The handler asks ``ctx.holds()`` after reading the file's writer time and
again just before the file appears, and raises ``NotHeld`` (nothing lands; the pump keeps the batch
and pauses) once the lease may have run out: a worker stalled in the middle of a batch (SIGSTOP, a
starved CPU) must not land it after its lease, when the next owner may be landing the same range.
``leaseboard_landing_abandoned_total`` counts these. Only a stall between that last look and the
rename (a few system calls) can still show a file after the lease.

At least once. A worker that dies after landing but before checkpointing leaves events that the
next owner lands again: the same events with the same partition and sequence number, in a file
of the same or another range. ``workers.pipeline`` drops these duplicates by (partition_id,
sequence_number).

The writer of each file. Every file says who landed it, in its Parquet key-value metadata
(``WRITER_KEY``: JSON with the owner id, the tenure, the host, the process id and the wall-clock
time of the write; ``writer_of`` reads it back). The tenure is a token drawn at the pump's first
file: one owner's uninterrupted run of a partition (a pump lives for one; the lease's ETag is not
handed to handlers, ``PartitionContext`` carries none, so the token is the lease's identity here).
The writer is NOT in the file's name: the pipeline parses ``<first>-<last>.parquet`` with both
sides all digits (``workers.pipeline.ranges.landed_file``), and any other name sends its batch down
the slow exact path. So a range landed again never replaces the file already there (it is linked
into place only if the name is free): the later copy is kept beside it under a hidden name,
``.<first>-<last>.parquet.<owner>.<token>.<random>``, which neither Spark (hidden, and not ``*.parquet``)
nor the pipeline's audit reads; its rows are the ones already landed. Two owners landing the same
range leave two files, each naming its writer.

Malformed bodies. An event that is not a sensor reading is set aside through the pump's
dead-letter mechanism (``workers.runtime.deadletters.DeadLetters``: ``<dead-letter dir>/<hub>/<partition>.jsonl``
with partition, sequence number, offset, error and body; ``leaseboard_dead_letters_total``) and the
rest of the batch lands. Raising ``MalformedEvent`` instead would set aside the whole batch.

Alerts at once. Once a file is durable, its alerting events go to the process's alert writer
(``workers.pipeline.alerts``), which raises them in the database and wakes the console's live feed
within milliseconds, long before the Spark pipeline's batch raises them again (once: the first copy
stays). ``LEASEBOARD_LANDING_ALERTS = False`` leaves it to the pipeline alone.

Small files. A partition with a trickle of events would otherwise land a file per read (every
50 ms). After landing a batch that was not full, the handler waits ``linger`` seconds (counted
from that file) before returning, so events pile up in the hub meanwhile: about one file per
partition per ``linger`` seconds at most, and no wait at all while there is a backlog. The linger is
also how long an event may wait in the hub before its alert is raised: short (0.2 s by default).
The wait is in the partition's own thread, after the file is durable; lease renewal never waits.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from workers.runtime.deadletters import DeadLetters
from workers.sources.base import ReceivedEvent

from . import alerts as fast_alerts
from . import metrics
from .handlers import NotHeld, PartitionContext, batch_handler, parse_sensor_event
from .landing_files import MARKERS as MARKERS
from .landing_files import file_name as file_name
from .landing_files import landing_root as landing_root
from .landing_files import read_markers as read_markers
from .landing_files import sequence_range as sequence_range
from .sensors import SensorEvent

log = logging.getLogger("leaseboard.landing")

MAX_EVENTS = 5000  # events per handler call, so per landing file
DEFAULT_LINGER = 0.2  # seconds; an alert waits up to this long in the hub

UTC_MICROS = pa.timestamp("us", tz="UTC")
# What a landing file holds, one row per event. workers.pipeline.schema.LANDING is the same for Spark.
ARROW_SCHEMA = pa.schema(
    [
        pa.field("partition_id", pa.string(), nullable=False),
        pa.field("sequence_number", pa.int64(), nullable=False),
        pa.field("offset", pa.string(), nullable=False),
        pa.field("enqueued_time", UTC_MICROS, nullable=False),
        pa.field("partition_key", pa.string()),
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("home", pa.string(), nullable=False),
        pa.field("sensor", pa.string(), nullable=False),
        pa.field("sensor_id", pa.string(), nullable=False),
        pa.field("event", pa.string(), nullable=False),
        pa.field("armed", pa.bool_(), nullable=False),
        pa.field("event_time", UTC_MICROS, nullable=False),
    ]
)
WRITER_KEY = b"leaseboard.writer"  # Parquet key-value metadata: who landed the file (``writer_of``)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_NO_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV)  # file systems without hard links


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def to_table(landed: Sequence[tuple[ReceivedEvent, SensorEvent]]) -> pa.Table:
    """The rows of ``landed`` (event as received, its parsed body) in the landing schema."""
    columns: dict[str, list[Any]] = {name: [] for name in ARROW_SCHEMA.names}
    for received, reading in landed:
        columns["partition_id"].append(received.partition_id)
        columns["sequence_number"].append(received.sequence_number)
        columns["offset"].append(received.offset)
        columns["enqueued_time"].append(_utc(received.enqueued_time))
        columns["partition_key"].append(received.partition_key)
        columns["event_id"].append(reading.event_id)
        columns["home"].append(reading.home)
        columns["sensor"].append(reading.sensor)
        columns["sensor_id"].append(reading.sensor_id)
        columns["event"].append(reading.event)
        columns["armed"].append(reading.armed)
        columns["event_time"].append(_utc(reading.timestamp))
    return pa.Table.from_pydict(columns, schema=ARROW_SCHEMA)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(
    directory: Path,
    name: str,
    table: pa.Table,
    *,
    beside: str | None = None,
    before_rename: Callable[[], None] | None = None,
) -> Path:
    """Write ``table`` as ``directory/name``, durably: temporary file, fsync, rename, fsync of the folder.

    ``beside``: never replace a file already named ``name``; the table is then kept as the hidden
    ``.<name>.<beside>`` instead (without it, an existing file is replaced). ``before_rename`` is
    called last before the file appears; what it raises is raised, and no file appears. Returns the
    final path. Raises OSError (the temporary file is removed; no final file appears).
    """
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        _fsync_dir(directory.parent)  # the new folder's own entry must survive a crash too
    temporary = directory / f".tmp-{os.getpid()}-{uuid.uuid4().hex}.parquet"
    final = directory / name
    try:
        with temporary.open("wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
        # Atomic either way: a reader sees no file or the whole file.
        if beside is None:
            os.replace(temporary, final)
        else:
            final = _place(temporary, final, f".{name}.{beside}")
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_dir(directory)
    return final


STALE_TEMPORARY = 600.0  # seconds: a write takes milliseconds; a temporary this old lost its writer


def sweep_temporaries(directory: Path, older_than: float = STALE_TEMPORARY) -> int:
    """Remove the temporaries (``.tmp-…``) in ``directory`` last written more than ``older_than``
    seconds ago: what a writer killed mid-write left (it never renames them); how many went."""
    removed = 0
    cutoff = time.time() - older_than
    for temporary in directory.glob(".tmp-*") if directory.is_dir() else []:
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove: leave it
            if temporary.stat().st_mtime < cutoff:
                temporary.unlink()
                removed += 1
    return removed


def _place(temporary: Path, final: Path, hidden: str) -> Path:
    """Move ``temporary`` to ``final`` if that name is free, else to ``hidden`` beside it; the path used."""
    try:
        os.link(temporary, final)  # fails if the name is taken: the file there stays as it is
    except FileExistsError:
        final = final.with_name(hidden)
        os.replace(temporary, final)
        return final
    except OSError as exc:
        if exc.errno not in _NO_LINKS:
            raise
        if final.exists():  # no hard links here: a check, then a rename (one writer per range at a time)
            final = final.with_name(hidden)
        os.replace(temporary, final)
        return final
    temporary.unlink()
    return final


def _still_held(ctx: PartitionContext) -> None:
    """Raise ``NotHeld`` once the lease of ``ctx``'s partition may have run out. Asked after the file's
    writer time is read (so that time lies inside the lease) and again just before the file appears
    (a worker stalled while writing, by a SIGSTOP or a starved CPU, shows nothing after its lease)."""
    if not ctx.holds():
        metrics.LANDING_ABANDONED.inc()
        raise NotHeld(f"partition {ctx.partition_id}: the lease of {ctx.owner_id} may have run out; nothing landed")


def writer_metadata(ctx: PartitionContext) -> dict[str, object]:
    """Who lands a file of ``ctx``'s partition now: owner, tenure (drawn at the pump's first file), host, pid."""
    tenure = ctx.state.get("tenure")
    if tenure is None:
        tenure = ctx.state["tenure"] = uuid.uuid4().hex[:16]
    return {
        "owner_id": ctx.owner_id,
        "tenure": tenure,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "landed_at": time.time(),
    }


def writer_of(path: Path) -> dict[str, object] | None:
    """The writer recorded in a landing file (``writer_metadata``), or None if it names none.
    Raises OSError or ``pa.ArrowException`` for a file that is not Parquet."""
    found = pq.read_metadata(path).metadata or {}
    raw = found.get(WRITER_KEY)
    if raw is None:
        return None
    try:
        writer = json.loads(raw)
    except ValueError:
        return None
    return writer if isinstance(writer, dict) else None


@batch_handler(max_events=MAX_EVENTS)
class LandingHandler:
    """Lands every batch of a partition as one Parquet file; sets malformed events aside.

    One instance serves every partition of every worker in the process; what it keeps per
    partition lives in the pump's ``ctx.state``, so it needs no lock of its own.
    """

    def __init__(
        self,
        root: Path | None = None,
        *,
        dead_letters: DeadLetters | None = None,
        linger: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        alerts: fast_alerts.AlertWriter | bool | None = None,
    ) -> None:
        from django.conf import settings

        self.root = Path(root) if root is not None else landing_root()
        if dead_letters is None:
            directory = getattr(settings, "LEASEBOARD_DEADLETTER_DIR", Path(settings.VAR_DIR) / "deadletter")
            dead_letters = DeadLetters(Path(directory))
        self.dead_letters = dead_letters
        if linger is None:
            linger = float(getattr(settings, "LEASEBOARD_LANDING_LINGER", DEFAULT_LINGER))
        self.linger = linger
        if alerts is None:  # as configured; True: this process's writer; False: the pipeline alone raises them
            alerts = bool(getattr(settings, "LEASEBOARD_LANDING_ALERTS", True))
        self.alert_writer = fast_alerts.shared() if alerts is True else alerts or None
        self._sleep = sleep
        self._monotonic = monotonic

    def __call__(self, events: list[ReceivedEvent], ctx: PartitionContext) -> None:
        landed: list[tuple[ReceivedEvent, SensorEvent]] = []
        for event in events:
            try:
                landed.append((event, parse_sensor_event(event.body)))
            except ValueError as exc:  # MalformedEvent: this event only, never the whole batch
                self.dead_letters.add(ctx.ref, ctx.owner_id, event, exc, attempts=1)
                metrics.DEAD_LETTERS.inc()
                log.warning(
                    "partition %s: set aside sequence number %d (malformed body): %s",
                    event.partition_id,
                    event.sequence_number,
                    exc,
                )
        if landed:
            self.land(ctx, landed)
        if len(events) < MAX_EVENTS:
            self._linger(ctx)

    def land(self, ctx: PartitionContext, landed: Sequence[tuple[ReceivedEvent, SensorEvent]]) -> Path:
        """Write ``landed`` durably as one file; returns its path. Raises OSError (the pump retries)."""
        first, last = landed[0][0].sequence_number, landed[-1][0].sequence_number
        started = time.perf_counter()
        writer = writer_metadata(ctx)  # its landed_at is read before the lease is looked at below
        _still_held(ctx)
        table = to_table(landed)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), WRITER_KEY: json.dumps(writer)})
        beside = _UNSAFE.sub("_", f"{ctx.owner_id}.{writer['tenure']}.{uuid.uuid4().hex[:8]}")
        directory = self.root / ctx.ref.hub / ctx.partition_id
        if not ctx.state.get("swept"):  # once a pump: what a writer SIGKILLed mid-write left behind
            ctx.state["swept"] = True
            if removed := sweep_temporaries(directory):
                log.info("partition %s: removed %d temporaries left by a stopped writer", ctx.partition_id, removed)
        path = write_atomically(
            directory,
            file_name(first, last),
            table,
            beside=beside,
            before_rename=lambda: _still_held(ctx),
        )
        metrics.LANDING_WRITE.observe(time.perf_counter() - started)
        metrics.LANDED_EVENTS.inc(len(landed))
        metrics.LANDING_FILES.inc()
        if self.alert_writer is not None:
            self.alert_writer.submit(ctx.ref.hub, fast_alerts.alert_rows(landed))
        ctx.state["landed_at"] = self._monotonic()
        self._mark(ctx, last, max(received.enqueued_time for received, _ in landed))
        return path

    def _mark(self, ctx: PartitionContext, sequence_number: int, enqueued_time: float) -> None:
        """Record the partition's newest landed event for the dashboard's lag (best effort, not fsynced)."""
        known = ctx.state.get("marked")
        if known is None:  # first file of this pump: another owner may have marked a newer one
            known = read_markers(self.root, ctx.ref.hub).get(ctx.partition_id, {}).get("enqueued_time", 0.0)
        if enqueued_time <= known:
            return  # landed again after a change of owner: the marker stays at the newest
        ctx.state["marked"] = enqueued_time
        folder = self.root / ctx.ref.hub / MARKERS
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / f".tmp-{os.getpid()}-{uuid.uuid4().hex}"
        body = {"sequence_number": sequence_number, "enqueued_time": enqueued_time, "landed_at": time.time()}
        try:
            temporary.write_text(json.dumps(body), encoding="utf-8")
            os.replace(temporary, folder / f"{ctx.partition_id}.json")
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            log.warning("partition %s: could not update the landing marker: %s", ctx.partition_id, exc)

    def _linger(self, ctx: PartitionContext) -> None:
        previous = ctx.state.get("landed_at")
        if previous is None or self.linger <= 0:
            return
        left = self.linger - (self._monotonic() - previous)
        if left > 0:
            self._sleep(left)
