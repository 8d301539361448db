"""Every hub and consumer group of the configured namespace, a row each (``read_groups``).

One read of the store for all of them (``everything.read_everything``), the event source once per
hub (partitions and the newest sequence numbers: events behind), and the lag statuses of each
group's running monitor, else of its newest stored sampling round (one query of the database per
``state.FIGURES_CHUNK`` groups). Each row is the summary of the state its fleet page shows
(``console.assemble``, ``ConsoleState.with_figures``), so the two pages agree; desired workers come
from this process's history of the group, which every look at it adds to (``capacity.record``).
A group no monitor ever sampled has no lag status (null) until its fleet page is opened.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from django.conf import settings

from balancer.model import HubRef
from workers.sources.base import PartitionProperties
from workers.wiring import Stores, hub_ref

from ...dbthread import DatabaseThread
from ..console import ConsoleState, Figures, Json, Lease, SourceStatus, Summary, assemble
from ..health import DATABASE_ERRORS, report
from ..host import FIGURES_MAX_AGE, host
from ..lag import Status
from ..state import configured_stores, lag_rules, read_source, store_call, store_read, stored_figures_of
from .everything import Everything, Records, read_everything

# From the least to the most worrying, as the alert rules rank them (deploy/alerts.yml): a rewind
# is informational, a growing lag and a stall are warnings, a stop is critical.
SEVERITY: tuple[Status, ...] = (Status.OK, Status.REWIND, Status.WARN, Status.STALL, Status.STOP)

Source = tuple[str, list[str] | None, dict[str, PartitionProperties], str | None]


def worst(counts: Mapping[Status, int]) -> Status | None:
    """The most worrying status any partition has (``SEVERITY``); None when none has one."""
    found = [status for status in SEVERITY if counts.get(status)]
    return found[-1] if found else None


@dataclass(frozen=True, slots=True)
class GroupRow:
    """One hub and consumer group as its fleet page's header sums it up."""

    ref: HubRef
    summary: Summary
    source: SourceStatus
    sampled_at: float | None  # the sampling round the lag statuses come from (store clock)

    @classmethod
    def of(cls, state: ConsoleState) -> GroupRow:
        return cls(state.ref, state.summary, state.source, state.sampled_at)

    @property
    def lag_status(self) -> Status | None:
        return worst(self.summary.by_lag_status)

    def as_json(self) -> Json:
        summary, capacity = self.summary, self.summary.capacity
        status = self.lag_status
        return {
            "hub": self.ref.hub,
            "consumer_group": self.ref.consumer_group,
            "partitions": summary.partitions,
            "owned": summary.by_status[Lease.OWNED],
            "workers": summary.workers,
            "workers_alive": summary.workers_alive,
            "workers_draining": summary.workers_draining,
            "lag": summary.lag,
            "lag_status": status.value if status is not None else None,
            "by_lag_status": {k.value: v for k, v in summary.by_lag_status.items()},
            "desired_workers": capacity.desired_workers if capacity is not None else None,
            "desired_reason": capacity.reason if capacity is not None else None,
            "sampled_at": self.sampled_at,
            "source": self.source.as_json(),
        }


@dataclass(frozen=True, slots=True)
class Groups:
    """Every group of ``namespace`` read at the store's clock ``generated_at``, for ``store_requests``."""

    namespace: str
    store: str
    generated_at: float
    store_requests: int
    rows: tuple[GroupRow, ...]

    def as_json(self) -> Json:
        return {
            "namespace": self.namespace,
            "store": self.store,
            "generated_at": self.generated_at,
            "store_requests": self.store_requests,
            "groups": [row.as_json() for row in self.rows],
        }


def _read_sources(hubs: Iterable[str]) -> dict[str, Source]:
    return {hub: read_source(hub) for hub in sorted(set(hubs))}


async def _figures(refs: list[HubRef], db: DatabaseThread) -> dict[HubRef, Figures]:
    """Each group's running monitor's figures, else its newest stored round's (one database call;
    none while the database does not answer)."""
    found: dict[HubRef, Figures] = {}
    for ref in refs:
        watched = host.running(ref)
        figures = watched.fresh_figures(FIGURES_MAX_AGE) if watched is not None else None
        if figures is not None:
            found[ref] = figures
    rest = [ref for ref in refs if ref not in found]
    try:
        stored = await db.acall(stored_figures_of, rest)
    except DATABASE_ERRORS as exc:  # the store answered, the database did not: no statuses, as /api/state
        report(exc)
        stored = {ref: Figures(lag_rules()) for ref in rest}
    return {**found, **stored}


def _state(ref: HubRef, records: Records, now: float, source: Source) -> ConsoleState:
    name, ids, properties, error = source
    return assemble(
        ref,
        now=now,
        expiry=settings.LEASEBOARD_EXPIRY,
        ownership=records.ownership,
        checkpoints=records.checkpoints,
        members=records.members,
        controls=records.controls,
        partition_ids=ids,
        properties=properties,
        source_name=name,
        source_error=error,
        last_event_id=0,
    )


async def read_groups(db: DatabaseThread, stores: Stores | None = None) -> Groups:
    """Every group of the configured namespace in the configured (or given) stores, figures read on
    ``db``. Raises the store's error when it cannot be read (reported to ``health``); an event source
    that cannot be read leaves nulls and says why in each row's ``source``."""
    namespace = settings.LEASEBOARD_NAMESPACE
    used = stores or configured_stores()
    candidates = [hub_ref(), *host.watching()]  # what a store without a namespace reader is asked about

    async def everything() -> Everything:
        return await store_call(lambda: read_everything(used, namespace, candidates))

    read = await store_read(everything)
    groups = read.groups()
    sources = await asyncio.to_thread(_read_sources, [ref.hub for ref in groups])
    figures = await _figures(list(groups), db)
    rows = (
        GroupRow.of(_state(ref, records, read.now, sources[ref.hub]).with_figures(figures[ref]))
        for ref, records in groups.items()
    )
    return Groups(namespace, settings.LEASEBOARD_STORE, read.now, read.requests, tuple(rows))
