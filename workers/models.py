"""The Spark pipeline's results in the Django database: what the dashboard's Pipeline page reads.

The full results are Parquet files (``workers.pipeline.job``); these tables hold a summary. Every
row of one micro-batch is written in one transaction together with its ``PipelineBatch`` row,
and a batch already recorded is never applied again: Spark replays a batch whose commit it did
not record, and the replay must not count its events twice.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models


class PipelineBatch(models.Model):
    """One micro-batch the pipeline committed (the batch log)."""

    hub = models.CharField(max_length=255)
    query_id = models.CharField(max_length=64, help_text="the streaming query's id, kept in its Spark checkpoint")
    batch_id = models.BigIntegerField()
    finished_at = models.DateTimeField(help_text="when its results were committed")
    events = models.BigIntegerField(help_text="distinct events aggregated (duplicates dropped)")
    alerts = models.BigIntegerField()
    unreadable_files = models.IntegerField(default=0)
    newest_enqueued = models.DateTimeField(null=True, help_text="newest enqueued time among its events")
    oldest_enqueued = models.DateTimeField(null=True, help_text="oldest enqueued time among its events")
    newest_event = models.DateTimeField(null=True, help_text="newest sensor time among its events")
    write_seconds = models.FloatField(
        help_text="time in foreachBatch: the dedupe against its state, results to Parquet and this database"
    )
    input_rows = models.BigIntegerField(null=True, help_text="rows read, duplicates included (from Spark's progress)")
    duration_seconds = models.FloatField(null=True, help_text="the whole trigger, from Spark's progress")
    # The summary commits first (the aggregates count from then on), the Parquet results follow. A
    # replay of a batch committed but not yet written writes its Parquet from the same plan.
    results_written = models.BooleanField(default=True, help_text="its Parquet results are written")
    counted_before = models.TextField(
        null=True, help_text="JSON: the counted ranges its plan started from, until its results are written"
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["query_id", "batch_id"], name="one_row_per_batch")]
        indexes = [models.Index(fields=["hub", "-finished_at"], name="batch_hub_finished")]

    def __str__(self) -> str:
        return f"{self.hub} batch {self.batch_id}: {self.events} events"

    @property
    def duplicates(self) -> int | None:
        return None if self.input_rows is None else max(self.input_rows - self.events, 0)

    def as_json(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "finished_at": self.finished_at.timestamp(),
            "events": self.events,
            "input_rows": self.input_rows,
            "duplicates": self.duplicates,
            "alerts": self.alerts,
            "unreadable_files": self.unreadable_files,
            "write_seconds": self.write_seconds,
            "duration_seconds": self.duration_seconds,
            "newest_enqueued": self.newest_enqueued.timestamp() if self.newest_enqueued else None,
            # From enqueued to committed: of its newest event (the least) and of its oldest (the most).
            "latency_seconds": self._since(self.newest_enqueued),
            "max_latency_seconds": self._since(self.oldest_enqueued),
        }

    def _since(self, enqueued: datetime | None) -> float | None:
        return None if enqueued is None else (self.finished_at - enqueued).total_seconds()


class MinuteSummary(models.Model):
    """Events and alerts per minute (sensor clock) per sensor type, all homes together."""

    hub = models.CharField(max_length=255)
    minute = models.DateTimeField()
    sensor = models.CharField(max_length=32)
    events = models.BigIntegerField(default=0)
    alerts = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["hub", "minute", "sensor"], name="one_row_per_minute_sensor")]

    def __str__(self) -> str:
        return f"{self.hub} {self.minute:%H:%M} {self.sensor}: {self.events}"


class Alert(models.Model):
    """One alert (glass break, smoke, door or window opened while armed); the newest are kept."""

    hub = models.CharField(max_length=255)
    partition_id = models.CharField(max_length=16)
    sequence_number = models.BigIntegerField()
    home = models.CharField(max_length=64)
    kind = models.CharField(max_length=32)
    sensor = models.CharField(max_length=32)
    sensor_id = models.CharField(max_length=64)
    event = models.CharField(max_length=32)
    event_time = models.DateTimeField()
    enqueued_time = models.DateTimeField()
    raised_at = models.DateTimeField(help_text="when it was committed (by whichever path raised it first)")
    # The landing raises an alert as soon as its event's file is durable (``workers.pipeline.alerts``);
    # the Spark pipeline raises it again from its batch, and the unique constraint keeps the first.
    batch_id = models.BigIntegerField(null=True, help_text="the pipeline batch that raised it; null: the landing")
    raised_by = models.CharField(max_length=16, default="pipeline", help_text="landing or pipeline")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["hub", "partition_id", "sequence_number"], name="one_alert_per_event")
        ]
        indexes = [
            models.Index(fields=["hub", "-event_time"], name="alert_hub_time"),
            models.Index(fields=["hub", "raised_at"], name="alert_hub_raised"),  # the console's live tail
        ]

    def __str__(self) -> str:
        return f"{self.kind} at {self.home} ({self.sensor_id} {self.event})"

    def as_json(self) -> dict[str, Any]:
        return {
            "partition_id": self.partition_id,
            "sequence_number": self.sequence_number,
            "home": self.home,
            "kind": self.kind,
            "sensor": self.sensor,
            "sensor_id": self.sensor_id,
            "event": self.event,
            "event_time": self.event_time.timestamp(),
            "enqueued_time": self.enqueued_time.timestamp(),
            "raised_at": self.raised_at.timestamp(),
            "raised_by": self.raised_by,
            # seconds from the event's enqueueing to its alert's commit
            "latency_seconds": round((self.raised_at - self.enqueued_time).total_seconds(), 3),
        }


class UnreadableFile(models.Model):
    """A landing file the pipeline could not read: reported once, then skipped for good."""

    hub = models.CharField(max_length=255)
    path = models.CharField(max_length=1024)
    error = models.TextField()
    size = models.BigIntegerField(null=True)
    found_at = models.DateTimeField()
    batch_id = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["hub", "path"], name="one_report_per_file")]

    def __str__(self) -> str:
        return self.path

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "error": self.error, "size": self.size, "found_at": self.found_at.timestamp()}


class CountedRange(models.Model):
    """Per hub and partition, the sequence ranges the pipeline has counted (``workers.pipeline.ranges``):
    its whole dedupe state, written in the same transaction as the batch that counted them."""

    hub = models.CharField(max_length=255)
    partition_id = models.CharField(max_length=16)
    intervals = models.TextField(help_text="JSON [[first, last], ...], sorted and disjoint, both ends included")
    batch_id = models.BigIntegerField(help_text="the batch that last changed them")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["hub", "partition_id"], name="one_range_row_per_partition")]

    def __str__(self) -> str:
        return f"{self.hub}/{self.partition_id}: {self.intervals}"
