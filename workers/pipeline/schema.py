"""The landing files' schema as Spark reads it (``workers.landing.ARROW_SCHEMA`` is the writer's side).

A streaming file source needs its schema up front; a test proves the two sides agree.
"""

from __future__ import annotations

from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType, TimestampType

LANDING = StructType(
    [
        StructField("partition_id", StringType(), False),
        StructField("sequence_number", LongType(), False),
        StructField("offset", StringType(), False),
        StructField("enqueued_time", TimestampType(), False),
        StructField("partition_key", StringType(), True),
        StructField("event_id", StringType(), False),
        StructField("home", StringType(), False),
        StructField("sensor", StringType(), False),
        StructField("sensor_id", StringType(), False),
        StructField("event", StringType(), False),
        StructField("armed", BooleanType(), False),
        StructField("event_time", TimestampType(), False),
    ]
)
KEY = ["partition_id", "sequence_number"]  # one event: what the hub gave it, whoever landed it
