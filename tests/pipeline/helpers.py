"""What the pipeline tests expect, computed in plain Python from the events they landed, and
what the pipeline produced, read back from its Parquet results and the database."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from workers.models import Alert, MinuteSummary, PipelineBatch
from workers.pipeline.job import Paths, PipelineJob, results
from workers.pipeline.summary import ALERTS_KEPT
from workers.sensors import SensorEvent

from .conftest import HUB

Key = tuple[str, int]  # (partition id, sequence number)


def minute(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds // 60 * 60, UTC)


def alert_kind(e: SensorEvent) -> str | None:
    if e.sensor in ("glass_break", "smoke") and e.event == "detected":
        return e.sensor
    if e.sensor in ("door", "window") and e.event == "opened" and e.armed:
        return "opened_while_armed"
    return None


def expected_aggregates(events: Iterable[SensorEvent]) -> Counter[tuple[str, datetime, str]]:
    return Counter((e.home, minute(e.timestamp), e.sensor) for e in events)


def expected_minutes(events: Iterable[SensorEvent]) -> dict[tuple[datetime, str], tuple[int, int]]:
    counts: Counter[tuple[datetime, str]] = Counter()
    alerts: Counter[tuple[datetime, str]] = Counter()
    for e in events:
        counts[(minute(e.timestamp), e.sensor)] += 1
        alerts[(minute(e.timestamp), e.sensor)] += alert_kind(e) is not None
    return {k: (counts[k], alerts[k]) for k in counts}


def expected_alerts(keyed: dict[Key, SensorEvent]) -> dict[Key, str]:
    return {key: kind for key, e in keyed.items() if (kind := alert_kind(e)) is not None}


def assert_newest_alerts_kept(kept: list[tuple[Key, str]], keyed: dict[Key, SensorEvent]) -> None:
    """The database keeps the ``ALERTS_KEPT`` most recently raised alerts of a hub, each once: all of
    them when there are no more, exactly the expected ones."""
    expected = expected_alerts(keyed)
    shown = dict(kept)
    assert len(kept) == len(shown) == min(len(expected), ALERTS_KEPT), "an alert shown twice, or one too few"
    assert shown.items() <= expected.items(), "an alert shown that no event raised"


def run_once(spark: SparkSession, paths: Paths) -> PipelineJob:
    """One ``--once`` run of the job to its end; raises what the query raised."""
    job = PipelineJob(spark, HUB, paths)
    query = job.start(once=True)
    query.awaitTermination()
    job.record_progress(query)
    return job


def aggregates_in_parquet(spark: SparkSession, paths: Paths) -> Counter[tuple[str, datetime, str]]:
    rows = results(spark, paths).collect()
    return Counter({(r["home"], r["minute"].astimezone(UTC), r["sensor"]): r["events"] for r in rows})


def alerts_in_parquet(spark: SparkSession, paths: Paths) -> list[tuple[Key, str]]:
    rows = results(spark, paths, "alerts").collect()
    return [((r["partition_id"], r["sequence_number"]), r["kind"]) for r in rows]


def minutes_in_db() -> dict[tuple[datetime, str], tuple[int, int]]:
    return {(m.minute, m.sensor): (m.events, m.alerts) for m in MinuteSummary.objects.filter(hub=HUB)}


def alerts_in_db() -> list[tuple[Key, str]]:
    return [((a.partition_id, a.sequence_number), a.kind) for a in Alert.objects.filter(hub=HUB)]


def batches() -> list[PipelineBatch]:
    return list(PipelineBatch.objects.filter(hub=HUB).order_by("batch_id"))
