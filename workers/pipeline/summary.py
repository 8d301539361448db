"""The pipeline's summary in the Django database, written once per micro-batch, exactly once.

``apply`` writes a batch's minute counts, newest alerts, unreadable files and its batch-log row
in one transaction, unless that (query id, batch id) is already in the log. Spark runs
``foreachBatch`` at least once per batch (again after a crash between our write and its commit),
always with the same data, so checking the log inside the same transaction makes it exactly once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections, transaction

from workers import alerts as fast_alerts
from workers.models import Alert, CountedRange, MinuteSummary, PipelineBatch, UnreadableFile

from . import ranges

ALERTS_KEPT = fast_alerts.ALERTS_KEPT  # most recently raised alerts kept per hub; the Parquet results keep them all


@dataclass(frozen=True, slots=True)
class Unreadable:
    path: str
    error: str
    size: int | None


@dataclass
class BatchResult:
    """What one micro-batch produced, as plain values (collected from Spark at the job's edge)."""

    hub: str
    query_id: str
    batch_id: int
    finished_at: datetime
    events: int
    newest_enqueued: datetime | None
    newest_event: datetime | None
    oldest_enqueued: datetime | None
    write_seconds: float
    minutes: Sequence[tuple[datetime, str, int, int]] = ()  # (minute, sensor, events, alerts)
    alerts: Sequence[dict[str, Any]] = ()  # the newest ALERTS_KEPT rows of transforms.alerts
    unreadable: Sequence[Unreadable] = field(default_factory=list)
    counted: ranges.Ranges | None = None  # the counted ranges after this batch (None: unchanged)
    input_rows: int | None = None  # rows in the batch's readable files, duplicates included (None: from Spark)
    # The counted ranges the batch's plan started from, when its Parquet results are written after
    # this commit (``written`` then says they are); None: they were written before it.
    counted_before: ranges.Ranges | None = None

    @property
    def alert_count(self) -> int:
        return sum(alerts for _, _, _, alerts in self.minutes)


def applied(query_id: str, batch_id: int, using: str = "default") -> bool:
    return PipelineBatch.objects.using(using).filter(query_id=query_id, batch_id=batch_id).exists()


@dataclass(frozen=True, slots=True)
class Logged:
    """A batch in the log: whether its Parquet results are written, else the plan's starting ranges."""

    results_written: bool
    counted_before: ranges.Ranges


def logged(query_id: str, batch_id: int, using: str = "default") -> Logged | None:
    """The batch's row in the log (None: not applied)."""
    row = (
        PipelineBatch.objects.using(using)
        .filter(query_id=query_id, batch_id=batch_id)
        .values_list("results_written", "counted_before")
        .first()
    )
    if row is None:
        return None
    written, before = row
    counted = {} if before is None else {p: [(int(a), int(b)) for a, b in v] for p, v in json.loads(before).items()}
    return Logged(bool(written) or before is None, counted)


def written(query_id: str, batch_id: int, using: str = "default") -> None:
    """Record that the batch's Parquet results are written (its plan's ranges are no longer needed)."""
    rows = PipelineBatch.objects.using(using).filter(query_id=query_id, batch_id=batch_id)
    rows.update(results_written=True, counted_before=None)


def apply(result: BatchResult, using: str = "default") -> bool:
    """Record ``result`` in database ``using``; False (and nothing written) if this batch was recorded before."""
    with transaction.atomic(using=using):
        if applied(result.query_id, result.batch_id, using):
            return False
        _add_minutes(result.hub, result.minutes, using)
        if result.counted is not None:
            _store_ranges(result.hub, result.batch_id, result.counted, using)
        _add_alerts(result, using)
        for bad in result.unreadable:
            UnreadableFile.objects.using(using).get_or_create(
                hub=result.hub,
                path=bad.path[:1024],
                defaults={
                    "error": bad.error,
                    "size": bad.size,
                    "found_at": result.finished_at,
                    "batch_id": result.batch_id,
                },
            )
        PipelineBatch.objects.using(using).create(
            hub=result.hub,
            query_id=result.query_id,
            batch_id=result.batch_id,
            finished_at=result.finished_at,
            events=result.events,
            alerts=result.alert_count,
            unreadable_files=len(result.unreadable),
            newest_enqueued=result.newest_enqueued,
            newest_event=result.newest_event,
            oldest_enqueued=result.oldest_enqueued,
            write_seconds=result.write_seconds,
            input_rows=result.input_rows,
            results_written=result.counted_before is None,
            counted_before=None if result.counted_before is None else json.dumps(result.counted_before),
        )
    return True


def _add_minutes(hub: str, minutes: Iterable[tuple[datetime, str, int, int]], using: str) -> None:
    """Add the batch's counts to the minute rows: one statement per 500 rows (a 1 M-event batch has
    a few hundred), an insert that adds to the row already there (``ON CONFLICT ... DO UPDATE``,
    SQLite and PostgreSQL alike). The addition happens in the database, row by row under its lock,
    so no other writer's addition is lost and no row needs reading first. Profiled on 1 M events:
    Django's ``bulk_update`` (a CASE per row and field, built in Python) took most of the summary's time."""
    added: dict[tuple[datetime, str], tuple[int, int]] = {}
    for minute, sensor, events, alerts in minutes:
        before = added.get((minute, sensor), (0, 0))
        added[(minute, sensor)] = (before[0] + events, before[1] + alerts)
    if not added:
        return
    connection = connections[using]
    meta = MinuteSummary._meta
    quote = connection.ops.quote_name
    table = quote(meta.db_table)
    fields = {f.name: f for f in meta.concrete_fields}
    column = {name: quote(str(fields[name].column)) for name in ("hub", "minute", "sensor", "events", "alerts")}
    minute_field = fields["minute"]
    rows = [
        (hub, minute_field.get_db_prep_save(minute, connection), sensor, events, alerts)
        for (minute, sensor), (events, alerts) in added.items()
    ]
    names = ", ".join(column.values())
    for start in range(0, len(rows), 500):
        chunk = rows[start : start + 500]
        values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(chunk))
        sql = (
            f"INSERT INTO {table} ({names}) VALUES {values} "
            f"ON CONFLICT ({column['hub']}, {column['minute']}, {column['sensor']}) DO UPDATE SET "
            f"{column['events']} = {table}.{column['events']} + excluded.{column['events']}, "
            f"{column['alerts']} = {table}.{column['alerts']} + excluded.{column['alerts']}"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [value for row in chunk for value in row])


