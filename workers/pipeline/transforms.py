"""The pipeline's logic: pure DataFrame-to-DataFrame functions, no I/O, batch or streaming alike.

Input rows are landed events (``schema.LANDING``). Alerts follow the home-security example of
``003_1736e87014fbc6da.txt``: glass breaking, smoke, and a door or window opened while the home's
alarm is armed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .schema import KEY, LANDING

GLASS_BREAK = "glass_break"
SMOKE = "smoke"
INTRUSION = "opened_while_armed"
ALERT_KINDS = (GLASS_BREAK, SMOKE, INTRUSION)


def well_formed(events: DataFrame) -> DataFrame:
    """``events`` without rows missing a required field (a landing file lacking a column reads as
    nulls in it): such a row cannot be counted, and must not take the key of a good copy."""
    required = [F.col(f.name).isNotNull() for f in LANDING if not f.nullable]
    condition = required[0]
    for check in required[1:]:
        condition = condition & check
    return events.where(condition)


USED = ["partition_id", "sequence_number", "enqueued_time", "home", "sensor", "sensor_id", "event", "armed",
        "event_time"]  # fmt: skip


def used_columns(events: DataFrame) -> DataFrame:
    """``events`` with only the columns the aggregates and alerts use (less to shuffle and cache)."""
    return events.select(*USED)


def deduplicate(events: DataFrame) -> DataFrame:
    """``events`` with one row per (partition_id, sequence_number), within this batch (no state)."""
    return events.dropDuplicates(KEY)


def drop_counted(events: DataFrame, counted: Mapping[str, Sequence[tuple[int, int]]]) -> DataFrame:
    """``events`` without the rows whose sequence number lies in their partition's ``counted`` intervals
    (``ranges.Plan.exclude``: what earlier batches counted)."""
    condition: Column | None = None
    for partition, intervals in sorted(counted.items()):
        if not intervals:
            continue
        inside = F.lit(False)
        for first, last in intervals:
            inside = inside | F.col("sequence_number").between(first, last)
        term = (F.col("partition_id") == partition) & inside
        condition = term if condition is None else condition | term
    return events if condition is None else events.where(~condition)


def islands(events: DataFrame) -> DataFrame:
    """The runs of consecutive sequence numbers in ``events`` (one row per key): (partition_id, first,
    last). The slow path of ``ranges``, for a batch whose files do not name their ranges."""
    order = Window.partitionBy("partition_id").orderBy("sequence_number")
    run = F.col("sequence_number") - F.row_number().over(order)
    return (
        events.select("partition_id", "sequence_number")
        .withColumn("run", run)
        .groupBy("partition_id", "run")
        .agg(F.min("sequence_number").alias("first"), F.max("sequence_number").alias("last"))
        .drop("run")
    )


def alert_kind(sensor: Column, event: Column, armed: Column) -> Column:
    """The alert a reading raises (one of ALERT_KINDS), else null."""
    return (
        F.when((sensor == "glass_break") & (event == "detected"), F.lit(GLASS_BREAK))
        .when((sensor == "smoke") & (event == "detected"), F.lit(SMOKE))
        .when(sensor.isin("door", "window") & (event == "opened") & armed, F.lit(INTRUSION))
    )


def _minute(events: DataFrame) -> Column:
    return F.date_trunc("minute", events["event_time"]).alias("minute")


def per_home_minute_sensor(events: DataFrame) -> DataFrame:
    """Events per home per minute (of the sensor's clock) per sensor type:
    (home, minute, sensor, events)."""
    return events.groupBy("home", _minute(events), "sensor").agg(F.count(F.lit(1)).alias("events"))


def per_minute_sensor(events: DataFrame) -> DataFrame:
    """Events and alerts per minute per sensor type, all homes: (minute, sensor, events, alerts)."""
    raised = alert_kind(events["sensor"], events["event"], events["armed"]).isNotNull()
    return events.groupBy(_minute(events), "sensor").agg(
        F.count(F.lit(1)).alias("events"), F.sum(raised.cast("long")).alias("alerts")
    )


def cells(events: DataFrame) -> DataFrame:
    """One pass over ``events`` for everything a batch reports but the alerts themselves: per home,
    minute and sensor type (home, minute, sensor, events, alerts, oldest_enqueued, newest_enqueued,
    newest_event). ``per_home_minute_sensor``, ``per_minute_sensor`` and ``summary`` follow from it
    (``of_cells``) without reading the events again."""
    raised = alert_kind(events["sensor"], events["event"], events["armed"]).isNotNull()
    return events.groupBy("home", _minute(events), "sensor").agg(
        F.count(F.lit(1)).alias("events"),
        F.sum(raised.cast("long")).alias("alerts"),
        F.min("enqueued_time").alias("oldest_enqueued"),
        F.max("enqueued_time").alias("newest_enqueued"),
        F.max("event_time").alias("newest_event"),
    )


def of_cells(grid: DataFrame) -> tuple[DataFrame, DataFrame, DataFrame]:
    """From ``cells``: (``per_home_minute_sensor``, ``per_minute_sensor``, ``summary``), the same rows."""
    aggregates = grid.select("home", "minute", "sensor", "events")
    minutes = grid.groupBy("minute", "sensor").agg(
        F.sum("events").alias("events"), F.sum("alerts").alias("alerts")
    )
    totals = grid.agg(
        F.coalesce(F.sum("events"), F.lit(0)).alias("events"),
        F.min("oldest_enqueued").alias("oldest_enqueued"),
        F.max("newest_enqueued").alias("newest_enqueued"),
        F.max("newest_event").alias("newest_event"),
    )
    return aggregates, minutes, totals


def combine(aggregates: DataFrame) -> DataFrame:
    """Counts of several batches (rows of ``per_home_minute_sensor``) summed per key."""
    return aggregates.groupBy("home", "minute", "sensor").agg(F.sum("events").alias("events"))


def alerts(events: DataFrame) -> DataFrame:
    """One row per alerting event: (partition_id, sequence_number, home, kind, sensor, sensor_id,
    event, event_time, enqueued_time)."""
    kind = alert_kind(events["sensor"], events["event"], events["armed"])
    return (
        events.withColumn("kind", kind)
        .where(F.col("kind").isNotNull())
        .select(*KEY, "home", "kind", "sensor", "sensor_id", "event", "event_time", "enqueued_time")
    )


def summary(events: DataFrame) -> DataFrame:
    """One row describing ``events``: (events, oldest_enqueued, newest_enqueued, newest_event); times
    null when empty."""
    return events.agg(
        F.count(F.lit(1)).alias("events"),
        F.min("enqueued_time").alias("oldest_enqueued"),
        F.max("enqueued_time").alias("newest_enqueued"),
        F.max("event_time").alias("newest_event"),
    )
