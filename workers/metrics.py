"""Prometheus metrics of a worker process (``runworkers``, or ``serve`` with embedded workers).

Names are ``leaseboard_…`` in base units, counters end in ``_total`` (prometheus_client appends it),
durations in ``_seconds``. Labels are bounded: kinds, reasons, operations and outcomes are fixed
sets, never partition ids, owner ids or event data, so nothing here has to be removed when a worker
or a lease goes. The per-worker and per-partition series (partitions owned, worker up, lag, status)
belong to the dashboard, which computes them from the store at every scrape (``dashboard/metrics.py``),
so a worker that is gone simply has none.

Multi-process mode: with ``PROMETHEUS_MULTIPROC_DIR`` set (before this module is imported; an
empty directory per deployment, shared by every process on the host), each process writes its
values to files there and ``exposition_registry()`` adds up the files of every process, so any
one ``runworkers --metrics-port`` (or the dashboard's ``/metrics``) reports all the processes of
the host. Counters and histograms are summed, and so is the one gauge (``leaseboard_paused_partitions``)
over the live processes. Without the variable the default registry is used.

The store calls' families (``leaseboard_store_requests_total``, ``..._store_request_duration_seconds``)
and the wrapper that counts them are in ``workers/store_metrics.py``; importing this module registers them.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from balancer.model import BalancerEvent, EventKind
from workers import store_metrics  # noqa: F401  (registers the store calls' families: every /metrics has them)

MULTIPROCESS_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")

# prometheus_client appends "_total" to counter names itself.
OWNERSHIP_CHANGES = Counter(
    "leaseboard_ownership_changes",
    "Ownership changes this process's workers made or noticed, by kind (claim, expire, steal, release, lost).",
    ["kind"],
)
OWNERSHIP_CHANGE_REASONS = Counter(
    "leaseboard_ownership_changes_by_reason",
    "Ownership changes this process's workers made or noticed, by kind and reason (a fixed set: see REASONS in "
    "workers/metrics.py).",
    ["kind", "reason"],
)
STEALS = Counter(
    "leaseboard_steals",
    "Partitions this process's workers took from a live owner (over its share, or a handoff that timed out).",
)
LEASE_EXPIRATIONS = Counter(
    "leaseboard_lease_expirations",
    "Partitions this process's workers took because the owner's lease had expired (a crashed or stuck worker).",
)
LOST_LEASES = Counter(
    "leaseboard_lost_leases",
    "Leases this process's workers found in another worker's hands, or could not renew.",
)
OWNERSHIP_ROWS_READ = Counter(
    "leaseboard_ownership_rows_read",
    "Ownership records this process's workers read from the store in their cycles (on a store with a change "
    "feed, what changed since each worker's last read; else every record, every cycle).",
)
STEADY_CYCLES = Counter(
    "leaseboard_steady_cycles",
    "Cycles of this process's workers that skipped their plan: nothing they read had changed since an "
    "empty plan with every partition held (the default strategy on PostgreSQL, Redis and the memory store).",
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
STUCK_HEALS = Counter(
    "leaseboard_stuck_heals",
    "Steps taken on a stuck partition, by cause and step: a handler call over LEASEBOARD_HANDLER_TIMEOUT "
    "(cause handler) has its thread abandoned and the partition restarted from its checkpoint (step "
    "restart), and released for another worker if the restarted call sticks on the same event (step release); "
    "a worker past LEASEBOARD_HANDLER_ABANDON_MAX abandoned threads stops (step stop); a "
    "partition whose reader failed (cause reader) is restarted at the next cycle (step restart), and "
    "released for another worker after LEASEBOARD_READER_STUCK (step release), or, every reader of a worker "
    "failing, all of them handed over (step hand_over); a worker the hub has not answered for "
    "LEASEBOARD_READER_STUCK while its readers had nothing (cause hub) hands all of them over until it "
    "answers (step hand_over).",
    ["cause", "step"],
)
for _cause, _step in (
    ("handler", "restart"),
    ("handler", "release"),
    ("handler", "stop"),
    ("reader", "restart"),
    ("reader", "release"),
    ("reader", "hand_over"),
    ("hub", "hand_over"),
):
    STUCK_HEALS.labels(_cause, _step)  # exposed at 0 from the start: the alert's increase() needs the series
DEAD_LETTERS = Counter(
    "leaseboard_dead_letters",
    "Events set aside to the dead-letter file after their retries were used up or their body was malformed.",
)
DEAD_LETTERS_IN_PLACE = Counter(
    "leaseboard_dead_letters_replayed_in_place",
    "Dead letters an operator replayed in place, handed to the owner's handler again: handled or failed.",
    ["outcome"],
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
# livesum: in multi-process mode the sum over the live processes of the host (a finished process's
# pumps are paused no more).
PARTITION_STUCK = Gauge(
    "leaseboard_partition_stuck",
    "1 while a partition held by this process's workers is stuck, by cause: its reader has failed, or hung while "
    "events wait (LEASEBOARD_READER_WEDGED), and not read since (cause reader; restarted at every cycle, released "
    "for another worker after LEASEBOARD_READER_STUCK); a handler call on it ran past LEASEBOARD_HANDLER_TIMEOUT "
    "and was abandoned, until a pump of it handles that event or it is released (cause handler); the hub has not "
    "answered its worker for LEASEBOARD_READER_STUCK, which hands it over, until the hub answers (cause hub).",
    ["partition", "cause"],
    multiprocess_mode="livesum",
)
PAUSED_PARTITIONS = Gauge(
    "leaseboard_paused_partitions",
    "Partitions whose pump is paused: its lease may have run out (no successful cycle for the expiry), so it "
    "handles nothing and keeps its position until the lease is renewed or lost.",
    multiprocess_mode="livesum",
)
BROADCAST_ERRORS = Counter(
    "leaseboard_broadcast_errors",
    "Failed attempts to hand a balancer event to the dashboard's event log (each event is kept and tried again).",
)
BROADCAST_BACKLOG = Gauge(
    "leaseboard_broadcast_backlog",
    "Balancer events waiting to be handed to the dashboard's event log (they pile up while it is unreachable).",
    multiprocess_mode="livesum",
)
BROADCAST_DROPPED = Counter(
    "leaseboard_broadcast_dropped",
    "Balancer events dropped without reaching the dashboard: more waited than the sink keeps.",
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
LANDING_ABANDONED = Counter(
    "leaseboard_landing_abandoned",
    "Landing files not written because the lease may have run out while the batch was in hand "
    "(kept by the pump and landed after a renewal, or by the next owner).",
)
LANDING_WRITE = Histogram(
    "leaseboard_landing_write_seconds",
    "Time to write one landing file durably (Parquet, fsync, rename, fsync of the folder).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)

# --- ownership changes by reason -----------------------------------------------------------------

# The reason of an event, reduced to a fixed set: (kind, prefix of the coordinator's reason) -> label.
# A planned handoff is not told by its reason: a release with ``handoff`` set is labelled HANDOFF.
REASONS: dict[str, tuple[tuple[str, str], ...]] = {
    EventKind.CLAIM: (("never owned", "never_owned"), ("released", "released")),
    EventKind.EXPIRE: (("lease of", "lease_expired"), ("corrupt record", "corrupt_record")),
    EventKind.STEAL: (("", "over_share"),),  # refined below: a handoff that timed out
    EventKind.RELEASE: (("shutting down", "shutdown"),),
    EventKind.LOST: (("now held by", "taken"), ("renewal refused", "renewal_refused"), ("taken", "taken")),
    EventKind.DRAIN: (("", "operator"),),
    EventKind.PIN: (("", "operator"),),
}
OTHER = "other"
HANDOFF = "handoff"


def reason_label(event: BalancerEvent) -> str:
    """The bounded ``reason`` label of ``event`` (``other`` for a reason no rule names)."""
    if event.kind is EventKind.STEAL and "did not hand over" in event.reason:
        return "handoff_timeout"
    if event.kind is EventKind.RELEASE and event.handoff:
        return HANDOFF
    for prefix, label in REASONS.get(event.kind, ()):
        if event.reason.startswith(prefix):
            return label
    return OTHER


def observe_event(event: BalancerEvent) -> None:
    """Count one balancer event (the worker's ``EventSink`` calls this for every event)."""
    OWNERSHIP_CHANGES.labels(kind=event.kind.value).inc()
    OWNERSHIP_CHANGE_REASONS.labels(kind=event.kind.value, reason=reason_label(event)).inc()
    if event.kind is EventKind.STEAL:
        STEALS.inc()
    elif event.kind is EventKind.EXPIRE:
        LEASE_EXPIRATIONS.inc()
    elif event.kind is EventKind.LOST:
        LOST_LEASES.inc()


# --- exposition ----------------------------------------------------------------------------------


def _initialise(counter: Counter, labels: Sequence[tuple[str, ...]]) -> None:
    """Create the series at 0, so a rate() over them works before the first event (and multi-process
    mode, which only reports series that were written, reports them)."""
    for values in labels:
        counter.labels(*values)


_initialise(
    OWNERSHIP_CHANGES,
    [(str(k),) for k in (EventKind.CLAIM, EventKind.EXPIRE, EventKind.STEAL, EventKind.RELEASE, EventKind.LOST)],
)
_initialise(
    OWNERSHIP_CHANGE_REASONS,
    [(k, r) for k, pairs in REASONS.items() for _, r in pairs] + [(EventKind.RELEASE, HANDOFF)],
)
_initialise(DEAD_LETTERS_IN_PLACE, [("handled",), ("failed",)])
_initialise(STORE_ERRORS, [(op,) for op in ("cycle", "release", "list_checkpoints", "update_checkpoint")])


def exposition_registry() -> CollectorRegistry:
    """What a ``/metrics`` of this process should render: the sum over every process of the host in
    multi-process mode, else this process's default registry."""
    if not MULTIPROCESS_DIR:
        return REGISTRY
    from prometheus_client import multiprocess

    registry = CollectorRegistry(auto_describe=False)
    multiprocess.MultiProcessCollector(registry, path=MULTIPROCESS_DIR)  # type: ignore[no-untyped-call]
    return registry


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Serve ``exposition_registry()`` over HTTP on ``addr:port`` from a daemon thread."""
    from prometheus_client import start_http_server

    start_http_server(port, addr=addr, registry=exposition_registry())


if MULTIPROCESS_DIR:

    @atexit.register
    def _mark_dead() -> None:
        # Live gauges of a finished process must not count; counters and histograms keep their totals.
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid(), MULTIPROCESS_DIR)  # type: ignore[no-untyped-call]


# Alerts, by the path that raised them first (``workers.pipeline.alerts``): "landing", the worker
# process as the event's file lands, or "pipeline", the Spark job (a worker process and the
# pipeline's each count their own).
ALERTS_RAISED = Counter("leaseboard_alerts_raised", "Alerts raised, by the path that raised them first.", ["raised_by"])
ALERT_LATENCY = Histogram(
    "leaseboard_alert_latency_seconds",
    "Seconds from an alerting event's enqueueing to its alert's commit, by the path that raised it.",
    ["raised_by"],
    buckets=(0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0),
)
LANDING_ALERTS_DROPPED = Counter(
    "leaseboard_landing_alerts_dropped",
    "Alerts the landing could not raise at once (the pipeline raises them from its batch), by reason.",
    ["reason"],
)
