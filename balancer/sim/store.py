"""The simulator's view of the store: network latency per worker, and a ledger of every write.

Each worker talks to the one ``MemoryStore`` through its own ``LatentStore``: a request travels
for half its latency, runs atomically in the store (on the store's clock), and the answer travels
back for the other half. So two workers' cycles interleave the way they do over a network, and
two claims of one partition really race. The ledger sees every won write, in store order, and
from that alone knows who holds what, when, and which writes moved a partition between two live
workers.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from balancer.changes import Changes
from balancer.model import Checkpoint, Control, HubRef, Member, OwnershipRecord
from balancer.protocol import Snapshot
from balancer.stores.memory import MemoryStore

T = TypeVar("T")


@dataclass
class Ledger:
    """Ownership as the store has it, kept from the writes the store let through."""

    expiry: float
    alive: Callable[[str], bool]  # is this worker running (not crashed)?
    owner: dict[str, str] = field(default_factory=dict)  # pid -> current owner ("" when released)
    modified: dict[str, float] = field(default_factory=dict)  # pid -> store time of the last write
    last_holder: dict[str, str] = field(default_factory=dict)  # pid -> last non-empty owner
    held: Counter[str] = field(default_factory=Counter)  # owner -> partitions whose record names it
    moves: int = 0
    counting: bool = False  # moves are counted from the disturbance on

    def record(self, won: Sequence[OwnershipRecord]) -> None:
        for r in won:
            pid = r.partition_id
            before = self.owner.get(pid, "")
            if before:
                self.held[before] -= 1
            if r.owner_id:
                self.held[r.owner_id] += 1
                previous = self.last_holder.get(pid)
                if self.counting and previous and previous != r.owner_id and self.alive(previous):
                    self.moves += 1
                self.last_holder[pid] = r.owner_id
            self.owner[pid] = r.owner_id
            self.modified[pid] = r.last_modified if r.last_modified is not None else 0.0

    def holder(self, pid: str, now: float) -> str | None:
        """Who holds ``pid`` at store time ``now`` (None: released, never owned, or expired)."""
        owner = self.owner.get(pid, "")
        if not owner or now - self.modified[pid] > self.expiry:
            return None
        return owner


class LatentStore:
    """One worker's connection to the shared in-memory store: every protocol, with latency."""

    def __init__(self, store: MemoryStore, ledger: Ledger, rng: random.Random, latency: tuple[float, float]) -> None:
        self._store = store
        self._ledger = ledger
        self._rng = rng
        self._latency = latency
        self.requests = 0  # every request except checkpoint writes (processing, not balancing)
        self.first_claim_at: float | None = None  # loop time of the first claim since it was reset

    async def _call(self, request: Callable[[], Awaitable[T]], count: bool = True) -> T:
        self.requests += count
        low, high = self._latency
        half = self._rng.uniform(low, high) / 2
        await asyncio.sleep(half)
        result = await request()  # runs atomically: MemoryStore never awaits inside
        await asyncio.sleep(half)
        return result

    # ownership -----------------------------------------------------------------------------

    async def now(self) -> float:
        return await self._call(self._store.now)

    async def list_ownership(self, ref: HubRef) -> list[OwnershipRecord]:
        return await self._call(lambda: self._store.list_ownership(ref))

    async def snapshot(self, ref: HubRef) -> Snapshot:
        return await self._call(lambda: self._store.snapshot(ref))

    async def snapshot_since(self, ref: HubRef, cursor: str | None, stale_after: float | None = None) -> Changes:
        """What changed since ``cursor`` (``balancer.changes.ChangeFeed``), as the SQL and Redis stores
        offer it: the coordinators read deltas, skip steady plans and wait quietly as they do there."""
        return await self._call(lambda: self._store.snapshot_since(ref, cursor, stale_after))

    async def claim_ownership(self, records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
        if self.first_claim_at is None:
            self.first_claim_at = asyncio.get_running_loop().time()

        async def claim() -> list[OwnershipRecord]:
            won = await self._store.claim_ownership(records)
            self._ledger.record(won)  # in the same instant as the write: store order
            return won

        return await self._call(claim)

    # checkpoints ---------------------------------------------------------------------------

    async def list_checkpoints(self, ref: HubRef) -> list[Checkpoint]:
        return await self._call(lambda: self._store.list_checkpoints(ref))

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        # processing traffic, not the balancer's: not counted
        return await self._call(lambda: self._store.update_checkpoint(checkpoint, owner_id), count=False)

    # members and controls ------------------------------------------------------------------

    async def heartbeat(self, member: Member) -> None:
        await self._call(lambda: self._store.heartbeat(member))

    async def list_members(self, ref: HubRef) -> list[Member]:
        return await self._call(lambda: self._store.list_members(ref))

    async def remove_member(self, ref: HubRef, owner_id: str) -> None:
        await self._call(lambda: self._store.remove_member(ref, owner_id))

    async def list_controls(self, ref: HubRef) -> list[Control]:
        return await self._call(lambda: self._store.list_controls(ref))

    async def put_control(self, control: Control) -> None:
        await self._call(lambda: self._store.put_control(control))

    async def delete_control(self, ref: HubRef, kind: str, target: str) -> None:
        await self._call(lambda: self._store.delete_control(ref, kind, target))
