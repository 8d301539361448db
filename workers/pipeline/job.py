"""The streaming job: landing files in, deduplicated aggregates and alerts out. I/O lives here.

    landing/<hub>/<partition>/<first>-<last>.parquet ─ file source (new files only, a file once; stateless)
        └▶ foreachBatch: ranges.plan (from the batch's file names and the counted ranges in the database)
                         transforms.well_formed (unless the files' footers rule out missing fields;
                                                 the stream reads the used columns, the check its files)
                         transforms.drop_counted (+ deduplicate within the batch if its files overlap)
                         transforms.tallies: one pass, cached ─┬▶ aggregates ─▶ results/aggregates/batch_id=N/
                                                               ├▶ alerts     ─▶ results/alerts/batch_id=N/
                                                               └▶ minutes + newest alerts + counted ranges ─▶ Django DB

Exactly once, end to end. Delivery into the landing is at least once; a duplicate is an event
whose sequence number its partition has counted already. The state that says so is, per partition,
the ranges counted so far (``ranges``: usually one interval per partition, whatever the number of
events), committed in the same database transaction as the batch's summary; the stream itself
keeps no state but the file source's log. It holds across restarts and without a watermark (a
redelivery may come arbitrarily late: a worker killed before its checkpoint, or a checkpoint reset
by an operator).

Spark replays a batch whose commit it did not record, with the same files; the plan is made again
from the same counted ranges (the batch's were not committed, or the batch is skipped), so the
same rows. Each output is therefore idempotent per batch id: the Parquet folder of batch N is
overwritten, and the database summary is applied in one transaction only if the batch log lacks
(query id, N) (``summary.apply``). The Parquet writes start once the batch's first pass has filled
its cache and run while the summary is collected and committed, into a staging folder
(``staged``); they move into place only after the commit, so an event counts in the aggregates as
soon as it can and a batch that did not commit leaves no Parquet. The summary's log row keeps the
ranges the plan started from until the Parquet is in place (``results_written``), so a replay of a
batch committed but not written makes the same plan again and writes only its Parquet.

A landing file Spark cannot read is skipped (``ignoreCorruptFiles``), reported once (log,
``leaseboard_pipeline_unreadable_files_total``, an ``UnreadableFile`` row), never read again (the
file source lists each file once) and adds no counted range: its events count if landed again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import DatabaseError, connections
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from . import audit, cluster, metrics, ranges, small, staged, summary, transforms
from .launcher import DEFAULT_TRIGGER_SECONDS
from .paths import Paths as Paths  # where it was first: ``from workers.pipeline.job import Paths``
from .schema import LANDING
from .staged import together as together  # where it was first

log = logging.getLogger("leaseboard.pipeline")


def landed_events(spark: SparkSession, paths: Paths, max_files: int | None = None) -> DataFrame:
    """The stream of landed events: every landing file once, in the landing schema; at most
    ``max_files`` files per batch (None: every new file in one batch)."""
    paths.landing.mkdir(parents=True, exist_ok=True)  # the file source refuses a missing folder
    reader = spark.readStream.schema(LANDING)
    if max_files is not None:
        reader = reader.option("maxFilesPerTrigger", str(max_files))
    return (
        reader.option("recursiveFileLookup", "true")  # <partition>/ folders; no partition columns
        .option("pathGlobFilter", "*.parquet")
        .option("ignoreCorruptFiles", "true")
        .option("ignoreMissingFiles", "true")
        # The landing stays small: once a batch is committed, its files move to the archive (the
        # listing of a trigger is then what is new, not everything ever landed).
        .option("cleanSource", "archive")
        .option("sourceArchiveDir", str(paths.archive))
        .parquet(str(paths.landing))
    )


def _utc(value: datetime | None) -> datetime | None:
    # PySpark hands timestamps back as naive local times.
    if value is None:
        return None
    return value.astimezone(UTC) if value.tzinfo is None else value


@dataclass(frozen=True, slots=True)
class _Batch:
    """One batch as ``PipelineJob._process`` planned it."""

    query_id: str
    batch_id: int
    files: list[str] | None
    bad: list[summary.Unreadable]
    before: ranges.Ranges  # the counted ranges the plan started from
    plan: ranges.Plan
    started: float  # perf_counter at the start of foreachBatch


@dataclass(frozen=True, slots=True)
class _Frames:
    """Of one batch's cached tallies (``transforms.of_tallies``), what its summary collects."""

    alerts: DataFrame
    minutes: DataFrame


