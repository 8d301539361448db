"""The SparkSession of the pipeline, with what this machine and the job need.

Local by default (``local[*]``); ``spark://host:7077`` runs the executors on a cluster, which then
must see the landing and pipeline folders at the same paths. The job uses no Python UDFs, so
executors need Java only, not this project's code.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

BASE_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    # Results as standard UTC timestamps (not Spark's legacy INT96), so pyarrow and others read them as such.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    # The file source hands each batch its files by name, and Spark lists them again; past 32 names
    # (the default) as a Spark job of one task per file: 208 tasks, 1.5 to 2 s for a 1 M-event batch,
    # where the driver stats them in milliseconds.
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
    # A map-side (partial) aggregate that merges few rows costs more than it saves: the job's tallies
    # (per home, minute and sensor, each alert its own row) keep about 8 rows of 10. Spark stops
    # aggregating on the map side past 100,000 rows when more than this share stays (0.9 by default).
    # Profiled on 1 M events: the scan stage took about half as long.
    "spark.sql.aggregate.skipPartialAggregate.aggregateRatio": "0.5",
    # The job caches one small frame a batch (the tallies: a few hundred thousand rows per million
    # events, read back three times at once). Compressing its column batches cost more CPU than the
    # memory it saves is worth: profiled on 1 M events, the batch took about a sixth less CPU without.
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
}


def build_session(
    master: str = "local[*]", app_name: str = "leaseboard-pipeline", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A session on ``master`` (the running one if this process already has one: its settings stay)."""
    # Without these Spark binds to whatever the host name resolves to, and Python workers would
    # start a different interpreter (one without pyarrow).
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # a cluster must reach the driver elsewhere
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**BASE_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a line per callback otherwise
    session.sparkContext.setLogLevel(os.environ.get("LEASEBOARD_SPARK_LOG_LEVEL", "WARN"))
    return session
