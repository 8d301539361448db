"""The console's state of one hub and consumer group: typed, built in one place, one JSON shape.

``assemble`` builds a ``ConsoleState`` from what one read of the stores and the event source said;
``ConsoleState.with_figures`` adds what a single read cannot say (lag in seconds, lag status,
checkpointed rates), from the monitor or from the newest stored sampling round. Both are pure: no
Django, no clock. ``as_json`` is the ``/api/state`` shape of DESIGN.md plus the console's own keys;
``/api/state``, the websocket's snapshot and deltas, the monitor and ``/metrics`` all serve this one
state, so a field is added here once and appears everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from balancer import avoid
from balancer.model import (
    Checkpoint,
    Control,
    Controls,
    HubRef,
    Member,
    OwnershipRecord,
    alive_workers,
    pid_key,
    signs_of_life,
)
from workers.sources.base import PartitionProperties

from .capacity import Capacity, Observation, configured_target, record
from .lag import STATUSES, Status

Json = dict[str, Any]


class Lease(StrEnum):
    """Whose a partition is, as the ownership store says."""

    OWNED = "owned"
    UNOWNED = "unowned"  # never owned, or released
    EXPIRED = "expired"  # the owner stopped renewing: free for anyone to claim


@dataclass(frozen=True, slots=True)
class PartitionRow:
    id: str
    owner: str | None  # None when unowned or expired
    status: Lease
    last_modified: float | None  # the ownership record's last write (store clock)
    sequence_number: int | None  # checkpointed; None without a checkpoint
    last_enqueued_sequence_number: int | None  # None when the source could not say
    last_enqueued_time: float | None
    checkpoint_modified: float | None
    lag: int | None  # last enqueued minus checkpointed; None when the source could not say
    pinned_to: str | None
    lag_seconds: float | None = None  # with_figures
    lag_status: Status | None = None  # with_figures
    events_per_second: float | None = None  # with_figures; None: nobody measured it

    def as_json(self) -> Json:
        return {
            "id": self.id,
            "owner": self.owner,
            "last_modified": self.last_modified,
            "sequence_number": self.sequence_number,
            "last_enqueued_sequence_number": self.last_enqueued_sequence_number,
            "last_enqueued_time": self.last_enqueued_time,
            "checkpoint_modified": self.checkpoint_modified,
            "lag": self.lag,
            "pinned_to": self.pinned_to,
            "status": self.status.value,
            "lag_seconds": self.lag_seconds,
            "lag_status": self.lag_status.value if self.lag_status else None,
            "events_per_second": self.events_per_second,
        }


@dataclass(frozen=True, slots=True)
class WorkerRow:
    id: str
    owned: int  # partitions it holds an unexpired lease on
    draining: bool
    last_seen: float | None  # last sign of life (store clock): heartbeat or lease renewal; None: never announced
    alive: bool  # a sign of life within the lease expiry
    events_per_second: float | None = None  # with_figures: checkpointed, over the partitions it owns
    avoiding: tuple[str, ...] = ()  # partitions it gave up, stuck on it, and takes no more for now (balancer.avoid)

    @property
    def purgeable(self) -> bool:
        """Gone and holding nothing: its heartbeat and drain records may be removed."""
        return not self.alive and self.owned == 0

    def as_json(self) -> Json:
        return {
            "id": self.id,
            "owned": self.owned,
            "draining": self.draining,
            "last_seen": self.last_seen,
            "alive": self.alive,
            "events_per_second": self.events_per_second,
            "purgeable": self.purgeable,
            "avoiding": list(self.avoiding),
        }


@dataclass(frozen=True, slots=True)
class SourceStatus:
    name: str
    error: str | None = None  # why the event source could not say everything; None: it did

    @property
    def available(self) -> bool:
        return self.error is None

    def as_json(self) -> Json:
        return {"name": self.name, "available": self.available, "error": self.error}


@dataclass(frozen=True, slots=True)
class LagRules:
    """How statuses are judged (``lag.py``): over ``window`` samples, one every ``sample_seconds``."""

    window: int
    sample_seconds: float
    stop_seconds: float

    def as_json(self) -> Json:
        return {"window": self.window, "sample_seconds": self.sample_seconds, "stop_seconds": self.stop_seconds}


@dataclass(frozen=True, slots=True)
class Figures:
    """What a single read cannot say, by partition id: the monitor's, or a stored sampling round's."""

    rules: LagRules
    lag_seconds: Mapping[str, float | None] = field(default_factory=dict)
    statuses: Mapping[str, Status | None] = field(default_factory=dict)
    rates: Mapping[str, float] | None = None  # checkpointed events a second; None: nobody measured them
    sampled_at: float | None = None  # the sampling round the statuses come from (store clock)


@dataclass(frozen=True, slots=True)
class Summary:
    """The counts the page's header and ``/metrics`` show."""

    partitions: int
    by_status: Mapping[Lease, int]
    by_lag_status: Mapping[Status, int]
    lag: int | None  # the sum of the known lags; None when none is known
    workers: int
    workers_alive: int
    workers_draining: int = 0  # drained (by a drain record), alive or not
    capacity: Capacity | None = None  # with_figures: desired workers (capacity.py)

    def as_json(self) -> Json:
        return {
            "partitions": self.partitions,
            "owned": self.by_status[Lease.OWNED],
            "by_status": {k.value: v for k, v in self.by_status.items()},
            "by_lag_status": {k.value: v for k, v in self.by_lag_status.items()},
            "lag": self.lag,
            "workers": self.workers,
            "workers_alive": self.workers_alive,
            "workers_draining": self.workers_draining,
            "capacity": self.capacity.as_json() if self.capacity is not None else None,
        }