@dataclass(frozen=True, slots=True)
class _Outputs:
    """What one batch's pass over its events gave (``PipelineJob._outputs``)."""

    events: int  # after dedupe
    stats: dict[str, Any]  # transforms.totals
    minutes: list[tuple[datetime, str, int, int]]  # (minute, sensor, events, alerts)
    alerts: list[dict[str, Any]]  # the newest, at most summary.ALERTS_KEPT


class PipelineJob:
    """One hub's streaming query and what it does with each micro-batch."""

    def __init__(
        self,
        spark: SparkSession,
        hub: str,
        paths: Paths,
        *,
        trigger_seconds: float = DEFAULT_TRIGGER_SECONDS,
        max_files: int | None = None,
        database: str = "default",
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.spark = spark
        self.hub = hub
        self.paths = paths
        self.trigger_seconds = trigger_seconds
        self.database = database  # the Django alias the summary goes to
        self.max_files = max_files  # files per batch at most (None: all new files)
        self._clock = clock
        self._recorded: set[int] = set()  # batch ids whose Spark progress is in the batch log
        self._small: SparkSession | None = None  # the session of the batches read on the driver
        self.written: list[int] = []  # batch ids this job wrote (not those skipped as written before)
        # Called after each batch (written, or skipped as written before) with its id, the events it
        # wrote (after dedupe) and its files (None if unknown): a command's progress line.
        self.on_batch: Callable[[int, int, list[str] | None], None] | None = None

    def start(self, once: bool = False) -> StreamingQuery:
        """Start the query: ``once`` processes what is landed now (availableNow) and ends."""
        # foreachBatch hands each batch over as the rows of the stream's own plan (Spark's
        # ForeachBatchSink wraps them in an RDD), so no column pruning reaches the Parquet reader from
        # the batch's queries: the stream selects the columns they use. Every column was read before
        # (offset and event_id, unique strings, about a quarter of the scan's CPU).
        landed = landed_events(self.spark, self.paths, self.max_files).select(*transforms.USED)
        writer = (
            landed.writeStream.queryName(f"leaseboard-{self.hub}")
            .foreachBatch(self.process)
            .option("checkpointLocation", str(self.paths.checkpoint))
        )
        if once:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self.trigger_seconds:g} seconds")
        staged.clear_staging(self.paths.results)  # what a run stopped half way left there
        query = writer.start()
        cluster.publish_quietly(self.paths.checkpoint.parent, self.spark)  # for the console: master, executors
        log.info("pipeline of hub %s started (query %s%s)", self.hub, query.id, ", once" if once else "")
        return query

    # one micro-batch (called by Spark, in a py4j callback thread) ---------------------------

    def process(self, batch: DataFrame, batch_id: int) -> None:
        """foreachBatch: write the batch's results unless the database says they are written."""
        try:
            self._process(batch, batch_id)
        finally:
            connections.close_all()  # this thread's connections: Django never cleans up after it

    def _process(self, batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        query_id = self.paths.query_id()
        if query_id is None:
            raise RuntimeError(f"no query metadata in {self.paths.checkpoint}")
        files = audit.batch_files(self.paths.checkpoint, batch_id)
        logged = summary.logged(query_id, batch_id, self.database)
        if logged is not None and logged.results_written:
            log.info("batch %d was committed before a restart: already written, skipped", batch_id)
            if self.on_batch is not None:
                self.on_batch(batch_id, 0, files)
            return
        bad = audit.unreadable(files or [])
        for item in bad if logged is None else []:
            log.error("landing file %s is unreadable and is skipped for good: %s", item.path, item.error)
        # A batch whose summary committed before a crash, its results not yet written: the same plan
        # again, from the ranges it started from (those in the table now include its own).
        before = summary.counted_ranges(self.hub, self.database) if logged is None else logged.counted_before
        plan = ranges.plan(before, files, [item.path for item in bad])
        fresh = self._fresh(batch, files, batch_id, plan, {item.path for item in bad})
        # Only the slow path reads the events again (their ranges), so only it caches them.
        events = fresh.persist() if plan.after is None else fresh
        tallied = transforms.tallies(events).persist()
        aggregates, alerts, per_minute = transforms.of_tallies(tallied)
        frames = {"aggregates": aggregates, "alerts": alerts}
        writes = staged.StagedWrites(
            self.paths.results, batch_id, tuple(frames), lambda kind, folder: self._write(frames[kind], folder)
        )
        try:
            if logged is None:
                batch_plan = _Batch(query_id, batch_id, files, bad, before, plan, started)
                if not self._summarize(batch_plan, events, _Frames(alerts, per_minute), writes.start):
                    writes.discard()
                    return
            else:
                log.info("batch %d was committed before a restart, its results not yet written: writing them", batch_id)
            # After the summary's commit: the aggregates count from then on, the Parquet moves into place.
            writes.publish()
            summary.written(query_id, batch_id, self.database)
        except BaseException:
            writes.discard()
            raise
        finally:
            for frame in (tallied, events):
                frame.unpersist()

    def _summarize(self, batch: _Batch, events: DataFrame, frames: _Frames, after_pass: Callable[[], None]) -> bool:
        """Collect the batch's minute figures and newest alerts and commit them with its counted ranges
        (``summary.apply``); False if the batch log had it already. ``after_pass`` is called once the
        first pass has filled the cache (the Parquet writes start then)."""
        out = self._outputs(frames, after_pass)
        plan, before = batch.plan, batch.before
        counted = plan.after if plan.after is not None else self._ranges(events, before, out.events)
        unread = {f for f in batch.files or [] if str(audit.local_path(f)) in {item.path for item in batch.bad}}
        result = summary.BatchResult(
            hub=self.hub,
            query_id=batch.query_id,
            batch_id=batch.batch_id,
            finished_at=self._clock(),
            events=out.events,
            newest_enqueued=_utc(out.stats["newest_enqueued"]),
            newest_event=_utc(out.stats["newest_event"]),
            oldest_enqueued=_utc(out.stats["oldest_enqueued"]),
            write_seconds=time.perf_counter() - batch.started,
            minutes=out.minutes,
            alerts=out.alerts,
            unreadable=batch.bad,
            counted=counted,
            input_rows=self._rows(batch.files, unread),
            counted_before=before,
        )
        return self._commit(result, batch.files)

    def _fresh(
        self, batch: DataFrame, files: list[str] | None, batch_id: int, plan: ranges.Plan, skip: set[str]
    ) -> DataFrame:
        """The batch's well-formed events that no earlier batch counted (``plan``), each once; a small
        batch read on the driver (``small``), without the files in ``skip`` (unreadable)."""
        # Rows missing a required field are dropped, unless the files' footers rule them out. The
        # stream reads only the used columns (``start``), so the check reads the batch's files again,
        # every column (offset and event_id only for it).
        if audit.nulls_ruled_out(files):
            read = small.read(self._small_session(), files, skip, self.paths.located)
            checked = batch if read is None else read
        else:
            checked = self._well_formed(batch, files, batch_id)
        fresh = transforms.drop_counted(checked, plan.exclude)
        return transforms.deduplicate(fresh) if plan.dedupe else fresh

    def _small_session(self) -> SparkSession:
        """The session a batch read on the driver (``small``) runs in: this one's context, settings
        and cache, with one shuffle partition. A few thousand rows in four partitions cost more in
        tasks than in rows: the batch's pass took 0.85 s, 0.5 s in one (1,000 events/s over 16
        partitions, 3 s of them)."""
        if self._small is None:
            self._small = self.spark.newSession()
            self._small.conf.set("spark.sql.shuffle.partitions", str(small.SHUFFLE_PARTITIONS))
        return self._small

    def _outputs(self, frames: _Frames, after_pass: Callable[[], None]) -> _Outputs:
        """The batch's minute figures and newest alerts, collected. One pass over the events
        (``transforms.tallies``: per cell, each alerting event a row of its own; small, cached)
        gives them, and the results the staged writes write (started by ``after_pass``)."""
        alerts = frames.alerts
        minute_rows = frames.minutes.collect()  # the first action: the pass, and the cache
        after_pass()
        stats = transforms.totals(minute_rows)
        count = int(stats["events"])
        if not count:
            return _Outputs(count, stats, [], [])
        minutes: list[tuple[datetime, str, int, int]] = [
            (_utc(r["minute"]), r["sensor"], int(r["events"]), int(r["alerts"]))  # type: ignore[misc]
            for r in minute_rows
        ]
        newest = alerts.orderBy(F.desc("event_time"), F.desc("enqueued_time")).limit(summary.ALERTS_KEPT)
        return _Outputs(count, stats, minutes, [self._alert(row.asDict()) for row in newest.collect()])

    @staticmethod
    def _ranges(events: DataFrame, before: ranges.Ranges, count: int) -> ranges.Ranges:
        """The slow path: the counted ranges after the batch, from its data (its events' islands)."""
        found: dict[str, list[tuple[int, int]]] = {}
        for row in transforms.islands(events).collect() if count else []:
            found.setdefault(row["partition_id"], []).append((int(row["first"]), int(row["last"])))
        return ranges.add(before, found)

    def _commit(self, result: summary.BatchResult, files: list[str] | None) -> bool:
        """Applies the batch's summary unless the batch log has it already (False); then reports and counts it."""
        batch_id, count = result.batch_id, result.events
        if not summary.apply(result, self.database):
            if self.on_batch is not None:
                self.on_batch(batch_id, 0, files)
            return False
        self.written.append(batch_id)
        cluster.publish_quietly(self.paths.checkpoint.parent, self.spark)
        if self.on_batch is not None:
            self.on_batch(batch_id, count, files)
        metrics.BATCHES.inc()
        metrics.EVENTS.inc(count)
        metrics.ALERTS.inc(result.alert_count)
        metrics.UNREADABLE_FILES.inc(len(result.unreadable))
        log.info(
            "batch %d: %d events from %s files, %d alerts, %d unreadable files, written in %.2fs",
            batch_id,
            count,
            "?" if files is None else len(files),
            result.alert_count,
            len(result.unreadable),
            result.write_seconds,
        )
        return True

    def _well_formed(self, batch: DataFrame, files: list[str] | None, batch_id: int) -> DataFrame:
        """The batch's rows without those missing a required field, in ``transforms.USED`` columns:
        its ``files`` read again with every column, as the stream reads them (a file Spark cannot
        read is skipped). Raises RuntimeError if the file list is unknown (None): the columns the
        stream does not read could not be checked, and Spark could not replay the batch either."""
        if files is None:
            raise RuntimeError(f"the file source's log of batch {batch_id} in {self.paths.checkpoint} is unreadable")
        if not files:
            return transforms.well_formed(batch)
        reader = (
            self.spark.read.schema(LANDING).option("ignoreCorruptFiles", "true").option("ignoreMissingFiles", "true")
        )
        return transforms.used_columns(transforms.well_formed(reader.parquet(*files)))

    @staticmethod
    def _rows(files: list[str] | None, unread: set[str]) -> int | None:
        """Rows in the batch's readable files (their Parquet footers), None unless every file is local."""
        if files is None or not all(audit.local_path(f) for f in files):
            return None
        return audit.rows(set(files) - unread)

    @staticmethod
    def _alert(row: dict[str, Any]) -> dict[str, Any]:
        row["event_time"] = _utc(row["event_time"])
        row["enqueued_time"] = _utc(row["enqueued_time"])
        return row

    @staticmethod
    def _write(frame: DataFrame, folder: str) -> None:
        # Overwrite: a staging folder is new, but Spark's own retry of a write may find its first try.
        # One file per batch: coalesce, as the frame comes from the cached tallies (a few hundred
        # thousand rows at most per million events), so one task writes them without another shuffle.
        frame.coalesce(1).write.mode("overwrite").parquet(folder)

    # progress -------------------------------------------------------------------------------

    def record_progress(self, query: StreamingQuery) -> int:
        """Copy Spark's per-batch figures (rows read, trigger duration) into the batch log; returns
        how many batches got them. Call it now and then, and once after the query ends. A database
        that refuses the write (SQLite locked past its timeout on a busy machine) costs the figures
        a while, never the pipeline: they are written at the next call."""
        query_id = self.paths.query_id() or str(query.id)
        fresh = []
        for progress in query.recentProgress:
            entry = json.loads(progress.json) if hasattr(progress, "json") else dict(progress)
            batch_id = entry.get("batchId")
            # numInputRows is 0 for a batch read on the driver (``small``): Spark read no row of it. An
            # idle query's progress (no addBatch) names the next batch, which has not run yet.
            ran = "addBatch" in (entry.get("durationMs") or {})
            if batch_id is None or batch_id in self._recorded or not ran:
                continue
            fresh.append(entry)
        if not fresh:
            return 0
        try:
            updated = summary.record_progress(query_id, fresh, self.database)
        except DatabaseError as exc:
            log.warning(
                "batch figures not written yet (%s: %s); trying again at the next look", type(exc).__name__, exc
            )
            return 0
        for entry in fresh:
            self._recorded.add(int(entry["batchId"]))
            duration = (entry.get("durationMs") or {}).get("triggerExecution")
            if duration is not None:
                metrics.BATCH_DURATION.observe(duration / 1000.0)
        return updated


def results(spark: SparkSession, paths: Paths, kind: str = "aggregates") -> DataFrame:
    """The results so far: ``aggregates`` summed over batches (``transforms.combine``), or every ``alerts`` row."""
    frame = spark.read.parquet(str(paths.results / kind)).drop("batch_id")
    return transforms.combine(frame) if kind == "aggregates" else frame
