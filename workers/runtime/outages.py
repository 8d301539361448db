"""What one worker logs once per outage (not once per try, nor once per pump): its cycles failing,
the store unreachable at its start, its renewal steps failing, its pumps' checkpoints refused by a
store that is down, and its pumps pausing."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from balancer.protocol import Balancer
from workers.runtime.checkpoints import CheckpointOutage, PauseLog
from workers.runtime.sink import OutageLog

log = logging.getLogger("leaseboard.worker")


@dataclass(frozen=True, slots=True)
class WorkerLogs:
    cycle: OutageLog  # the load-balancing cycle fails (the worker held leases before)
    start: OutageLog  # the first cycle fails: the store may not be up yet
    renewal: OutageLog  # a renewal step fails
    checkpoints: CheckpointOutage  # shared by the worker's pumps
    pauses: PauseLog  # likewise

    @classmethod
    def of(cls, coordinator: Balancer, interval: float, backoff_max: float) -> WorkerLogs:
        """The logs of the worker of ``coordinator``, cycling every ``interval`` (at first backing off up
        to ``backoff_max`` while the store does not answer)."""
        owner_id = coordinator.owner_id
        return cls(
            cycle=OutageLog(
                log,
                f"worker {owner_id}: load-balancing cycle",
                f"retrying every {interval:g}s; pumps keep running while their leases last, then pause until renewed",
            ),
            start=OutageLog(
                log,
                f"worker {owner_id}: first load-balancing cycle",
                f"the store may not be up yet: retrying with backoff ({interval:g}s, doubling, at most "
                f"{backoff_max:g}s)",
            ),
            renewal=OutageLog(
                log,
                f"worker {owner_id}: lease renewal",
                "trying again shortly while the leases last, and at every cycle",
            ),
            checkpoints=CheckpointOutage(owner_id),
            pauses=PauseLog(owner_id, coordinator.monotonic),
        )
