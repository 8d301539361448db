"""The in-memory store: every protocol, for tests, the simulator and single-process demos.

Thread-safe (one lock), so the contract suite's race of two real threads holds here too. The
clock is injected so the simulator can run it on simulated time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import count

from balancer.errors import OwnershipLost, StoreUnavailable
from balancer.model import Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord
from balancer.protocol import Snapshot


class MemoryStore:
    """Ownership, checkpoints, members and controls in dictionaries."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._etags = count(1)
        self._ownership: dict[tuple[HubRef, str], OwnershipRecord] = {}
        self._checkpoints: dict[tuple[HubRef, str], Checkpoint] = {}
        self._members: dict[tuple[HubRef, str], Member] = {}
        self._controls: dict[tuple[HubRef, ControlKind, str], Control] = {}
        self.requests = 0  # store round trips, for the simulator's and the bench's counts
        self.down = False  # set by tests and the simulator to model an outage

    def _enter(self) -> None:
        self.requests += 1
        if self.down:
            raise StoreUnavailable("in-memory store is marked down")

    async def now(self) -> float:
        return self._clock()

    async def snapshot(self, ref: HubRef) -> Snapshot:
        """Ownership, members, controls and the clock in one request."""
        with self._lock:
            self._enter()
            return Snapshot(
                [r for (k, _), r in self._ownership.items() if k == ref],
                [m for (k, _), m in self._members.items() if k == ref],
                [c for (k, _, _), c in self._controls.items() if k == ref],
                self._clock(),
            )

    # ownership -----------------------------------------------------------------------------

    async def list_ownership(self, ref: HubRef) -> list[OwnershipRecord]:
        with self._lock:
            self._enter()
            return [r for (k, _), r in self._ownership.items() if k == ref]

    async def claim_ownership(self, records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
        won: list[OwnershipRecord] = []
        with self._lock:
            self._enter()
            now = self._clock()
            for record in records:
                key = (record.ref, record.partition_id)
                current = self._ownership.get(key)
                if current is None and record.etag is not None:
                    continue  # claims an ETag the store never issued for this partition
                if current is not None and current.etag != record.etag:
                    continue  # someone wrote it since the caller looked
                stored = replace(record, etag=f"m{next(self._etags)}", last_modified=now)
                self._ownership[key] = stored
                won.append(stored)
        return won

    # checkpoints ---------------------------------------------------------------------------

    async def list_checkpoints(self, ref: HubRef) -> list[Checkpoint]:
        with self._lock:
            self._enter()
            return [c for (k, _), c in self._checkpoints.items() if k == ref]

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        with self._lock:
            self._enter()
            key = (checkpoint.ref, checkpoint.partition_id)
            owner = self._ownership.get(key)
            if owner is None or not owner_id or owner.owner_id != owner_id:  # "" owns nothing
                raise OwnershipLost(checkpoint.partition_id, owner_id, (owner.owner_id or None) if owner else None)
            stored = replace(checkpoint, last_modified=self._clock())
            self._checkpoints[key] = stored
            return stored

    # members and controls ------------------------------------------------------------------

    async def heartbeat(self, member: Member) -> None:
        with self._lock:
            self._enter()
            self._members[(member.ref, member.owner_id)] = replace(member, last_seen=self._clock())

    async def list_members(self, ref: HubRef) -> list[Member]:
        with self._lock:
            self._enter()
            return [m for (k, _), m in self._members.items() if k == ref]

    async def remove_member(self, ref: HubRef, owner_id: str) -> None:
        with self._lock:
            self._enter()
            self._members.pop((ref, owner_id), None)

    async def list_controls(self, ref: HubRef) -> list[Control]:
        with self._lock:
            self._enter()
            return [c for (k, _, _), c in self._controls.items() if k == ref]

    async def put_control(self, control: Control) -> None:
        with self._lock:
            self._enter()
            stored = replace(control, created=self._clock())
            self._controls[(control.ref, control.kind, control.target)] = stored

    async def delete_control(self, ref: HubRef, kind: str, target: str) -> None:
        with self._lock:
            self._enter()
            self._controls.pop((ref, ControlKind(kind), target), None)