def _add_alerts(result: BatchResult, using: str) -> None:
    """The batch's alerts, each unless the landing raised it first (``alerts``); the console's feed
    is woken once the transaction commits if any was new."""
    fresh = fast_alerts.insert(
        result.hub,
        result.alerts[:ALERTS_KEPT],
        raised_by="pipeline",
        raised_at=result.finished_at,
        batch_id=result.batch_id,
        using=using,
    )
    fast_alerts.trim(result.hub, using)
    if fresh:
        hub = result.hub
        transaction.on_commit(lambda: fast_alerts.notify(hub), using=using)


def counted_ranges(hub: str, using: str = "default") -> ranges.Ranges:
    """The ranges the pipeline of ``hub`` has counted, per partition (its dedupe state)."""
    rows = CountedRange.objects.using(using).filter(hub=hub).values_list("partition_id", "intervals")
    return {partition: [(int(a), int(b)) for a, b in json.loads(text)] for partition, text in rows}


def _store_ranges(hub: str, batch_id: int, counted: ranges.Ranges, using: str) -> None:
    before = counted_ranges(hub, using)
    rows = CountedRange.objects.using(using)
    for partition, intervals in counted.items():
        if before.get(partition) == intervals:
            continue
        text = json.dumps([list(i) for i in intervals], separators=(",", ":"))
        rows.update_or_create(hub=hub, partition_id=partition, defaults={"intervals": text, "batch_id": batch_id})


def record_progress(query_id: str, progress: Iterable[dict[str, Any]], using: str = "default") -> int:
    """Add Spark's figures (rows read, trigger duration) to the logged batches; returns rows updated."""
    updated = 0
    for entry in progress:
        batch_id = entry.get("batchId")
        if batch_id is None or entry.get("numInputRows") is None:
            continue
        duration_ms = (entry.get("durationMs") or {}).get("triggerExecution")
        rows = PipelineBatch.objects.using(using).filter(query_id=query_id, batch_id=batch_id)
        # Spark counts a row once per scan of the batch (the job scans it twice): its figure only
        # where the job could not count the rows of the batch's files itself.
        rows.filter(input_rows__isnull=True).update(input_rows=entry["numInputRows"])
        updated += rows.update(duration_seconds=None if duration_ms is None else duration_ms / 1000.0)
    return updated


def other_queries(hub: str, query_id: str | None) -> list[str]:
    """Query ids with batches logged for ``hub`` other than ``query_id``."""
    rows = PipelineBatch.objects.filter(hub=hub).exclude(query_id=query_id or "").values_list("query_id", flat=True)
    return sorted(set(rows))


def forget(hub: str) -> int:
    """Delete the pipeline's summary of ``hub`` (for ``runpipeline --reset``); returns rows deleted."""
    total = 0
    with transaction.atomic():
        for model in (PipelineBatch, MinuteSummary, Alert, UnreadableFile, CountedRange):
            deleted, _ = model.objects.filter(hub=hub).delete()
            total += deleted
    return total
