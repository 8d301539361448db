"""What the network-partition suite checks beyond the chaos suite's invariants.

``recovery``: after every heal, every partition is owned by a worker that runs, and the counts are
balanced, within the expiry plus two intervals (the bound a healed worker needs: its leases, if any
survived, are renewed at its next cycle; if they lapsed, a rejoining worker is a member at its first
heartbeat and gets its share by handoff within an interval more). Judged on the observer's samples
of the store (every 50 ms), so the figure it reports is good to a sample. A worker cut from the
hub alone is reported, not judged (``REPORTED_ONLY``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.chaos.evidence import Evidence, OwnershipSample
from tests.netsplit.cluster import NetFleet

SAMPLE_SLACK = 0.2  # seconds: the sampling period and a store round trip
# A worker cut from the hub alone gets its share back once the Event Hubs client has reconnected,
# after the SDK's own retry backoff (not the balancer's doing): reported, not held to the bound.
REPORTED_ONLY = frozenset({"cut-hub"})


@dataclass(frozen=True, slots=True)
class Recovery:
    kind: str
    seconds: float | None  # from the heal until balanced; None: never within the run


def _running_at(fleet: NetFleet, at: float) -> set[str]:
    return {w.owner for w in fleet.workers.values() if w.started <= at and (w.ended is None or w.ended > at)}


def _balanced(sample: OwnershipSample, live: set[str], expiry: float) -> bool:
    owners = {
        pid: lease.owner for pid, lease in sample.leases.items()
        if lease.owner and lease.last_modified is not None and abs(sample.now - lease.last_modified) <= expiry
    }  # fmt: skip
    if set(owners) != set(sample.partitions) or not set(owners.values()) <= live or not live:
        return False
    counts = [list(owners.values()).count(o) for o in live]
    return max(counts) - min(counts) <= 1


def recovery(fleet: NetFleet, evidence: Evidence, kinds: set[str]) -> list[Recovery]:
    """For every fault of ``kinds``, how long from its heal until ownership was balanced again."""
    found = []
    for fault in evidence.faults:
        if fault.kind not in kinds:
            continue
        seconds = None
        for sample in evidence.ownership_samples:
            if sample.at >= fault.ended and _balanced(sample, _running_at(fleet, sample.at), evidence.expiry):
                seconds = sample.at - fault.ended
                break
        found.append(Recovery(fault.kind, seconds))
    return found


def recovery_problems(fleet: NetFleet, found: list[Recovery]) -> list[str]:
    bound = fleet.expiry + 2 * fleet.interval + SAMPLE_SLACK
    return [
        f"{r.kind}: ownership balanced {'never' if r.seconds is None else f'{r.seconds:.1f}s'} after the heal "
        f"(bound: expiry + 2 intervals = {bound:.1f}s)"
        for r in found
        if r.kind not in REPORTED_ONLY and (r.seconds is None or r.seconds > bound)
    ]
