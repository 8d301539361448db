"""Release notices: a planned move with no gap.

A worker that hands a partition over releases it (a claim with no owner) and publishes a notice; the
worker waiting for it hears the notice and runs its next cycle at once, instead of at the end of its
interval, so the partition is owned again within a store round trip or two of the release and never
before it (the claim is a compare-and-set on the released record).

A notice is a hint, never the truth: it may be late, lost or repeated, and a listener acts on it only
by running a cycle, which reads the store. Losing one costs what it costs without notices: the
partition waits for the receiver's next cycle.

A notice naming no partition is news: a worker joined (``Coordinator.announce_joining``) or an
operator changed a control. A join ends only a quiet wait (``Coordinator.quiet_until``: a steady worker
where notices cross processes reads the store less often than every interval); any other worker reads
it within an interval anyway. An operator's notice (from ``OPERATOR``: a drain, a pin) wakes every
worker at once, as the channel layer's wake-up of the same action does where there is one: a worker
drained between two cycles would otherwise go on for up to an interval (``wakes``).

Channels: ``LocalChannel`` within one process (workers of one ``runworkers``, the simulator, the
in-memory store); the Redis store publishes on Redis pub/sub and the SQL store on PostgreSQL's
``LISTEN/NOTIFY`` (``release_channel(ref)`` on each); the Blob store has none (Azure Blob Storage has no
notification a client can subscribe to without Event Grid), nor has the SQL store on SQLite. For
those, ``runworkers`` sends notices through Django Channels' channel layer when it crosses processes
(``channels_redis``, with ``REDIS_URL``): ``workers.layer_notices``, chosen by ``workers.releases``, as
this package imports no Django. Without one either, a receiver there claims at its next cycle.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from balancer.model import HubRef

# A listener that falls this far behind drops the oldest notices: each only prompts a cycle.
QUEUE_SIZE = 1024


@dataclass(frozen=True, slots=True)
class Released:
    """``by`` released ``partition_ids`` of ``ref``."""

    ref: HubRef
    partition_ids: tuple[str, ...]
    by: str

    def encode(self) -> str:
        ref = self.ref
        fields = {"ns": ref.namespace, "hub": ref.hub, "cg": ref.consumer_group}
        return json.dumps({**fields, "p": list(self.partition_ids), "by": self.by}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> Released | None:
        """The notice in ``text``, or None for anything else on the channel (never raises)."""
        try:
            data = json.loads(text)
            ref = HubRef(str(data["ns"]), str(data["hub"]), str(data["cg"]))
            pids = tuple(str(p) for p in data["p"])
            return cls(ref, pids, str(data["by"]))
        except (ValueError, TypeError, KeyError):
            return None


@runtime_checkable
class ReleaseChannel(Protocol):
    async def publish(self, notice: Released) -> None:
        """Tell every listener (best effort; raises StoreUnavailable if it could not be sent)."""

    def listen(self) -> AsyncIterator[Released]:
        """Every notice published from now on, until the iteration is closed or cancelled."""

    async def aclose(self) -> None:
        """Stop listening and close what the channel opened."""


class LocalChannel:
    """Notices between the workers of one process (and the simulator's)."""

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[Released]] = set()

    async def publish(self, notice: Released) -> None:
        for queue in self._queues:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(notice)

    async def listen(self) -> AsyncIterator[Released]:
        queue: asyncio.Queue[Released] = asyncio.Queue(QUEUE_SIZE)
        self._queues.add(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._queues.discard(queue)

    async def aclose(self) -> None:
        self._queues.clear()


def release_channel(store: object, ref: HubRef) -> ReleaseChannel | None:
    """The store's own channel for ``ref`` (``store.release_channel(ref)``), or None where it has none
    (or has none on this database: the SQL store on SQLite)."""
    make = getattr(store, "release_channel", None)
    return make(ref) if callable(make) else None


OPERATOR = "operator"  # who a notice of an operator's change is from (no worker's owner id)


def wakes(notice: Released) -> bool:
    """Whether ``notice`` wakes a worker it concerns whatever its wait (a release, an operator's
    change), rather than being news that ends only a quiet wait (a join)."""
    return bool(notice.partition_ids) or notice.by == OPERATOR


def concerns(notice: Released, ref: HubRef, owner_id: str, partition_ids: Sequence[str] = ()) -> bool:
    """Whether ``notice`` is news for worker ``owner_id`` of ``ref``: another worker's release there
    (of one of ``partition_ids``, when given)."""
    if notice.ref != ref or notice.by == owner_id:
        return False
    return not partition_ids or any(p in partition_ids for p in notice.partition_ids)
