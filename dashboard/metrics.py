"""The dashboard's ``/metrics``: series computed from the store at scrape time, plus the default registry.

The store-derived series come from one snapshot per scrape through a throw-away collector, so a
worker or partition that is gone simply has no series at the next scrape (no stale labels to
remove). Whatever this process's workers registered on prometheus_client's default REGISTRY
(``workers/metrics.py``: ownership changes, cycle duration, ...) is written first.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from balancer.model import HubRef

from .state import Snapshot

STATUSES = ("owned", "unowned", "expired")


class SnapshotCollector(Collector):
    """Yields the ``leaseboard_…`` series of one snapshot (or only ``leaseboard_store_up 0`` without one)."""

    def __init__(self, ref: HubRef, state: Snapshot | None, logged: Mapping[str, int]) -> None:
        self.ref = ref
        self.state = state
        self.logged = logged

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
        logged = CounterMetricFamily(
            "leaseboard_balancer_events_logged",
            "Balancer events in the dashboard's event log for this hub, by kind, from every worker process.",
            labels=["kind"],
        )
        for kind, count in sorted(self.logged.items()):
            logged.add_metric([kind], count)
        yield logged
        if self.state is not None:
            yield from self._from_snapshot(self.state)

    def _from_snapshot(self, state: Snapshot) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "leaseboard_event_source_up",
            "1 when the event source answered for every partition at this scrape, else 0.",
            value=1 if state["source"]["available"] else 0,
        )
        by_status = GaugeMetricFamily(
            "leaseboard_partitions", "Partitions of the hub by ownership status.", labels=["status"]
        )
        for status in STATUSES:
            by_status.add_metric([status], sum(1 for p in state["partitions"] if p["status"] == status))
        yield by_status

        lag = GaugeMetricFamily(
            "leaseboard_checkpoint_lag_events",
            "Events enqueued in a partition after its checkpoint (last enqueued minus checkpointed sequence number).",
            labels=["partition"],
        )
        checkpoint = GaugeMetricFamily(
            "leaseboard_checkpoint_sequence_number", "Checkpointed sequence number per partition.", labels=["partition"]
        )
        enqueued = GaugeMetricFamily(
            "leaseboard_last_enqueued_sequence_number",
            "Sequence number of the newest event in a partition (-1 while empty).",
            labels=["partition"],
        )
        for p in state["partitions"]:
            if p["lag"] is not None:
                lag.add_metric([p["id"]], p["lag"])
            if p["sequence_number"] is not None:
                checkpoint.add_metric([p["id"]], p["sequence_number"])
            if p["last_enqueued_sequence_number"] is not None:
                enqueued.add_metric([p["id"]], p["last_enqueued_sequence_number"])
        yield from (lag, checkpoint, enqueued)

        owned = GaugeMetricFamily(
            "leaseboard_partitions_owned", "Partitions a worker holds an unexpired lease on.", labels=["worker"]
        )
        alive = GaugeMetricFamily(
            "leaseboard_worker_alive",
            "1 when the worker's last heartbeat is within the lease expiry.",
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
        for w in state["workers"]:
            owned.add_metric([w["id"]], w["owned"])
            alive.add_metric([w["id"]], 1 if w["alive"] else 0)
            draining.add_metric([w["id"]], 1 if w["draining"] else 0)
            if w["last_seen"] is not None:
                last_seen.add_metric([w["id"]], w["last_seen"])
        yield from (owned, alive, draining, last_seen)


def render(ref: HubRef, state: Snapshot | None, logged: Mapping[str, int]) -> bytes:
    """The exposition text: the default registry's series, then those of ``state``."""
    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(SnapshotCollector(ref, state, logged))
    return generate_latest(REGISTRY) + generate_latest(scrape)
