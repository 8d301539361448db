"""The ownership records of the partitions a race node processes.

The race decides who processes a partition; the ownership store still fences checkpoints
(``update_checkpoint`` checks the record's owner) and shows owners on the dashboard. So a node
that starts a partition takes its record from whoever held it, renews every record it holds each
cycle, and releases one when it hands the partition over. A record taken by someone else means
this node lost the partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import TypeVar

from balancer.model import OwnershipRecord
from balancer.protocol import OwnershipStore, by_partition
from balancer.race.node import RaceNode, log

T = TypeVar("T")
Drop = Callable[[str, str | None, str], None]  # (partition, who holds it now, why): stop processing it


class Leases:
    """``node``'s records in ``store``; every call counts one in ``requests``."""

    def __init__(self, node: RaceNode, store: OwnershipStore) -> None:
        self._node = node
        self.store = store
        self.requests = 0
        # Record writes (start, renew, release) read and rewrite ``node.owned`` across awaits: a
        # release racing a renewal would lose to it (the renewal moves the ETag). Hold this around them.
        self.lock = asyncio.Lock()

    async def call(self, awaitable: Awaitable[T]) -> T:
        """Await one request to the ownership (or control) store, counting it."""
        self.requests += 1
        return await awaitable

    async def take(self, pid: str) -> OwnershipRecord | None:
        """The partition's record, taken over whoever holds it (the race decided); None when it kept
        changing under us. Call holding ``lock``."""
        node = self._node
        for _ in range(4):
            listed = by_partition(await self.call(self.store.list_ownership(node.ref)))
            current = listed.get(pid)
            request = current.claimed_by(node.owner_id) if current else OwnershipRecord(node.ref, pid, node.owner_id)
            won = await self.call(self.store.claim_ownership([request]))
            if won:
                return won[0]
        log.warning("%s: partition %s: its ownership record kept changing; not taken", node.owner_id, pid)
        return None

    async def renew(self, drop: Drop) -> None:
        """Renew every record ``node.owned`` holds; ``drop`` each one taken by someone else (which
        must remove it from ``node.owned``). Call holding ``lock``."""
        node, owned = self._node, self._node.owned
        if not owned:
            return
        won = by_partition(await self.call(self.store.claim_ownership(list(owned.values()))))
        failed = [p for p in owned if p not in won]
        if failed:
            listed = by_partition(await self.call(self.store.list_ownership(node.ref)))
            again: list[OwnershipRecord] = []
            for pid in failed:
                current = listed.get(pid)
                if current is None:  # the store lost it (restart without persistence): claim it anew
                    again.append(OwnershipRecord(node.ref, pid, node.owner_id))
                elif current.owner_id == node.owner_id:
                    again.append(current)
                else:
                    drop(pid, current.owner_id or None, f"ownership record taken by {current.owner_id!r}")
            if again:
                won.update(by_partition(await self.call(self.store.claim_ownership(again))))
        for pid in list(owned):
            if pid in won:
                owned[pid] = won[pid]
            else:
                drop(pid, None, "ownership record could not be renewed")

    async def release(self, records: Iterable[OwnershipRecord]) -> list[OwnershipRecord]:
        """Release ``records`` (a claim with no owner); return those released (the others were taken)."""
        return await self.call(self.store.claim_ownership([replace(r, owner_id="") for r in records]))
