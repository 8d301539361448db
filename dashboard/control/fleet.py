"""The fleet as the store and the source show it now: what every action checks and plans against."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

from balancer.model import (
    Checkpoint,
    Controls,
    HubRef,
    Member,
    OwnershipRecord,
    alive_workers,
    pid_key,
    signs_of_life,
)
from balancer.strategies import DEFAULT, NAMES
from workers.wiring import Stores

from ..live.state import with_source
from .request import Refused

STRATEGY_INFO = "strategy"  # the key of ``Member.info`` under which a worker's heartbeat names its strategy


@dataclass(frozen=True)
class FleetStrategy:
    """The strategy the fleet runs, and how we know: ``source`` is "workers" (their heartbeats say so),
    "settings" (``LEASEBOARD_STRATEGY``, no live worker says) or "default" (neither says)."""

    name: str
    source: str
    by_worker: dict[str, str]  # live workers -> the strategy their heartbeat names
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fleet:
    """What the store and the source say now."""

    ref: HubRef
    now: float
    expiry: float
    partition_ids: tuple[str, ...]
    records: dict[str, OwnershipRecord]
    members: dict[str, Member]
    drained: frozenset[str]
    pins: dict[str, str]
    checkpoints: dict[str, Checkpoint]

    @property
    def active(self) -> dict[str, OwnershipRecord]:
        return {p: r for p, r in self.records.items() if not r.expired(self.now, self.expiry)}

    @property
    def alive(self) -> frozenset[str]:
        return frozenset(alive_workers(self.members.values(), self.records.values(), self.now, self.expiry))

    def known_workers(self) -> set[str]:
        return set(self.members) | {r.owner_id for r in self.active.values()} | set(self.drained)

    def held_by(self, worker: str) -> list[str]:
        """The partitions ``worker`` holds an unexpired lease on, in id order."""
        return sorted((p for p, r in self.active.items() if r.owner_id == worker), key=pid_key)

    def eligible(self, drained: frozenset[str]) -> frozenset[str]:
        """The workers that may own partitions with ``drained`` in force: live or holding, not drained."""
        return (self.alive | {r.owner_id for r in self.active.values()}) - drained

    def ago(self, worker: str) -> str:
        seen = signs_of_life(self.members.values(), self.records.values()).get(worker)
        if seen is None:
            return "it has never sent a heartbeat"
        return f"its last heartbeat or lease renewal was {self.now - seen:.0f}s ago"

    def strategy(self, configured: str | None) -> FleetStrategy:
        """The strategy the live workers' heartbeats name; ``configured`` (else the default) when none does.

        When they disagree, the most common one (ties: by name), with a note saying so.
        """
        said = {w: self.members[w].info.get(STRATEGY_INFO, "") for w in sorted(self.alive)}
        unknown = sorted({s for s in said.values() if s and s not in NAMES})
        by_worker = {w: s for w, s in said.items() if s in NAMES}
        notes: list[str] = []
        if unknown:
            notes.append(f"workers run a strategy this dashboard does not know ({', '.join(unknown)})")
        if configured and configured not in NAMES:
            notes.append(f"LEASEBOARD_STRATEGY names no strategy ({configured!r}): ignored")
            configured = None
        if not by_worker:
            name, source = (configured, "settings") if configured else (DEFAULT, "default")
            if said:
                notes.append(f"no live worker names its strategy: planned with {name} ({source})")
            return FleetStrategy(name, source, by_worker, tuple(notes))
        counts = Counter(by_worker.values())
        name = min(counts, key=lambda s: (-counts[s], s))
        if len(counts) > 1:
            detail = "; ".join(f"{s}: {', '.join(w for w, t in by_worker.items() if t == s)}" for s in sorted(counts))
            notes.append(
                f"the workers disagree ({detail}): planned with {name}, the most common; "
                "a mixed fleet may end elsewhere"
            )
        return FleetStrategy(name, "workers", by_worker, tuple(notes))


async def read_fleet(ref: HubRef, stores: Stores, expiry: float) -> Fleet:
    """The fleet of ``ref`` now. Raises the store's error when it cannot be read."""
    now = await stores.ownership.now()
    records = {r.partition_id: r for r in await stores.ownership.list_ownership(ref)}
    checkpoints = {c.partition_id: c for c in await stores.checkpoints.list_checkpoints(ref)}
    listed = await stores.controls.list_members(ref)
    controls = await stores.controls.list_controls(ref)
    ids = await asyncio.to_thread(with_source, ref.hub, lambda source: tuple(source.partition_ids()))
    if ids is None:  # no source to ask: the partitions the store knows of
        ids = tuple(sorted(set(records) | set(checkpoints), key=pid_key))
    standing = Controls.of(controls)
    return Fleet(
        ref,
        now,
        expiry,
        ids,
        records,
        {m.owner_id: m for m in listed},
        standing.drained,
        dict(standing.pins),
        checkpoints,
    )


def check_partition(fleet: Fleet, partition: str) -> str:
    """``partition`` if the hub has it; Refused ("bad_request", "unknown_partition") otherwise."""
    if not partition:
        raise Refused("bad_request", "name the partition")
    if partition not in fleet.partition_ids:
        span = f"{fleet.partition_ids[0]}..{fleet.partition_ids[-1]}" if fleet.partition_ids else "none"
        raise Refused("unknown_partition", f"unknown partition {partition!r}; the hub's partitions are {span}")
    return partition


def check_worker(fleet: Fleet, worker: str) -> str:
    """``worker`` if the fleet knows it (a heartbeat, a lease or a drain); Refused otherwise."""
    if not worker:
        raise Refused("bad_request", "name the worker")
    if worker not in fleet.known_workers():
        known = ", ".join(sorted(fleet.known_workers())) or "none"
        raise Refused("unknown_worker", f"unknown worker {worker!r}; known workers: {known}")
    return worker


ALL = "all"


def check_selection(raw: str) -> str:
    """``raw`` as a selection of dead letters: "all", or distinct sequence numbers in increasing order
    separated by commas ("7,3, 7" is "3,7"); Refused ("bad_request") otherwise."""
    text = raw.strip().lower()
    if text == ALL:
        return ALL
    numbers = [part.strip() for part in text.split(",")]
    if not text or not all(n.isdigit() and n.isascii() and len(n) <= 18 for n in numbers):
        raise Refused("bad_request", f"say all, or sequence numbers separated by commas, not {raw!r}")
    return ",".join(str(n) for n in sorted({int(n) for n in numbers}))
