"""A small batch read on the driver: its landing files with pyarrow, handed to Spark as one frame.

Spark's file scan costs per file, not per row: a batch of 240 landing files of a dozen events each
(what 1,000 events a second over 16 partitions land in 3 s, with the landing's 0.2 s linger) took
about a second to scan in Spark's tasks, where pyarrow reads the same files on the driver in about
0.15 s and ``createDataFrame`` hands them over in about 0.3 s. Past ``MAX_ROWS`` rows the scan's
parallelism wins (a 1 M-event batch stays with Spark's reader), so only small batches come here.

The rows are the same as the stream's own: the files the file source gave the batch (its log,
``audit.batch_files``), where they are now (``Paths.located``: a replayed batch's files may be in the
archive), the used columns in the stream's types, and never a file found unreadable (the batch
plan leaves those out). Whatever goes wrong here (a file gone or cut since) gives None: the job then
uses the stream's frame, as for any large batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from . import audit, transforms
from .schema import LANDING

log = logging.getLogger("leaseboard.pipeline")

MAX_ROWS = 100_000  # rows in a batch's files (their footers) at most to be read on the driver
SHUFFLE_PARTITIONS = 1  # of the session such a batch runs in (``PipelineJob._small_session``)


def read(
    spark: SparkSession,
    files: Sequence[str] | None,
    skip: Collection[str],
    located: Callable[[Path], Path],
    max_rows: int = MAX_ROWS,
) -> DataFrame | None:
    """The rows of ``files`` (URIs) but those in ``skip`` (local paths), in ``transforms.USED``
    columns and the stream's types; None if the batch is too big, not all local, or a file fails."""
    if not files:
        return None
    paths = [audit.local_path(uri) for uri in files]
    if any(path is None for path in paths):
        return None  # not on this machine's file system: Spark's reader knows the scheme
    wanted = [located(path) for path in paths if path is not None and str(path) not in skip]
    if audit.rows(wanted) > max_rows:
        return None
    try:
        tables = [pq.ParquetFile(path).read(columns=transforms.USED) for path in wanted]
    except (OSError, pa.ArrowException) as exc:
        log.info("reading the batch's files on the driver failed (%s): Spark reads them", exc)
        return None
    if not tables:
        return None
    frame = spark.createDataFrame(pa.concat_tables(tables))
    types = {field.name: field.dataType for field in LANDING}
    return frame.select(*[F.col(name).cast(types[name]).alias(name) for name in transforms.USED])
