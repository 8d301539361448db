"""The streaming job over real landing files: exactly once across duplicates, restarts and replays;
unreadable files reported once and skipped."""

from __future__ import annotations

import logging
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from workers.landing import file_name
from workers.models import UnreadableFile
from workers.pipeline import audit, summary
from workers.pipeline.job import together
from workers.sensors import SensorEvent

from .conftest import HUB, Landing, fleet_events
from .helpers import (
    Key,
    aggregates_in_parquet,
    alerts_in_db,
    alerts_in_parquet,
    batches,
    expected_aggregates,
    expected_alerts,
    expected_minutes,
    minutes_in_db,
    run_once,
)

pytestmark = pytest.mark.django_db(transaction=True)  # the job writes from Spark's callback thread


def land_with_redeliveries(landing: Landing, readings: list[SensorEvent]) -> dict[Key, SensorEvent]:
    """Land ``readings`` over three partitions, some ranges twice (as after a crash); returns them by key."""
    keyed: dict[Key, SensorEvent] = {}
    third = len(readings) // 3
    for n, pid in enumerate(("0", "1", "2")):
        part = readings[n * third : (n + 1) * third]
        keyed.update({(pid, s): e for s, e in enumerate(part)})
        bodies = [e.to_json() for e in part]
        half = len(bodies) // 2
        landing.land(pid, 0, bodies[:half])
        landing.land(pid, half - 10, bodies[half - 10 :])  # a new owner re-landed 10 events
    landing.land("0", 0, [e.to_json() for e in readings[:third][:20]])  # and the same range again
    return keyed


def test_every_landed_event_is_counted_once_and_every_alert_is_raised_once(
    spark: SparkSession, landing: Landing
) -> None:
    readings = fleet_events(1500, seed=3)
    keyed = land_with_redeliveries(landing, readings)
    assert len(keyed) == 1500

    run_once(spark, landing.paths)

    assert aggregates_in_parquet(spark, landing.paths) == expected_aggregates(keyed.values())
    assert minutes_in_db() == expected_minutes(keyed.values())
    alerts = expected_alerts(keyed)
    assert len(alerts) > 10, "the seed raised too few alerts to prove anything"
    assert sorted(alerts_in_parquet(spark, landing.paths)) == sorted(alerts.items())
    assert sorted(alerts_in_db()) == sorted(alerts.items())
    [batch] = batches()
    assert (batch.events, batch.alerts, batch.input_rows) == (1500, len(alerts), 1500 + 3 * 10 + 20)
    assert batch.duplicates == 50 and batch.duration_seconds is not None and batch.duration_seconds > 0


def test_a_restart_resumes_at_the_checkpoint_and_drops_events_landed_again_later(
    spark: SparkSession, landing: Landing
) -> None:
    readings = fleet_events(600, seed=5)
    bodies = [e.to_json() for e in readings]
    landing.land("0", 0, bodies[:300])
    run_once(spark, landing.paths)
    landing.land("0", 250, bodies[250:600])  # 50 landed again, long after the first run counted them
    landing.land("1", 0, bodies[:10])  # the same bodies in another partition are other events

    run_once(spark, landing.paths)

    counted = readings + readings[:10]
    assert aggregates_in_parquet(spark, landing.paths) == expected_aggregates(counted)
    assert minutes_in_db() == expected_minutes(counted)
    assert [(b.batch_id, b.events, b.input_rows) for b in batches()] == [(0, 300, 300), (1, 310, 360)]


def test_a_batch_replayed_after_a_crash_before_its_commit_is_counted_once(
    spark: SparkSession, landing: Landing, caplog: pytest.LogCaptureFixture
) -> None:
    readings = fleet_events(400, seed=11)
    landing.land("0", 0, [e.to_json() for e in readings])
    run_once(spark, landing.paths)
    before = (minutes_in_db(), sorted(alerts_in_db()), aggregates_in_parquet(spark, landing.paths))
    # What a crash between foreachBatch and Spark's commit leaves: the batch without its commit.
    for name in ("0", ".0.crc"):
        (landing.paths.checkpoint / "commits" / name).unlink()

    with caplog.at_level(logging.INFO, logger="leaseboard.pipeline"):
        run_once(spark, landing.paths)

    assert "batch 0 was committed before a restart" in caplog.text, "Spark did not replay the batch"
    assert (minutes_in_db(), sorted(alerts_in_db()), aggregates_in_parquet(spark, landing.paths)) == before
    assert [b.batch_id for b in batches()] == [0]
    assert sum(before[0][k][0] for k in before[0]) == 400


