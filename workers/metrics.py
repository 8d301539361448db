"""Prometheus metrics of a worker process (``runworkers``, or ``serve`` with embedded workers).

All on the default registry, so the dashboard's ``/metrics`` shows them when workers run inside
the serving process; a standalone ``runworkers`` process can expose them with
``prometheus_client.start_http_server``. Labels are bounded: kinds and operations are fixed sets,
never partition ids, owner ids or event data. ``leaseboard_partitions_owned`` and
``leaseboard_checkpoint_lag_events`` belong to the dashboard (computed from the store) and are not
defined here.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

# prometheus_client appends "_total" to counter names itself.
OWNERSHIP_CHANGES = Counter(
    "leaseboard_ownership_changes",
    "Ownership changes this process's workers made or noticed, by kind (claim, expire, steal, release, lost).",
    ["kind"],
)
CYCLE_DURATION = Histogram(
    "leaseboard_cycle_duration_seconds",
    "Duration of one load-balancing cycle (list, plan, claim and renew).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
EVENTS_PROCESSED = Counter(
    "leaseboard_events_processed",
    "Events handed to the handler and done with (handled, or set aside to the dead-letter file).",
)
HANDLER_ERRORS = Counter(
    "leaseboard_handler_errors",
    "Handler calls that raised (every failed attempt, retries included).",
)
DEAD_LETTERS = Counter(
    "leaseboard_dead_letters",
    "Events set aside to the dead-letter file after their retries were used up or their body was malformed.",
)
SEQUENCE_GAPS = Counter(
    "leaseboard_sequence_gaps",
    "Times a partition's sequence numbers jumped (events missing between two reads: lost data).",
)
CHECKPOINTS = Counter(
    "leaseboard_checkpoints",
    "Checkpoints written to the checkpoint store.",
)
STORE_ERRORS = Counter(
    "leaseboard_store_errors",
    "Store calls that failed, by operation (cycle, release, list_checkpoints, update_checkpoint).",
    ["operation"],
)
BROADCAST_ERRORS = Counter(
    "leaseboard_broadcast_errors",
    "Balancer events that could not be handed to the dashboard (event log or channel layer).",
)

# Landing (workers.landing): the Spark pipeline's input.
LANDED_EVENTS = Counter(
    "leaseboard_landed_events",
    "Events written to landing Parquet files (an event landed again after a crash counts again).",
)
LANDING_FILES = Counter(
    "leaseboard_landing_files",
    "Landing Parquet files written (one per handler call with at least one well-formed event).",
)
LANDING_WRITE = Histogram(
    "leaseboard_landing_write_seconds",
    "Time to write one landing file durably (Parquet, fsync, rename, fsync of the folder).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
