"""Alerts the moment their events land: the fast path beside the Spark pipeline. No Spark here.

The landing handler (``workers.landing``) hands each durable file's alerting events to the
process's ``AlertWriter``, a thread that inserts them into the ``Alert`` table and wakes the
console's live feed (``/ws/pipeline/``) through the channel layer. The Spark pipeline raises the
same alerts again from its batches (``summary.apply``, with ``insert`` too), which is what makes
the fast path safe to lose:

- **Once.** An alert's key is its event's (hub, partition, sequence number), unique in the table;
  both paths insert with ``ON CONFLICT DO NOTHING`` and report only the rows that were new (what the
  insert ``RETURNING``), so an event landed twice (a worker killed before its checkpoint, a
  handoff), or raised by both paths, gives one row and one message.
- **Never missed.** The fast path is best effort: a full queue, a database that is down, a worker
  killed between its file and its insert lose the fast copy only. The pipeline raises every alert of
  every event it counts, a few seconds later.
- **The same alerts.** ``kind_of`` is ``transforms.alert_kind`` in plain Python; a test holds them
  equal over every sensor, event and armed state, and the end-to-end tests compare the two paths.

Trimming must not undo the "once". The table keeps the ``ALERTS_KEPT`` most recently raised alerts
per hub (the Parquet results keep them all; the trim runs at most once a ``TRIM_EVERY`` seconds per
writer), but a row goes only once the pipeline has counted its event (``CountedRange``): until then
the pipeline may raise it again, and the row is what makes that a no-op (a pipeline seconds behind
at 150 alerts a second would otherwise see its alerts trimmed first, and raise them twice). And the
landing raises no alert of an event the pipeline has counted (an event landed again after a
checkpoint reset or a kill, its row trimmed long ago). Rows of events not counted past
``UNCOUNTED_KEPT`` (a pipeline stopped, or far behind) are trimmed all the same.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import json
import logging
import math
import queue
import re
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from . import metrics

if TYPE_CHECKING:
    from workers.sensors import SensorEvent
    from workers.sources.base import ReceivedEvent

log = logging.getLogger("leaseboard.alerts")

GLASS_BREAK = "glass_break"
SMOKE = "smoke"
INTRUSION = "opened_while_armed"
ALERT_KINDS = (GLASS_BREAK, SMOKE, INTRUSION)
ALERTS_KEPT = 1000  # most recently raised alerts kept per hub; the Parquet results keep them all
UNCOUNTED_KEPT = 50_000  # ... and at most this many, counted by the pipeline or not
TRIM_EVERY = 1.0  # seconds between two trims by one writer
MAX_QUEUED = 20_000  # alerts waiting for the writer; beyond, the fast copy is dropped (the pipeline has them)
MESSAGE_TYPE = "pipeline.alerts"  # the channel-layer message that wakes the console's feed
GROUP_PREFIX = "leaseboard.alerts."
NOTIFY_TIMEOUT = 1.0  # seconds a wake-up may take before it is given up
FIELDS = (
    "hub",
    "partition_id",
    "sequence_number",
    "home",
    "kind",
    "sensor",
    "sensor_id",
    "event",
    "event_time",
    "enqueued_time",
    "raised_at",
    "batch_id",
    "raised_by",
)


def kind_of(sensor: str, event: str, armed: bool) -> str | None:
    """The alert a reading raises (one of ALERT_KINDS), else None: ``transforms.alert_kind`` in Python."""
    if event == "detected" and sensor == GLASS_BREAK:
        return GLASS_BREAK
    if event == "detected" and sensor == SMOKE:
        return SMOKE
    if event == "opened" and armed and sensor in ("door", "window"):
        return INTRUSION
    return None


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def alert_rows(landed: Iterable[tuple[ReceivedEvent, SensorEvent]]) -> list[dict[str, Any]]:
    """The alerts of ``landed`` (event as received, its reading), as rows of the ``Alert`` table
    without hub, raised_at, batch_id and raised_by."""
    rows = []
    for received, reading in landed:
        kind = kind_of(reading.sensor, reading.event, reading.armed)
        if kind is None:
            continue
        rows.append(
            {
                "partition_id": received.partition_id,
                "sequence_number": received.sequence_number,
                "home": reading.home,
                "kind": kind,
                "sensor": reading.sensor,
                "sensor_id": reading.sensor_id,
                "event": reading.event,
                "event_time": _utc(reading.timestamp),
                "enqueued_time": _utc(received.enqueued_time),
            }
        )
    return rows


def group_name(hub: str) -> str:
    """The channel-layer group the console's feed of ``hub`` listens on (a valid group name for any hub)."""
    digest = hashlib.sha256(hub.encode()).hexdigest()[:16]
    return f"{GROUP_PREFIX}{re.sub(r'[^A-Za-z0-9_-]+', '_', hub)[:40]}.{digest}"