def test_a_batch_replayed_after_a_crash_between_its_summary_and_its_parquet_writes_only_its_parquet(
    spark: SparkSession, landing: Landing, caplog: pytest.LogCaptureFixture
) -> None:
    readings = fleet_events(400, seed=12)
    landing.land("0", 0, [e.to_json() for e in readings])
    run_once(spark, landing.paths)
    before = (minutes_in_db(), sorted(alerts_in_db()), aggregates_in_parquet(spark, landing.paths))
    [logged] = batches()
    assert logged.results_written and logged.counted_before is None
    # What a crash after the summary's commit and before the Parquet leaves: the batch logged as not
    # written, with the ranges its plan started from; no results; no Spark commit.
    type(logged).objects.filter(id=logged.id).update(results_written=False, counted_before="{}")
    for kind in ("aggregates", "alerts"):
        shutil.rmtree(landing.paths.results / kind / "batch_id=0")
    for name in ("0", ".0.crc"):
        (landing.paths.checkpoint / "commits" / name).unlink()

    with caplog.at_level(logging.INFO, logger="leaseboard.pipeline"):
        run_once(spark, landing.paths)

    assert "its results not yet written: writing them" in caplog.text, "Spark did not replay the batch"
    # The same plan as the first time (the table's ranges now include the batch's own events).
    assert (minutes_in_db(), sorted(alerts_in_db()), aggregates_in_parquet(spark, landing.paths)) == before
    assert sorted(alerts_in_parquet(spark, landing.paths)) == sorted(before[1])
    [logged] = batches()
    assert logged.results_written and logged.counted_before is None


def test_unreadable_landing_files_are_reported_once_and_skipped_not_retried(
    spark: SparkSession, landing: Landing
) -> None:
    readings = fleet_events(300, seed=13)
    bodies = [e.to_json() for e in readings]
    landing.land("0", 0, bodies[:100])
    landing.land("1", 0, bodies[100:200])
    good = landing.root / HUB / "1" / file_name(0, 99)
    truncated = landing.root / HUB / "1" / file_name(100, 149)
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # a torn copy, as a bad disk leaves
    table = pq.read_table(good)
    retyped = landing.root / HUB / "1" / file_name(150, 249)  # another writer's idea of the schema
    pq.write_table(table.set_column(1, "sequence_number", table.column(1).cast(pa.string())), retyped)

    run_once(spark, landing.paths)
    landing.land("2", 0, bodies[200:300])
    run_once(spark, landing.paths)

    reports = {r.path: r for r in UnreadableFile.objects.filter(hub=HUB)}
    truncated = landing.paths.located(truncated)  # archived with the rest of the batch: skipped, kept
    assert sorted(reports) == sorted([str(landing.paths.landing / "1" / truncated.name), str(retyped)])
    report = reports[str(landing.paths.landing / "1" / truncated.name)]
    assert report.size == truncated.stat().st_size and truncated.is_relative_to(landing.paths.archive)
    assert "Parquet" in report.error or "parquet" in report.error
    assert reports[str(retyped)].error == "column 'sequence_number' is string, not int64"
    assert [(b.events, b.unreadable_files) for b in batches()] == [(200, 2), (100, 0)]
    assert minutes_in_db() == expected_minutes(readings)
    with pytest.raises(pa.ArrowInvalid):
        pq.read_table(truncated)  # it really is unreadable


def test_the_dedupe_state_is_a_few_ranges_per_partition_across_gaps_late_files_and_odd_names(
    spark: SparkSession, landing: Landing
) -> None:
    readings = fleet_events(500, seed=17)
    bodies = [e.to_json() for e in readings]
    landing.land("0", 200, bodies[200:300])  # out of order: a gap before it
    landing.land("1", 0, bodies[:100])
    run_once(spark, landing.paths)
    assert summary.counted_ranges(HUB) == {"0": [(200, 299)], "1": [(0, 99)]}

    landing.land("0", 0, bodies[:210])  # the late file, overlapping the counted range
    landing.land("0", 150, bodies[150:250])  # and another owner's cut of the same events
    run_once(spark, landing.paths)
    assert summary.counted_ranges(HUB) == {"0": [(0, 299)], "1": [(0, 99)]}

    # A file whose name is not a range: the slow path (every counted range excluded, ranges from the data).
    odd = landing.root / HUB / "1" / "copied-by-hand.parquet"
    landing.land("1", 50, bodies[50:150])
    (landing.root / HUB / "1" / file_name(50, 149)).rename(odd)
    run_once(spark, landing.paths)

    assert summary.counted_ranges(HUB) == {"0": [(0, 299)], "1": [(0, 149)]}
    counted = readings[:300] + readings[:150]
    assert minutes_in_db() == expected_minutes(counted)
    assert aggregates_in_parquet(spark, landing.paths) == expected_aggregates(counted)
    assert [b.events for b in batches()] == [200, 200, 50]