@dataclass(frozen=True, slots=True)
class ConsoleState:
    """One hub and consumer group as the console shows it. ``last_event_id`` is the newest event
    log id read *before* the stores: every event at or below it is reflected here."""

    ref: HubRef
    generated_at: float  # store clock
    expiry: float
    last_event_id: int
    source: SourceStatus
    partitions: tuple[PartitionRow, ...]
    workers: tuple[WorkerRow, ...]
    sampled_at: float | None = None  # with_figures
    lag_rules: LagRules | None = None  # with_figures
    version: int | None = None  # the monitor's count of the states it published; None: not the monitor's
    capacity: Capacity | None = None  # with_figures: the workers the group needs (capacity.py)

    def partition(self, partition_id: str) -> PartitionRow | None:
        return next((p for p in self.partitions if p.id == partition_id), None)

    @property
    def summary(self) -> Summary:
        by_status = dict.fromkeys(Lease, 0)
        by_lag_status = dict.fromkeys(STATUSES, 0)
        lags = [p.lag for p in self.partitions if p.lag is not None]
        for p in self.partitions:
            by_status[p.status] += 1
            if p.lag_status is not None:
                by_lag_status[p.lag_status] += 1
        return Summary(
            len(self.partitions),
            by_status,
            by_lag_status,
            sum(lags) if lags else None,
            len(self.workers),
            sum(1 for w in self.workers if w.alive),
            sum(1 for w in self.workers if w.draining),
            self.capacity,
        )

    def observation(self) -> Observation:
        """What ``capacity`` needs of this state: sequence numbers per partition, the lag, the working workers."""
        lags = [p.lag for p in self.partitions if p.lag is not None]
        enqueued = {p.id: p.last_enqueued_sequence_number for p in self.partitions}
        return Observation(
            self.generated_at,
            {pid: seq for pid, seq in enqueued.items() if seq is not None},
            {p.id: p.sequence_number if p.sequence_number is not None else -1 for p in self.partitions},
            sum(lags) if lags else None,
            len({p.owner for p in self.partitions if p.owner is not None}),
        )

    def with_figures(self, figures: Figures) -> ConsoleState:
        """This state with lag in seconds, lag status, rates and desired workers: the one place they are
        applied. Desired workers come from this process's history of the hub (``capacity.record``),
        which this state is added to: the one thing here that is not pure."""
        rates = figures.rates
        per_worker: dict[str, float] = {}
        rows = []
        for p in self.partitions:
            seconds, status = figures.lag_seconds.get(p.id), figures.statuses.get(p.id)
            if p.lag == 0:  # lag.py's rule 3 holds between samples too: no lag now is OK, unless rewound
                seconds = 0.0
                status = status if status is Status.REWIND else Status.OK
            rate = None if rates is None else rates.get(p.id, 0.0)
            if rate is not None and p.owner is not None:
                per_worker[p.owner] = per_worker.get(p.owner, 0.0) + rate
            rows.append(
                replace(
                    p,
                    lag_seconds=None if seconds is None else round(seconds, 1),
                    lag_status=status,
                    events_per_second=None if rate is None else round(rate, 1),
                )
            )
        workers = tuple(
            replace(w, events_per_second=None if rates is None else round(per_worker.get(w.id, 0.0), 1))
            for w in self.workers
        )
        needed = record(self.ref, self.observation(), len(self.partitions), configured_target())
        return replace(
            self,
            partitions=tuple(rows),
            workers=workers,
            sampled_at=figures.sampled_at,
            lag_rules=figures.rules,
            capacity=needed,
        )

    def as_json(self) -> Json:
        """DESIGN.md's ``/api/state`` object, plus the console's keys."""
        return {
            "namespace": self.ref.namespace,
            "hub": self.ref.hub,
            "consumer_group": self.ref.consumer_group,
            "generated_at": self.generated_at,
            "expiry": self.expiry,
            "last_event_id": self.last_event_id,
            "source": self.source.as_json(),
            "partitions": [p.as_json() for p in self.partitions],
            "workers": [w.as_json() for w in self.workers],
            "sampled_at": self.sampled_at,
            "lag_rules": self.lag_rules.as_json() if self.lag_rules else None,
            "version": self.version,
            "summary": self.summary.as_json(),
        }


