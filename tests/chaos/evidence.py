"""What a fault-injection run leaves behind for the invariant checker (``invariants``).

The evidence is on one clock, the machine's monotonic clock (``CLOCK_MONOTONIC`` is shared by every
process, and a SIGSTOP or a skewed wall clock does not move it): what each worker recorded as it
handled an event (``recording``), the checkpoints and ownership records the test read from the
store while the run went on, what the producer wrote and when, the faults the test injected, and
what the console (a dashboard process on the same store) answered when polled all the while.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tests.chaos.cycles import Cycle


@dataclass(frozen=True, slots=True)
class Handling:
    """One event handed to a worker's handler (recorded before the handler returned)."""

    partition: str
    sequence: int
    owner: str
    at: float
    malformed: bool = False


@dataclass(frozen=True, slots=True)
class Fault:
    """An injected fault: who it struck, from when to when. Planned ones (SIGTERM, a worker
    joining) must move partitions without a single duplicate."""

    kind: str
    started: float
    ended: float
    victims: frozenset[str]
    planned: bool = False
    partitions: frozenset[str] = frozenset()  # the partitions it struck itself (a corrupted record's)


@dataclass(frozen=True, slots=True)
class Lease:
    owner: str
    last_modified: float | None  # the store's clock


@dataclass(frozen=True, slots=True)
class OwnershipSample:
    at: float  # local monotonic time the listing returned
    now: float  # the store's clock then
    partitions: tuple[str, ...]  # the hub's partitions then
    leases: dict[str, Lease]


@dataclass(frozen=True, slots=True)
class CheckpointSample:
    at: float  # local monotonic time the listing returned
    checkpoints: dict[str, int]


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    started: float
    ended: float


@dataclass(frozen=True, slots=True)
class Probe:
    """One request to the console: sent at ``at``, answered (or given up on) at ``done``; ``status``
    None when there was no answer (refused, timed out); ``store_up`` the value of
    ``leaseboard_store_up`` in a ``/metrics`` answer; ``detail`` what an error said."""

    path: str
    at: float
    done: float
    status: int | None
    store_up: float | None = None
    detail: str = ""


@dataclass
class Evidence:
    expiry: float
    produced: dict[str, list[tuple[float, bool]]]  # partition -> [(written at, malformed)], index = sequence
    handlings: list[Handling]
    dead_letters: set[tuple[str, int]]
    checkpoint_samples: list[CheckpointSample]
    ownership_samples: list[OwnershipSample]
    faults: list[Fault]
    phases: list[Phase]
    final_checkpoints: dict[str, int]
    slack: float = 0.5  # seconds allowed on every comparison of times taken by different processes
    workers: frozenset[str] = frozenset()  # the fleet's owner ids (empty: any owner named in a record)
    console: list[Probe] = field(default_factory=list)  # empty: the run had no console
    # Seconds of one tick of the store's clock (Blob: 1, its Last-Modified counts whole seconds; 0:
    # finer than anything measured here). A steal waits one more tick for the lease it took to run out.
    store_tick: float = 0.0
    interval: float = 0.0  # the workers' cycle interval: a record that ran out is claimed at the next cycle
    # Steals after the handoff timeout, found in the console's event log (``taken_over``): they explain
    # duplicates (rule 4) and nothing else.
    taken_over: list[Fault] = field(default_factory=list)
    # The store fences a checkpoint with a read of the ownership before its write, two requests (Blob:
    # ``balancer/stores/blob/checkpoints.py``): the previous owner's last checkpoint can land after a
    # claim, so after the new owner read where to start (rule 5).
    late_checkpoints: bool = False
    # The workers' cycles as they logged them (``tests.chaos.cycles``): a bound that waits for a cycle
    # allows the slowest run meanwhile (empty: not logged, nothing allowed).
    cycles: list[Cycle] = field(default_factory=list)


TAKEN_OVER = "handoff-timeout"
EXPIRED = "lease-expired"  # a lease its owner did not renew in time, with no fault of the run's on it
BUSY = "handed off while busy"  # workers.runtime.handoffs.BUSY: the tests read the event log as a user would


def taken_over(events: Iterable[Mapping[str, object]], offset: float, tick: float = 0.0) -> list[Fault]:
    """Each steal in the console's event log whose reason says its owner did not hand the partition over
    in time (``did not hand over within``: the cooperative strategy's handoff timeout), and each release
    its owner made while its pump was still busy (``handed off while busy``: the handoff's wait ran
    out, ``workers.runtime.handoffs.BUSY``), as an unplanned fault of that owner at the event, on the
    monotonic clock (the event's ``at``, the store's clock, minus ``offset``; ``tick``: the store clock's
    resolution, added to the end). The owner was too slow (a loaded machine, a long handler call), not
    gone: what it handled after its last checkpoint is handled again by the new owner, at least once by
    design. The new owner waits out the owner's lease first (or its release), so neither excuses an
    overlap. Likewise each ``expire`` (a lease its owner did not renew within the expiry: its store
    requests hung or failed on a starved machine, with no fault of the run's on it), as an unplanned
    fault of the owner at the event: what it handled and could not checkpoint before its lease ran
    out is handled again by the new owner (``EXPIRED``)."""
    found = []
    for event in events:
        kind, reason = event.get("kind"), str(event.get("reason") or "")
        stolen = kind == "steal" and "did not hand over within" in reason
        if not (stolen or kind == "expire" or (kind == "release" and reason.startswith(BUSY))):
            continue
        try:
            at = float(event.get("at") or 0.0)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        owner, pid = str(event.get("previous_owner") or ""), str(event.get("partition_id") or "")
        if owner and at:
            what = EXPIRED if kind == "expire" else TAKEN_OVER
            found.append(Fault(what, at - offset, at + tick - offset, frozenset({owner}), partitions=frozenset({pid})))
    return found
