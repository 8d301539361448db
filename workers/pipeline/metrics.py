"""Prometheus metrics of the pipeline process (``runpipeline --metrics-port``).

The dashboard's ``/metrics`` shows the same figures from the database (``dashboard.pipeline``),
whichever process ran the job.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

BATCHES = Counter("leaseboard_pipeline_batches", "Micro-batches the pipeline committed.")
EVENTS = Counter("leaseboard_pipeline_events", "Distinct events aggregated (each (partition, sequence number) once).")
ALERTS = Counter("leaseboard_pipeline_alerts", "Alerts raised (glass break, smoke, opened while armed).")
UNREADABLE_FILES = Counter(
    "leaseboard_pipeline_unreadable_files", "Landing files that could not be read and were skipped for good."
)
BATCH_DURATION = Histogram(
    "leaseboard_pipeline_batch_duration_seconds",
    "Duration of one micro-batch trigger (listing, reading, dedupe, writing results).",
    buckets=(0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)
