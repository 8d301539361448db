"""``manage.py runpipeline``: the Spark Structured Streaming job over one hub's landing area.

Continuous by default (a micro-batch every ``--trigger-seconds`` when files are new); ``--once``
processes what is landed now and exits. The Spark checkpoint (``LEASEBOARD_PIPELINE_DIR``/<hub>/
checkpoint) makes a restart resume where the last run stopped. ``--master`` is ``local[*]`` unless
``LEASEBOARD_SPARK_MASTER`` or the option says otherwise (``spark://host:7077`` for a cluster).

SIGTERM or Ctrl-C stops the query after the batch in hand (waiting at most STOP_WAIT seconds)
and exits 0; a batch cut short is replayed by the next run. If the query fails (the database is
down, say) a continuous run logs it and starts it again from the checkpoint after a pause;
``--once`` exits with the error instead. The job itself is ``workers.pipeline.job``; this
command only builds it and keeps it running.
"""

from __future__ import annotations

import logging
import shutil
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers.models import PipelineBatch
from workers.pipeline import audit, summary
from workers.pipeline.job import Paths, PipelineJob
from workers.pipeline.launcher import DEFAULT_TRIGGER_SECONDS
from workers.progress import Tracker, progress

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("leaseboard.pipeline")

RESTART_PAUSE = (2.0, 60.0)  # first and longest pause before starting a failed query again
STOP_WAIT = 20.0  # seconds a stop waits for the batch in hand (the launcher kills after 30)


