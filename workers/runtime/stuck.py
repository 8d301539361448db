"""Partitions whose reader keeps failing (issue 35): the heal in steps.

A pump whose reader (or store) fails ends "failed" and is started again at the worker's next cycle:
that is the first step, the restart (``leaseboard_stuck_heals_total{cause="reader",step="restart"}``,
and a ``heal`` event the console shows: ``heal``).
``ReaderWatch`` remembers when each partition's failures in a row began, and forgets it once a pump
of that partition has read again. A partition still failing ``reader_stuck`` seconds after its first
failure is given up (``Balancer.give_up``): released with its reason ("stuck: reader failing 31 s")
and kept from this worker for ``GIVE_UP_FOR`` seconds, so another worker takes it at once and this
one does not take it back (``balancer.avoid``); step ``release``.
``HandlerStalls`` remembers, per partition, the event its last abandoned handler call had in hand: the
partition is stuck (``leaseboard_partition_stuck{cause="handler"}``) until a pump of it has handled
that event, or it is no longer held here; a restarted call that sticks on the same event again is the
second step's cue (``pumps.Pumps._stalled_again``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import workers.metrics as metrics
from balancer.protocol import Balancer
from workers.runtime.config import PumpConfig

log = logging.getLogger("leaseboard.worker")

GIVE_UP_FOR = 300.0  # seconds a worker takes no partition it gave up


@dataclass
class ReaderWatch:
    """Partition -> when (the coordinator's monotonic clock) its reader's failures in a row began."""

    since: dict[str, float] = field(default_factory=dict)

    def failed(self, partition_id: str, now: float) -> bool:
        """A pump of ``partition_id`` failed at ``now``; True if it was the first failure in a row."""
        first = partition_id not in self.since
        self.since.setdefault(partition_id, now)
        return first

    def read(self, partition_id: str) -> None:
        """A pump of ``partition_id`` read: its failures in a row are over."""
        self.since.pop(partition_id, None)

    def failing(self, partition_id: str) -> bool:
        return partition_id in self.since

    def due(self, now: float, bound: float, held: frozenset[str]) -> list[tuple[str, float]]:
        """The held partitions failing for ``bound`` seconds or more (0: never), with how long."""
        if bound <= 0:
            return []
        return sorted((p, now - t) for p, t in self.since.items() if p in held and now - t >= bound)

    def reason(self, seconds: float) -> str:
        return f"stuck: reader failing {seconds:.0f} s"

    def restarted(self, coordinator: Balancer, partition_id: str) -> None:
        """``partition_id``'s failing reader is started again: the restart step, said (``heal``)."""
        failing = coordinator.monotonic() - self.since.get(partition_id, coordinator.monotonic())
        heal(coordinator, partition_id, "reader", "restart", f"restarted: reader failing {failing:.0f} s")


@dataclass
class HandlerStalls:
    """Partition -> the sequence number its last abandoned handler call had in hand (None: not known)."""

    stalled: dict[str, int | None] = field(default_factory=dict)

    def abandoned(self, partition_id: str, sequence: int | None) -> bool:
        """A call on ``partition_id`` with ``sequence`` in hand was abandoned: stuck from now; True if
        the last call abandoned there had the same event (it sticks again)."""
        again = sequence is not None and self.stalled.get(partition_id) == sequence
        self.stalled[partition_id] = sequence
        metrics.PARTITION_STUCK.labels(partition_id, "handler").set(1)
        return again

    def moved(self, partition_id: str, handed: int | None) -> None:
        """A pump of ``partition_id`` has handled up to ``handed``: past the stuck event, no longer stuck."""
        if partition_id in self.stalled and handed is not None and handed >= (self.stalled[partition_id] or 0):
            self.over(partition_id)

    def over(self, partition_id: str) -> None:
        """No longer stuck here: moved on, released, or not held any more."""
        if partition_id in self.stalled:
            del self.stalled[partition_id]
            metrics.PARTITION_STUCK.labels(partition_id, "handler").set(0)


def heal(coordinator: Balancer, partition_id: str, cause: str, step: str, reason: str) -> None:
    """A healing step on a partition ``coordinator``'s worker holds: counted by cause and step
    (``leaseboard_stuck_heals_total``) and told to the console as a ``heal`` event with ``reason``
    (its feed, the partition page: ``Balancer.healed``)."""
    metrics.STUCK_HEALS.labels(cause, step).inc()
    coordinator.healed(partition_id, reason)


def too_many_abandoned(owner_id: str, abandoned: int, config: PumpConfig) -> str | None:
    """Why the worker must stop, once it abandoned ``config.abandon_max`` handler threads (said in the
    log and counted, step ``stop``), else None."""
    if abandoned < config.abandon_max:
        return None
    failure = (
        f"worker {owner_id}: {abandoned} handler calls stuck past LEASEBOARD_HANDLER_TIMEOUT "
        f"({config.handler_timeout:g}s) were abandoned (LEASEBOARD_HANDLER_ABANDON_MAX {config.abandon_max}); "
        "stopping, for its supervisor to restart the process"
    )
    log.error("%s", failure)
    metrics.STUCK_HEALS.labels("handler", "stop").inc()
    return failure