def insert(
    hub: str,
    rows: Sequence[dict[str, Any]],
    *,
    raised_by: str,
    raised_at: datetime,
    batch_id: int | None = None,
    using: str = "default",
) -> list[dict[str, Any]]:
    """Insert the alerts ``rows`` of ``hub`` unless there already; returns those that were new.

    One ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` per 500 rows, the same SQL on SQLite and
    PostgreSQL. Call it inside a transaction to make it part of one (``summary.apply`` does)."""
    from workers.models import Alert

    if not rows:
        return []
    connection = connections[using]
    meta = Alert._meta
    quote = connection.ops.quote_name
    fields = {f.name: f for f in meta.concrete_fields}
    columns = ", ".join(quote(str(fields[name].column)) for name in FIELDS)
    extra = {"hub": hub, "raised_at": raised_at, "batch_id": batch_id, "raised_by": raised_by}
    new: set[tuple[str, int]] = set()
    for start in range(0, len(rows), 500):
        chunk = rows[start : start + 500]
        params: list[Any] = []
        for row in chunk:
            values = {**row, **extra}
            params.extend(fields[name].get_db_prep_save(values[name], connection) for name in FIELDS)
        placeholders = ", ".join(["(" + ", ".join(["%s"] * len(FIELDS)) + ")"] * len(chunk))
        sql = (
            f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES {placeholders} "
            f"ON CONFLICT ({quote('hub')}, {quote('partition_id')}, {quote('sequence_number')}) DO NOTHING "
            f"RETURNING {quote('partition_id')}, {quote('sequence_number')}"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            new.update((str(p), int(s)) for p, s in cursor.fetchall())
    fresh = [{**row, **extra} for row in rows if (row["partition_id"], row["sequence_number"]) in new]
    if fresh:
        metrics.ALERTS_RAISED.labels(raised_by).inc(len(fresh))
        for row in fresh:
            metrics.ALERT_LATENCY.labels(raised_by).observe(max((raised_at - row["enqueued_time"]).total_seconds(), 0))
    return fresh


def counted(hub: str, using: str = "default") -> dict[str, list[tuple[int, int]]]:
    """The sequence ranges the pipeline of ``hub`` has counted, per partition (``CountedRange``)."""
    from workers.models import CountedRange

    rows = CountedRange.objects.using(using).filter(hub=hub).values_list("partition_id", "intervals")
    return {partition: [(int(a), int(b)) for a, b in json.loads(text)] for partition, text in rows}


def _inside(intervals: Sequence[tuple[int, int]], number: int) -> bool:
    """Whether ``number`` lies in one of ``intervals`` (sorted, disjoint, both ends included)."""
    at = bisect.bisect_right(intervals, (number, math.inf)) - 1
    return at >= 0 and intervals[at][0] <= number <= intervals[at][1]


def not_counted(rows: Sequence[dict[str, Any]], ranges: dict[str, list[tuple[int, int]]]) -> list[dict[str, Any]]:
    """The ``rows`` whose events are outside the pipeline's counted ``ranges``."""
    return [r for r in rows if not _inside(ranges.get(r["partition_id"], []), r["sequence_number"])]


def trim(hub: str, using: str = "default") -> int:
    """Delete the alerts of ``hub`` older than the ``ALERTS_KEPT`` most recently raised whose events the
    pipeline has counted, and any past ``UNCOUNTED_KEPT``; returns how many went."""
    from workers.models import Alert

    alerts = Alert.objects.using(using)
    newest_first = alerts.filter(hub=hub).order_by("-id").values_list("id", "partition_id", "sequence_number")
    stale = list(newest_first[ALERTS_KEPT : ALERTS_KEPT + 10_000])
    if not stale:
        return 0
    ranges = counted(hub, using)
    gone = [i for i, partition, number in stale if _inside(ranges.get(partition, []), number)]
    gone += [i for i, _, _ in newest_first[UNCOUNTED_KEPT : UNCOUNTED_KEPT + 10_000]]
    if not gone:
        return 0
    deleted, _ = alerts.filter(id__in=gone).delete()
    return deleted


def notify(hub: str, loop: asyncio.AbstractEventLoop | None = None, layer: Any = None) -> bool:
    """Wake the console feeds of ``hub`` through ``layer`` (default: Django's default channel layer);
    best effort: False if the layer failed, took too long, or reaches no other process."""
    from channels.layers import get_channel_layer

    from workers.layer_notices import crosses_processes

    layer = layer if layer is not None else get_channel_layer()
    if not crosses_processes(layer):
        # None, or the in-memory layer: it reaches no other process, and within this one it is not
        # safe from a thread of its own; the console's feed looks every 0.25 s anyway.
        return False

    async def send() -> None:
        await asyncio.wait_for(layer.group_send(group_name(hub), {"type": MESSAGE_TYPE, "hub": hub}), NOTIFY_TIMEOUT)

    try:
        if loop is None:
            asyncio.run(send())
        else:
            loop.run_until_complete(send())
    except Exception as exc:
        log.debug("could not wake the alert feed of %s: %s", hub, exc)
        return False
    return True


class AlertWriter:
    """A thread that inserts the landing's alerts (``submit``) and wakes the console; one per process
    (``shared``). ``submit`` never blocks a pump: a full queue drops the fast copy (counted in
    ``leaseboard_landing_alerts_dropped_total``), which the pipeline raises later anyway."""

    def __init__(self, using: str = "default", max_queued: int = MAX_QUEUED, wake: bool = True) -> None:
        self.using = using
        self.wake = wake
        self._queue: queue.Queue[tuple[str, list[dict[str, Any]]] | None] = queue.Queue()
        self._queued = 0  # alerts in the queue (a row count, not a count of submits)
        self._max_queued = max_queued
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._trimmed: dict[str, float] = {}
        self._thread: threading.Thread | None = None

    def submit(self, hub: str, rows: list[dict[str, Any]]) -> bool:
        """Queue ``rows`` (``alert_rows``) of ``hub`` for insertion; False if dropped (the queue is full)."""
        if not rows:
            return True
        with self._lock:
            if self._queued + len(rows) > self._max_queued:
                metrics.LANDING_ALERTS_DROPPED.labels("queue full").inc(len(rows))
                return False
            self._queued += len(rows)
            self._idle.clear()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="leaseboard-alerts", daemon=True)
                self._thread.start()
        self._queue.put((hub, rows))
        return True

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every submitted alert is written (or dropped); False if still busy after ``timeout``."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                batches = [item]
                with contextlib.suppress(queue.Empty):  # whatever piled up meanwhile: one transaction
                    while len(batches) < 256:
                        more = self._queue.get_nowait()
                        if more is None:
                            self._queue.put(None)
                            break
                        batches.append(more)
                self._write(batches, loop)
        finally:
            loop.close()
            self._close()

    def _write(self, batches: list[tuple[str, list[dict[str, Any]]]], loop: asyncio.AbstractEventLoop) -> None:
        per_hub: dict[str, list[dict[str, Any]]] = {}
        for hub, rows in batches:
            per_hub.setdefault(hub, []).extend(rows)
        count = sum(len(rows) for rows in per_hub.values())
        try:
            for hub, rows in per_hub.items():
                # Read before the insert, not in its transaction (SQLite would refuse a read turned
                # write while the pipeline commits). An event the pipeline counts in between has its
                # alert raised by the pipeline's batch, whose row then makes this insert a no-op.
                rows = not_counted(rows, counted(hub, self.using))
                with transaction.atomic(using=self.using):
                    fresh = insert(hub, rows, raised_by="landing", raised_at=datetime.now(UTC), using=self.using)
                if fresh and self.wake:
                    notify(hub, loop)
                self._trim(hub)
        except Exception as exc:
            metrics.LANDING_ALERTS_DROPPED.labels("database error").inc(count)
            log.warning("could not raise %d alerts on landing (the pipeline will): %s", count, exc)
            self._close()  # the next write starts on a fresh connection
        finally:
            with self._lock:
                self._queued -= count
                if self._queued == 0:
                    self._idle.set()

    def _close(self) -> None:
        with contextlib.suppress(Exception):  # a connection that is gone, or never was
            connections[self.using].close()

    def _trim(self, hub: str) -> None:
        now = time.monotonic()
        if now - self._trimmed.get(hub, float("-inf")) >= TRIM_EVERY:
            self._trimmed[hub] = now
            trim(hub, self.using)


_shared: AlertWriter | None = None
_shared_lock = threading.Lock()


def shared() -> AlertWriter:
    """This process's alert writer (made on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = AlertWriter()
        return _shared