class Command(BaseCommand):
    help = "Runs the Spark pipeline over the landing area: dedupe, aggregates per home/minute/sensor, alerts."

    def add_arguments(self, parser: CommandParser) -> None:
        add = parser.add_argument
        add("--hub", help="hub whose landing area to process (default: LEASEBOARD_HUB)")
        add("--master", help="Spark master (default: LEASEBOARD_SPARK_MASTER, else local[*]); spark://host:7077")
        add("--once", action="store_true", help="process what is landed now, then exit (trigger availableNow)")
        add(
            "--trigger-seconds",
            type=float,
            default=DEFAULT_TRIGGER_SECONDS,
            help=f"seconds between micro-batches when running continuously (default {DEFAULT_TRIGGER_SECONDS:g})",
        )
        add(
            "--reset",
            action="store_true",
            help="first delete the Spark checkpoint, the Parquet results and the database summary of the hub, "
            "and put the archived landing files back",
        )
        add("--metrics-port", type=int, default=0, help="serve Prometheus metrics on 127.0.0.1:PORT (default: off)")

    def handle(self, *args: Any, **options: Any) -> None:
        hub: str = options["hub"] or settings.LEASEBOARD_HUB
        if options["trigger_seconds"] <= 0:
            raise CommandError(f"--trigger-seconds must be more than 0, got {options['trigger_seconds']}")
        paths = Paths.for_hub(hub)
        if options["reset"]:
            self._reset(hub, paths)
        self._check_belongs_together(hub, paths)
        if options["metrics_port"]:
            from prometheus_client import start_http_server

            start_http_server(options["metrics_port"], addr="127.0.0.1")

        from workers.pipeline.spark import build_session  # imports pyspark: only when running

        master = options["master"] or getattr(settings, "LEASEBOARD_SPARK_MASTER", "") or "local[*]"
        spark = build_session(master)
        job = PipelineJob(spark, hub, paths, trigger_seconds=options["trigger_seconds"])
        self.stdout.write(f"pipeline of hub {hub!r} on {master}: landing {paths.landing}, results {paths.results}")
        if options["once"]:
            self._once(job)
        else:
            self._forever(job)

    def _reset(self, hub: str, paths: Paths) -> None:
        restored = paths.restore_archive()  # the files earlier batches read: the new query reads them again
        for folder in (paths.checkpoint, paths.results, paths.archive):
            shutil.rmtree(folder, ignore_errors=True)
        rows = summary.forget(hub)
        self.stdout.write(
            f"reset: deleted the checkpoint, the results and {rows} summary rows of hub {hub!r}; "
            f"{restored} archived landing files put back"
        )

    def _check_belongs_together(self, hub: str, paths: Paths) -> None:
        # The summary only adds batches up: a fresh checkpoint would count every landed file again.
        current = paths.query_id()
        others = summary.other_queries(hub, current)
        if others or (current is None and paths.results.exists() and any(paths.results.iterdir())):
            raise CommandError(
                f"the database or {paths.results} holds results of another run of hub {hub!r} than the Spark "
                f"checkpoint {paths.checkpoint} ({'missing' if current is None else 'query ' + current}); "
                "counting again would count twice. Run with --reset to start over."
            )
        # A summary from before the counted ranges (workers/pipeline/ranges.py): the ranges that say
        # which events were counted are missing, so a duplicate of an old event would count again.
        counted = PipelineBatch.objects.filter(hub=hub, query_id=current or "", events__gt=0).exists()
        if counted and not summary.counted_ranges(hub):
            raise CommandError(
                f"the summary of hub {hub!r} has counted events but no counted ranges (it predates them); "
                "run once with --reset to count the landing again with them."
            )

    def _once(self, job: PipelineJob) -> None:
        started = time.monotonic()
        # On a terminal, a progress line: landed rows read of those no batch had read (the Parquet
        # footers of the pending files, read only then), batches and events written so far.
        with progress("pipeline --once", unit="rows") as task:
            if task.enabled:
                pending = audit.pending(job.paths.landing, job.paths.checkpoint)
                task.update(total=audit.rows(pending), info=_info(0, 0, len(pending)))
                job.on_batch = _on_batch(task, len(pending))
            query = job.start(once=True)
            try:
                if not task.enabled:
                    query.awaitTermination()
                # Waking every second only to show Spark's status (none without a progress line).
                while task.enabled and not query.awaitTermination(1):
                    task.update(description=f"pipeline --once: {query.status.get('message', '')}".rstrip(": "))
            except Exception as exc:
                raise CommandError(f"the pipeline failed: {exc}") from exc
            finally:
                job.on_batch = None
                job.record_progress(query)
        rows = list(PipelineBatch.objects.filter(query_id=str(query.id), batch_id__in=job.written))
        events = sum(b.events for b in rows)
        read = sum(b.input_rows or 0 for b in rows)
        self.stdout.write(
            f"{len(rows)} batches: {events} events ({max(read - events, 0)} duplicates dropped), "
            f"{sum(b.alerts for b in rows)} alerts, {sum(b.unreadable_files for b in rows)} unreadable files "
            f"skipped, in {time.monotonic() - started:.1f}s"
        )

    def _forever(self, job: PipelineJob) -> None:
        stop = threading.Event()

        def on_signal(signum: int, _frame: Any) -> None:
            log.info("%s: stopping the pipeline", signal.Signals(signum).name)
            stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, on_signal)
        pause = RESTART_PAUSE[0]
        while not stop.is_set():
            query = job.start()
            try:
                # Returns every second, so a signal is handled within a second.
                while not stop.is_set() and not query.awaitTermination(1):
                    job.record_progress(query)
                    if query.lastProgress is not None:
                        pause = RESTART_PAUSE[0]  # a batch went through: healthy again
            except Exception as exc:  # the query failed; its last batch is replayed on restart
                log.error("the pipeline failed; starting it again from its checkpoint in %gs: %s", pause, exc)
                stop.wait(pause)
                pause = min(pause * 2, RESTART_PAUSE[1])
                continue
            finally:
                self._stop(query)
                job.record_progress(query)
        self.stdout.write("pipeline stopped")

    @staticmethod
    def _stop(query: StreamingQuery) -> None:
        """Stop ``query``, after the batch in hand if it ends within STOP_WAIT seconds: stopping one
        midway interrupts Spark's threads (a batch cut short is replayed, but with a stack trace)."""
        deadline = time.monotonic() + STOP_WAIT
        while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.1)
        if query.isActive:
            query.stop()


def _info(batches: int, events: int, files_left: int) -> str:
    return f"{batches} batches, {events:,} events written, {files_left} files left"


def _on_batch(task: Tracker, files: int) -> Callable[[int, int, list[str] | None], None]:
    """The job's ``on_batch`` for a progress line (called on Spark's callback thread)."""
    done = {"batches": 0, "events": 0, "files": 0}

    def on_batch(_batch_id: int, events: int, batch_files: list[str] | None) -> None:
        done["batches"] += 1
        done["events"] += events
        done["files"] += len(batch_files or [])
        task.advance(audit.rows(batch_files or []))
        task.update(info=_info(done["batches"], done["events"], max(files - done["files"], 0)))

    return on_batch
