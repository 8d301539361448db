"""The dashboard's ``/metrics``: series computed from the store at scrape time, plus this host's worker metrics.

Per-worker and per-partition series come from one ``ConsoleState`` per scrape (the monitor's
latest, at most a few seconds old) through a throw-away collector, so a worker or partition that is
gone has no series at the next scrape: there are no stale labels to remove. Whatever worker
processes registered (``workers/metrics.py``: ownership changes, cycle duration, store requests,
...) is written first: this process's default registry, or in multi-process mode the sum over
every process of the host. The dashboard's own counters (handoff duration, admin actions) are
ordinary prometheus_client objects and reach the output the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from balancer.model import HubRef
from workers.metrics import exposition_registry

from .console import ConsoleState

HANDOFF_DURATION = Histogram(
    "leaseboard_handoff_duration_seconds",
    "Time from a planned release of a partition (handed off) to the next owner's claim, from the event log.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0),
)
ADMIN_ACTIONS = Counter(
    "leaseboard_admin_actions",
    "Operator actions applied, refused or failed, by action (from the page or a management command).",
    ["action", "outcome"],
)
REFUSED_ATTEMPTS = Counter(
    "leaseboard_refused_attempts",
    "Attempts refused before an operator's action: wrong passwords (login), refusals of a locked-out "
    "login (lockout), actions without a staff login (action) or without the CSRF token (csrf).",
    ["kind"],
)


class ConsoleLoad(Collector):
    """What visitors make this console process do: hubs watched, sockets served, asyncio tasks on
    the serving loop and the monitors' loop (bounded by ``LEASEBOARD_MONITORS_MAX`` and
    ``LEASEBOARD_SOCKETS_MAX``; see ``host.py``)."""

    def __init__(self, monitors: int, sockets: int, tasks: int) -> None:
        self.figures = {"monitors": monitors, "sockets": sockets, "tasks": tasks}

    def collect(self) -> Iterator[Metric]:
        helps = {
            "monitors": "Hubs and consumer groups this console process watches (one monitor each).",
            "sockets": "Websockets this console process streams to.",
            "tasks": "asyncio tasks on this console process's serving loop and monitors' loop.",
        }
        for name, value in self.figures.items():
            yield GaugeMetricFamily(f"leaseboard_console_{name}", helps[name], value=value)


class StateCollector(Collector):
    """Yields the ``leaseboard_…`` series of one console state (or only ``leaseboard_store_up 0`` without one)."""

    def __init__(
        self, ref: HubRef, state: ConsoleState | None, logged: Mapping[str, int], database_up: bool | None = None
    ) -> None:
        self.ref = ref
        self.state = state
        self.logged = logged
        self.database_up = database_up

    def collect(self) -> Iterator[Metric]:
        yield InfoMetricFamily(
            "leaseboard_dashboard",
            "The hub and consumer group this dashboard reports on.",
            value={"namespace": self.ref.namespace, "hub": self.ref.hub, "consumer_group": self.ref.consumer_group},
        )
        yield GaugeMetricFamily(
            "leaseboard_store_up",
            "1 when the ownership store could be read at this scrape, else 0.",
            value=1 if self.state is not None else 0,
        )
        if self.database_up is not None:
            yield GaugeMetricFamily(
                "leaseboard_database_up",
                "1 when the dashboard's database (event log, lag samples, audit) answered at this scrape, else 0.",
                value=1 if self.database_up else 0,
            )
        logged = CounterMetricFamily(
            "leaseboard_balancer_events_logged",
            "Balancer events in the dashboard's event log for this hub, by kind, from every worker process.",
            labels=["kind"],
        )
        for kind, count in sorted(self.logged.items()):
            logged.add_metric([kind], count)
        yield logged
        if self.state is not None:
            yield from self._partitions(self.state)
            yield from self._workers(self.state)
            yield from self._capacity(self.state)

    def _partitions(self, state: ConsoleState) -> Iterator[Metric]:
        summary = state.summary
        yield GaugeMetricFamily(
            "leaseboard_event_source_up",
            "1 when the event source answered for every partition at this scrape, else 0.",
            value=1 if state.source.available else 0,
        )
        by_status = GaugeMetricFamily(
            "leaseboard_partitions", "Partitions of the hub by ownership status.", labels=["status"]
        )
        for lease, count in summary.by_status.items():
            by_status.add_metric([lease.value], count)
        yield by_status

        lag = GaugeMetricFamily(
            "leaseboard_checkpoint_lag_events",
            "Events enqueued in a partition after its checkpoint (last enqueued minus checkpointed sequence number).",
            labels=["partition"],
        )
        lag_seconds = GaugeMetricFamily(
            "leaseboard_checkpoint_lag_seconds",
            "Enqueued time of a partition's newest event minus that of its checkpointed event (0 without lag).",
            labels=["partition"],
        )
        checkpoint = GaugeMetricFamily(
            "leaseboard_checkpoint_sequence_number", "Checkpointed sequence number per partition.", labels=["partition"]
        )
        # One series per partition, labelled with its current status (a change of status ends one series
        # and starts another): 1024 samples where a 0/1 series per status would be 5120, at ~10 µs each.
        status = GaugeMetricFamily(
            "leaseboard_partition_status",
            "Always 1, labelled with the partition's current lag status (OK, WARN, STALL, STOP, REWIND; README).",
            labels=["partition", "status"],
        )
        counts = GaugeMetricFamily(
            "leaseboard_partitions_by_lag_status", "Partitions per lag status.", labels=["status"]
        )
        for p in state.partitions:
            if p.lag is not None:
                lag.add_metric([p.id], p.lag)
            if p.lag_seconds is not None:
                lag_seconds.add_metric([p.id], p.lag_seconds)
            if p.sequence_number is not None:
                checkpoint.add_metric([p.id], p.sequence_number)
            if p.lag_status is not None:
                status.add_metric([p.id, p.lag_status.value], 1)
        for lag_status, count in summary.by_lag_status.items():
            counts.add_metric([lag_status.value], count)
        yield from (lag, lag_seconds, checkpoint, status, counts)

    def _workers(self, state: ConsoleState) -> Iterator[Metric]:
        owned = GaugeMetricFamily(
            "leaseboard_partitions_owned", "Partitions a worker holds an unexpired lease on.", labels=["worker"]
        )
        up = GaugeMetricFamily(
            "leaseboard_worker_up",
            "1 when the worker's last heartbeat is within the lease expiry, 0 for a worker that stopped sending them.",
            labels=["worker"],
        )
        draining = GaugeMetricFamily(
            "leaseboard_worker_draining", "1 when the worker is being drained.", labels=["worker"]
        )
        last_seen = GaugeMetricFamily(
            "leaseboard_worker_last_seen_timestamp_seconds",
            "Store time of the worker's last heartbeat, seconds since the epoch.",
            labels=["worker"],
        )
        rate = GaugeMetricFamily(
            "leaseboard_worker_checkpointed_events_per_second",
            "Checkpointed events per second over the last 10 s, summed over the partitions the worker owns.",
            labels=["worker"],
        )
        for w in state.workers:
            owned.add_metric([w.id], w.owned)
            up.add_metric([w.id], 1 if w.alive else 0)
            draining.add_metric([w.id], 1 if w.draining else 0)
            if w.last_seen is not None:
                last_seen.add_metric([w.id], w.last_seen)
            if w.events_per_second is not None:
                rate.add_metric([w.id], w.events_per_second)
        yield from (owned, up, draining, last_seen, rate)

    def _capacity(self, state: ConsoleState) -> Iterator[Metric]:
        found = state.capacity
        if found is None:
            return
        yield GaugeMetricFamily(
            "leaseboard_desired_workers",
            "Workers the group needs to keep up with the enqueue rate and drain the backlog within the target "
            "catch-up time: ceil((enqueue rate + backlog / target) / per-worker rate), between 1 and the partitions.",
            value=found.desired_workers,
        )
        yield GaugeMetricFamily(
            "leaseboard_target_catchup_seconds",
            "The time desired workers allow to drain the backlog (LEASEBOARD_TARGET_CATCHUP_SECONDS).",
            value=found.target_catchup_seconds,
        )
        yield GaugeMetricFamily(
            "leaseboard_processing_workers", "Workers that own at least one partition now.", value=found.workers
        )
        if found.backlog is not None:
            yield GaugeMetricFamily(
                "leaseboard_backlog_events",
                "Events enqueued after the checkpoints, all partitions.",
                value=found.backlog,
            )
        if found.keda_desired_workers is not None:
            yield GaugeMetricFamily(
                "leaseboard_keda_desired_workers",
                "What KEDA's Event Hubs scaler would ask for, from the lag only: ceil(backlog / 64), at most the "
                "partitions (0 without lag).",
                value=found.keda_desired_workers,
            )
        rates = (
            (
                "leaseboard_enqueue_rate_events_per_second",
                "Events enqueued per second, all partitions, over the last minute.",
                found.enqueue_rate,
            ),
            (
                "leaseboard_processing_rate_events_per_second",
                "Events checkpointed per second, all partitions, over the last minute.",
                found.processing_rate,
            ),
            (
                "leaseboard_processing_rate_per_worker_events_per_second",
                "The per-worker rate desired workers divides "
                "by: measured while the fleet was behind, else a lower bound.",
                found.per_worker_rate,
            ),
        )
        for name, helptext, value in rates:
            if value is not None:
                yield GaugeMetricFamily(name, helptext, value=value)


def render(
    ref: HubRef,
    state: ConsoleState | None,
    logged: Mapping[str, int],
    extra: Iterable[Collector] = (),
    database_up: bool | None = None,
) -> bytes:
    """The exposition text: the workers' and dashboard's registered series, then those of ``state``
    and of each ``extra`` collector (e.g. the pipeline's)."""
    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(StateCollector(ref, state, logged, database_up))
    for collector in extra:
        scrape.register(collector)
    return generate_latest(exposition_registry()) + generate_latest(scrape)
