"""The pure transforms on small inline frames (one session-wide SparkSession, chispa comparisons)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructField, StructType

from workers.landing import ARROW_SCHEMA
from workers.pipeline import transforms
from workers.pipeline.schema import LANDING


def at(minute: int, second: int = 0) -> datetime:
    return datetime(2026, 1, 1, 12, minute, second, tzinfo=UTC)


def events(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    """Landed events from (partition, sequence, home, sensor, event, armed, event_time) tuples."""
    full = [
        (p, s, str(s), t, None, f"e{p}-{s}", home, sensor, f"{sensor}-1", event, armed, t)
        for p, s, home, sensor, event, armed, t in rows
    ]
    return spark.createDataFrame(full, LANDING)


def test_the_landing_schema_written_by_workers_is_the_one_spark_reads() -> None:
    spark_side = from_arrow_schema(ARROW_SCHEMA)
    assert [(f.name, f.dataType, f.nullable) for f in spark_side] == [(f.name, f.dataType, f.nullable) for f in LANDING]


def test_deduplicate_keeps_one_row_per_partition_and_sequence_number(spark: SparkSession) -> None:
    frame = events(
        spark,
        [
            ("0", 1, "home-1", "door", "opened", False, at(0)),
            ("0", 1, "home-1", "door", "opened", False, at(0)),  # landed twice
            ("1", 1, "home-2", "smoke", "detected", False, at(0)),  # same number, other partition
            ("0", 2, "home-1", "door", "closed", False, at(1)),
        ],
    )
    expected = events(
        spark,
        [
            ("0", 1, "home-1", "door", "opened", False, at(0)),
            ("0", 2, "home-1", "door", "closed", False, at(1)),
            ("1", 1, "home-2", "smoke", "detected", False, at(0)),
        ],
    )
    assert_df_equality(transforms.deduplicate(frame), expected, ignore_row_order=True)


def test_events_are_counted_per_home_minute_and_sensor_type(spark: SparkSession) -> None:
    frame = events(
        spark,
        [
            ("0", 1, "home-1", "door", "opened", False, at(0, 5)),
            ("0", 2, "home-1", "door", "closed", False, at(0, 59)),
            ("0", 3, "home-1", "door", "opened", False, at(1, 0)),  # the next minute
            ("0", 4, "home-1", "motion", "detected", False, at(0, 30)),
            ("1", 1, "home-2", "door", "opened", False, at(0, 10)),
        ],
    )
    expected = spark.createDataFrame(
        [
            ("home-1", at(0), "door", 2),
            ("home-1", at(1), "door", 1),
            ("home-1", at(0), "motion", 1),
            ("home-2", at(0), "door", 1),
        ],
        "home string, minute timestamp, sensor string, events long",
    )
    assert_df_equality(transforms.per_home_minute_sensor(frame), expected, ignore_row_order=True, ignore_nullable=True)


def test_alerts_are_glass_break_smoke_and_a_door_or_window_opened_while_armed(spark: SparkSession) -> None:
    frame = events(
        spark,
        [
            ("0", 1, "home-1", "glass_break", "detected", False, at(0)),
            ("0", 2, "home-1", "smoke", "detected", False, at(0)),
            ("0", 3, "home-1", "smoke", "cleared", True, at(0)),  # not an alert
            ("0", 4, "home-1", "door", "opened", True, at(0)),
            ("0", 5, "home-1", "window", "opened", True, at(0)),
            ("0", 6, "home-1", "door", "opened", False, at(0)),  # disarmed: not an alert
            ("0", 7, "home-1", "window", "closed", True, at(0)),  # closing: not an alert
            ("0", 8, "home-1", "motion", "detected", True, at(0)),  # motion raises none here
        ],
    )
    got = {(r["sequence_number"], r["kind"]) for r in transforms.alerts(frame).collect()}
    assert got == {(1, "glass_break"), (2, "smoke"), (4, "opened_while_armed"), (5, "opened_while_armed")}


def test_per_minute_sensor_counts_events_and_alerts_over_all_homes(spark: SparkSession) -> None:
    frame = events(
        spark,
        [
            ("0", 1, "home-1", "door", "opened", True, at(0, 1)),
            ("1", 1, "home-2", "door", "opened", False, at(0, 2)),
            ("1", 2, "home-2", "door", "closed", True, at(0, 3)),
            ("1", 3, "home-2", "smoke", "detected", False, at(2, 0)),
        ],
    )
    expected = spark.createDataFrame(
        [(at(0), "door", 3, 1), (at(2), "smoke", 1, 1)],
        "minute timestamp, sensor string, events long, alerts long",
    )
    assert_df_equality(transforms.per_minute_sensor(frame), expected, ignore_row_order=True, ignore_nullable=True)


def test_combine_sums_the_counts_of_several_batches_per_key(spark: SparkSession) -> None:
    schema = "home string, minute timestamp, sensor string, events long"
    batches = spark.createDataFrame(
        [("home-1", at(0), "door", 2), ("home-1", at(0), "door", 3), ("home-1", at(1), "door", 1)], schema
    )
    expected = spark.createDataFrame([("home-1", at(0), "door", 5), ("home-1", at(1), "door", 1)], schema)
    assert_df_equality(transforms.combine(batches), expected, ignore_row_order=True, ignore_nullable=True)


def test_the_summary_of_a_batch_is_its_count_and_newest_times(spark: SparkSession) -> None:
    frame = events(
        spark,
        [
            ("0", 1, "home-1", "door", "opened", False, at(3)),
            ("0", 2, "home-1", "door", "closed", False, at(7)),
        ],
    )
    row = transforms.summary(frame).first()
    assert row is not None and row["events"] == 2
    assert row["newest_event"].astimezone(UTC) == at(7)
    empty = transforms.summary(frame.where("false")).first()
    assert empty is not None and (empty["events"], empty["newest_enqueued"]) == (0, None)


def test_rows_missing_a_required_field_are_not_well_formed(spark: SparkSession) -> None:
    rows = [
        ("0", 1, "1", at(0), None, "e1", "home-1", "door", "door-1", "opened", False, at(0)),  # no key: fine
        ("0", 2, "2", at(0), "k", "e2", None, "door", "door-1", "opened", False, at(0)),  # no home
        ("0", 3, "3", at(0), "k", "e3", "home-1", "door", "door-1", "opened", None, at(0)),  # armed unknown
    ]
    nullable = StructType([StructField(f.name, f.dataType, True) for f in LANDING])
    frame = spark.createDataFrame(rows, nullable)
    assert [r["sequence_number"] for r in transforms.well_formed(frame).collect()] == [1]


def test_the_tallies_give_the_same_aggregates_alerts_minutes_and_summary_as_the_events(spark: SparkSession) -> None:
    frame = events(
        spark,
        [
            ("0", 1, "home-1", "door", "opened", True, at(0, 5)),
            ("0", 2, "home-1", "door", "closed", True, at(0, 9)),
            ("0", 3, "home-1", "door", "opened", True, at(0, 7)),  # a second alert in the same cell
            ("0", 4, "home-1", "door", "opened", False, at(0, 8)),  # and an event of it that raised none
            ("1", 1, "home-2", "smoke", "detected", False, at(1)),
            ("1", 2, "home-1", "motion", "detected", False, at(1, 30)),
            ("2", 7, "home-2", "glass_break", "detected", False, at(3)),
        ],
    )
    aggregates, alerts, minutes = transforms.of_tallies(transforms.tallies(frame))
    assert_df_equality(aggregates, transforms.per_home_minute_sensor(frame), ignore_row_order=True)
    assert_df_equality(alerts, transforms.alerts(frame), ignore_row_order=True, ignore_nullable=True)
    assert_df_equality(
        minutes.select("minute", "sensor", "events", "alerts"),
        transforms.per_minute_sensor(frame),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    assert transforms.totals(minutes.collect()) == transforms.summary(frame).first().asDict()  # type: ignore[union-attr]
    empty = transforms.totals(transforms.of_tallies(transforms.tallies(frame.limit(0)))[2].collect())
    assert empty == {"events": 0, "oldest_enqueued": None, "newest_enqueued": None, "newest_event": None}