def test_rows_missing_a_required_field_are_dropped_whether_or_not_the_footers_rule_nulls_out(
    spark: SparkSession, landing: Landing
) -> None:
    readings = fleet_events(300, seed=19)
    for n, pid in enumerate(("0", "1", "2")):
        landing.land(pid, 0, [e.to_json() for e in readings[n * 100 : (n + 1) * 100]])
    files = [landing.root / HUB / pid / file_name(0, 99) for pid in ("0", "1", "2")]
    assert audit.nulls_ruled_out([f.as_uri() for f in files])  # the landing's own files: REQUIRED columns
    # Another writer's files: every column nullable; one without nulls (its statistics say so), one
    # with an event whose home is missing (that event cannot be counted).
    for path, holes in ((files[1], []), (files[2], [7])):
        table = pq.read_table(path)
        table = table.cast(pa.schema([f.with_nullable(True) for f in table.schema]))
        homes = [None if i in holes else h for i, h in enumerate(table.column("home").to_pylist())]
        at = table.schema.get_field_index("home")
        pq.write_table(table.set_column(at, table.schema.field(at), pa.array(homes, pa.string())), path)
    assert audit.nulls_ruled_out([files[0].as_uri(), files[1].as_uri()])
    assert not audit.nulls_ruled_out([files[0].as_uri(), files[2].as_uri()])
    assert not audit.nulls_ruled_out(None)

    run_once(spark, landing.paths)

    counted = [e for i, e in enumerate(readings) if i != 207]
    assert [b.events for b in batches()] == [299]
    assert minutes_in_db() == expected_minutes(counted)
    assert aggregates_in_parquet(spark, landing.paths) == expected_aggregates(counted)


def test_rows_missing_a_field_the_stream_does_not_read_are_dropped(spark: SparkSession, landing: Landing) -> None:
    # The stream reads only the columns the aggregates and alerts use; offset and event_id are
    # required too, so a batch whose footers allow a null in them is checked from its files.
    readings = fleet_events(300, seed=23)
    for n, pid in enumerate(("0", "1", "2")):
        landing.land(pid, 0, [e.to_json() for e in readings[n * 100 : (n + 1) * 100]])
    one, two = (landing.root / HUB / pid / file_name(0, 99) for pid in ("1", "2"))
    table = pq.read_table(one)  # another writer's file: nullable columns, an event without its offset
    table = table.cast(pa.schema([f.with_nullable(True) for f in table.schema]))
    at = table.schema.get_field_index("offset")
    offsets = [None if i == 4 else o for i, o in enumerate(table.column("offset").to_pylist())]
    pq.write_table(table.set_column(at, table.schema.field(at), pa.array(offsets, pa.string())), one)
    pq.write_table(pq.read_table(two).drop_columns(["event_id"]), two)  # a file without event ids

    run_once(spark, landing.paths)

    counted = [e for i, e in enumerate(readings) if i != 104 and i < 200]
    assert [b.events for b in batches()] == [199]
    assert minutes_in_db() == expected_minutes(counted)
    assert aggregates_in_parquet(spark, landing.paths) == expected_aggregates(counted)


def test_calls_run_together_return_in_order_keep_the_job_properties_and_all_end_before_a_failure_is_raised(
    spark: SparkSession,
) -> None:
    context = spark.sparkContext
    context.setLocalProperty("leaseboard.test", "batch 7")  # as a query's job group is set in its thread
    try:
        assert together(lambda: 1, lambda: context.getLocalProperty("leaseboard.test")) == [1, "batch 7"]
    finally:
        context.setLocalProperty("leaseboard.test", None)  # type: ignore[arg-type]
    ran: list[int] = []

    def boom() -> None:
        raise ValueError("a write failed")

    with pytest.raises(ValueError, match="a write failed"):
        together(lambda: ran.append(1), boom, lambda: ran.append(3))
    assert sorted(ran) == [1, 3]