def assemble(
    ref: HubRef,
    *,
    now: float,
    expiry: float,
    ownership: Iterable[OwnershipRecord],
    checkpoints: Iterable[Checkpoint],
    members: Iterable[Member],
    controls: Iterable[Control],
    partition_ids: Sequence[str] | None,
    properties: Mapping[str, PartitionProperties],
    source_name: str,
    source_error: str | None,
    last_event_id: int,
) -> ConsoleState:
    """The state of ``ref`` from what was read at store time ``now`` (without figures).

    ``partition_ids`` None means the source could not say; the partitions the store has records
    for are shown then. A partition without properties gets null last-enqueued and lag.
    """
    owned_by = {r.partition_id: r for r in ownership if r.ref == ref}
    checkpointed = {c.partition_id: c for c in checkpoints if c.ref == ref}
    standing = Controls.of(controls)
    ids = list(partition_ids) if partition_ids is not None else sorted(set(owned_by) | set(checkpointed), key=pid_key)

    partitions = [
        _partition_row(
            pid, owned_by.get(pid), checkpointed.get(pid), properties.get(pid), standing.pins.get(pid), now, expiry
        )
        for pid in ids
    ]
    owned_count: dict[str, int] = {}
    for row in partitions:
        if row.owner is not None:
            owned_count[row.owner] = owned_count.get(row.owner, 0) + 1

    seen = {m.owner_id: m for m in members if m.ref == ref}
    # A worker holding partitions renews them instead of heartbeating: its last sign of life is the
    # later of its heartbeat and its latest renewal.
    signs = signs_of_life(seen.values(), owned_by.values())
    alive = alive_workers(seen.values(), owned_by.values(), now, expiry)
    avoided = avoid.avoided_by(m for m in seen.values() if m.owner_id in alive)
    workers = []
    for worker_id in sorted(set(seen) | set(owned_count) | standing.drained):
        workers.append(
            WorkerRow(
                worker_id,
                owned_count.get(worker_id, 0),
                worker_id in standing.drained,
                signs.get(worker_id),
                worker_id in alive,
                avoiding=tuple(sorted(avoided.get(worker_id, ()), key=pid_key)),
            )
        )
    return ConsoleState(
        ref, now, expiry, last_event_id, SourceStatus(source_name, source_error), tuple(partitions), tuple(workers)
    )


def _partition_row(
    pid: str,
    record: OwnershipRecord | None,
    checkpoint: Checkpoint | None,
    props: PartitionProperties | None,
    pinned_to: str | None,
    now: float,
    expiry: float,
) -> PartitionRow:
    """One partition's row: its lease as of ``now`` (an owner only while the lease holds) and its lag."""
    owner: str | None = None
    if record is None or not record.owner_id:
        status = Lease.UNOWNED
    elif record.expired(now, expiry):
        status = Lease.EXPIRED
    else:
        status, owner = Lease.OWNED, record.owner_id
    last_enqueued = props.last_enqueued_sequence_number if props is not None else None
    lag = None
    if last_enqueued is not None:
        # Without a checkpoint everything retained is still to do (-1 + 1 = 0 for an empty partition).
        done = checkpoint.sequence_number if checkpoint is not None else -1
        lag = max(0, last_enqueued - done)
    return PartitionRow(
        pid,
        owner,
        status,
        record.last_modified if record is not None else None,
        checkpoint.sequence_number if checkpoint is not None else None,
        last_enqueued,
        props.last_enqueued_time if props is not None else None,
        checkpoint.last_modified if checkpoint is not None else None,
        lag,
        pinned_to,
    )
