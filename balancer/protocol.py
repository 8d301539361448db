"""The store protocols of DESIGN.md, and the ``Balancer`` protocol every coordinator satisfies.

Ownership and checkpoints are two protocols (``002_affc69e144ac6489.txt``) so they may live in
different stores. All calls are async: the runtime is an asyncio program and the Redis and Blob
clients are async too. Every adapter is proven by ``tests/contract``.

``Balancer`` is what the runtime (``workers.runtime.processor``) and the simulator (``balancer.sim``)
call on a coordinator: the lease table's ``balancer.lease.Coordinator`` and 001's lease race
``balancer.race.coordinator.RaceCoordinator`` both satisfy it (each module proves it to the type
checker), so neither needs to know which one it drives.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from balancer import schedule
from balancer.model import BalancerEvent, Checkpoint, Control, HubRef, Member, OwnershipRecord

PartitionSource = Callable[[], Awaitable[Sequence[str]]]  # the hub's partition ids, asked each cycle
EventSink = Callable[[BalancerEvent], None]  # told every ownership change a coordinator makes or sees
HandoffHook = Callable[[str], None]  # told a planned move of a partition starts (see Balancer.release)


@runtime_checkable
class OwnershipStore(Protocol):
    async def list_ownership(self, ref: HubRef) -> list[OwnershipRecord]:
        """Every ownership record of ``ref``, at most one per partition, released ones included."""

    async def claim_ownership(self, records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
        """Try to write each record; return only those won, with their new ETag and last-modified.

        A record whose ``etag`` is None wins only if the partition has no record yet; otherwise only
        if the stored ETag still equals ``etag``. Losing is not an error. A release is a claim with
        ``owner_id=""``. Raises StoreUnavailable when the store cannot be reached.
        """

    async def now(self) -> float:
        """The store's clock, the one ``last_modified`` is written with (expiry is judged by it)."""


@runtime_checkable
class CheckpointStore(Protocol):
    async def list_checkpoints(self, ref: HubRef) -> list[Checkpoint]:
        """Every checkpoint of ``ref``, at most one per partition."""

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        """Write ``checkpoint`` if ``owner_id`` owns its partition; return it with last-modified set.

        Raises OwnershipLost, and writes nothing, when ``owner_id`` is not the current owner.
        """


@runtime_checkable
class ControlStore(Protocol):
    """Heartbeats of live workers and the operators' control records (drain, pin, rebalance)."""

    async def heartbeat(self, member: Member) -> None:
        """Record that ``member.owner_id`` is alive (store clock; ``member.last_seen`` is ignored)."""

    async def list_members(self, ref: HubRef) -> list[Member]:
        """Every member that ever sent a heartbeat for ``ref``, alive or not."""

    async def remove_member(self, ref: HubRef, owner_id: str) -> None:
        """Forget a member (clean shutdown, or an operator purging a dead worker)."""

    async def list_controls(self, ref: HubRef) -> list[Control]:
        """Every standing control record of ``ref``."""

    async def put_control(self, control: Control) -> None:
        """Create or replace the control record with the same (kind, target)."""

    async def delete_control(self, ref: HubRef, kind: str, target: str) -> None:
        """Remove a control record; no error if it was not there."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one cycle of a membership-aware strategy reads: ownership, members, controls, clock."""

    ownership: list[OwnershipRecord]
    members: list[Member]
    controls: list[Control]
    now: float  # the store's clock when it was read


@runtime_checkable
class SnapshotStore(Protocol):
    """Optional: a store that reads a whole ``Snapshot`` in one round trip implements this."""

    async def snapshot(self, ref: HubRef) -> Snapshot: ...


async def snapshot(store: OwnershipStore, controls: ControlStore, ref: HubRef) -> tuple[Snapshot, int]:
    """The snapshot of ``ref`` and the store requests it took: one where the store reads it in one
    round trip, else four separate calls."""
    same: object = controls
    if store is same and isinstance(store, SnapshotStore):
        return await store.snapshot(ref), 1
    ownership = await store.list_ownership(ref)
    members = await controls.list_members(ref)
    listed = await controls.list_controls(ref)
    return Snapshot(ownership, members, listed, await store.now()), 4


def by_partition(records: Iterable[OwnershipRecord]) -> dict[str, OwnershipRecord]:
    """Index records by partition id."""
    return {r.partition_id: r for r in records}


# coordinators ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CycleReport:
    """What one cycle did."""

    owned: frozenset[str]
    gained: tuple[BalancerEvent, ...] = ()
    lost: tuple[BalancerEvent, ...] = ()
    requests: int = 0
    seconds: float = 0.0
    rebalance: bool = False  # an operator asked for a rebalance since the last cycle: cycle again now
    # The worker's first cycle, which (with the default strategy) only announced it: cycle again soon,
    # once the workers starting with it have announced themselves, not a whole interval later.
    announced: bool = False
    waiting: tuple[str, ...] = ()  # partitions assigned to this worker that another still holds
    rows: int = 0  # ownership records read from the store (what changed, on a store with a change feed)
    planned: bool = True  # False: a steady cycle, which skipped its plan (``Coordinator.steady_cycles``)
    # On the coordinator's monotonic clock: when a partition this worker wants but left free (released by a
    # worker that left: ``cooperative.vacated_for``) may be claimed; the next read comes no later.
    recheck_at: float | None = None


def soon(report: CycleReport, interval: float, *, poll_waiting: bool = True) -> float | None:
    """The delay before the next cycle when ``report`` calls for one sooner than ``interval``, else None:
    after the announcing first cycle (so simultaneous starters have all announced themselves and no
    whole interval is lost at every start), and, with ``poll_waiting`` (a store without release
    notices), while a handoff to this worker is pending, to claim soon after the release. One rule of
    the schedule (``balancer.schedule``, which decides every wait)."""
    return schedule.soon_after(schedule.Last.of(report), interval, poll_waiting=poll_waiting)


@dataclass(frozen=True, slots=True)
class Driver:
    """What a coordinator's driver does besides calling ``cycle()``, told with each ``cycle()`` and
    ``renew()``: a coordinator is complete when built, and whoever drives it says how as it calls.

    ``on_handoff``: the driver hands planned moves off itself: told a partition's move starts (inside
    the cycle, or whenever a race is lost), it stops that partition's processing after the event in
    hand and its final checkpoint, then calls ``release()``. None: the coordinator releases by itself
    (unless it was built with a hook of its own, which comes first). ``renewal_steps``: the driver
    calls ``renew()`` at ``next_renewal()`` between cycles, so leases are renewed on their own
    schedule rather than each in the last cycle that is safely early."""

    on_handoff: HandoffHook | None = None
    renewal_steps: bool = False


CYCLES_ONLY = Driver()  # a driver that only calls cycle() (the simulator's, a test's)


class Balancer(Protocol):
    """One worker's load balancing for one hub and consumer group, as its driver sees it.

    The driver calls ``cycle()`` on its own schedule (so lease renewal never waits behind a
    handler), saying how it drives (``Driver``); asks ``holds()`` (or reads ``deadline()`` once)
    before handing an event on; with a handoff hook, stops a partition's processing when the hook
    names it and then calls ``release()`` (or ``release_many()``); with renewal steps, calls
    ``renew()`` at ``next_renewal()`` between cycles; after a steady cycle may wait until
    ``quiet_until()`` if it hears of every other change at once, asking ``partitions_changed()`` every
    interval meanwhile; and calls ``release_all()`` when
    stopping. A coordinator without renewal steps or quiet waits answers None to both.
    """

    @property
    def ref(self) -> HubRef: ...

    @property
    def owner_id(self) -> str: ...

    @property
    def expiry(self) -> float:
        """Seconds a lease lasts without a successful cycle: ``holds()`` turns False after it."""

    @property
    def handoff_timeout(self) -> float | None:
        """Seconds a receiver waits for a handoff before taking the partition over (None: the expiry)."""

    @property
    def monotonic(self) -> Callable[[], float]:
        """The local clock ``holds()`` and ``deadline()`` are judged by."""

    @property
    def owned(self) -> frozenset[str]:
        """The partitions this worker holds (some may be being handed off)."""

    async def cycle(self, driver: Driver = CYCLES_ONLY) -> CycleReport:
        """Run one load-balancing cycle. Raises StoreError when a store fails; leases are kept."""

    async def renew(self, driver: Driver = CYCLES_ONLY) -> CycleReport:
        """Renew the leases due now, between cycles, without a listing or a plan. Raises StoreError
        when a store fails (leases are kept, to be tried again at ``next_renewal()``)."""

    def next_renewal(self) -> float | None:
        """The ``monotonic()`` time at which ``renew()`` next has a lease to renew (perhaps already
        past), or None: nothing to renew between cycles."""

    def quiet_until(self, interval: float | None = None) -> float | None:
        """After a steady cycle, the ``monotonic()`` time by which the next cycle must read the store
        while nothing changes, or None: cycle at the next interval."""

    async def partitions_changed(self) -> bool:
        """Whether the hub's partitions differ from those the last cycle read: one call of the partition
        source, no store request. A driver waiting quietly (``quiet_until``) asks every interval, as no
        store's channel tells of partitions added. Raises what the partition source raises."""

    def holds(self, partition_id: str) -> bool:
        """True while this worker may process ``partition_id`` (it holds it, and its lease cannot
        have passed to another worker yet)."""

    def deadline(self, partition_id: str) -> float:
        """The ``monotonic()`` time from which ``holds(partition_id)`` is False unless renewed
        meanwhile (-inf when not held)."""

    def handing_off(self, partition_id: str) -> bool:
        """True from the start of a planned move of ``partition_id`` until it is released."""

    async def release(self, partition_id: str, reason: str = "handed off") -> BalancerEvent | None:
        """Give one held partition up now (the end of a handoff); None if it was not held."""

    async def release_many(self, partition_ids: Sequence[str], reason: str = "handed off") -> list[BalancerEvent]:
        """Give the held ones of ``partition_ids`` up now (the ends of handoffs that finished
        together); their events, in the order given."""

    async def release_all(self, reason: str = "shutting down") -> list[BalancerEvent]:
        """Give every held partition up at once, so others take them now rather than after expiry."""

    async def give_up(self, partition_id: str, reason: str, seconds: float) -> BalancerEvent | None:
        """Release ``partition_id``, stuck on this worker (``reason`` says why), and take it no more for
        ``seconds`` (said to the others where the strategy plans with members); None if not held."""

    def avoiding(self) -> frozenset[str]:
        """The partitions this worker gave up (``give_up``) and takes no more for now ("*": every one)."""

    async def cannot_read(self, seconds: float) -> None:
        """This worker cannot read the hub: it hands every partition over and claims none for ``seconds``
        (said to the others where the strategy plans with members)."""

    async def can_read(self) -> None:
        """This worker reads the hub again: a ``cannot_read`` ends now, before its time is up."""

    def healed(self, partition_id: str, reason: str) -> None:
        """Tell the event sink of a healing step on a partition this worker holds (its reader or handler
        restarted: ``reason`` says which and why), as a ``heal`` event; no change of owner."""


class CyclesAlone:
    """The calls of ``Balancer`` that a coordinator doing all its work in its cycles answers with
    nothing: no renewal between cycles, no quiet wait, no handoff timeout of its own, and releases
    one at a time. Such a coordinator (001's lease race) inherits them."""

    handoff_timeout: float | None = None  # a receiver waits the expiry

    @property
    def owned(self) -> frozenset[str]:
        raise NotImplementedError

    async def release(self, partition_id: str, reason: str = "handed off") -> BalancerEvent | None:
        raise NotImplementedError

    async def renew(self, driver: Driver = CYCLES_ONLY) -> CycleReport:
        """Nothing to renew between cycles (``next_renewal()`` is None): what is held, no request."""
        return CycleReport(owned=self.owned)

    def next_renewal(self) -> float | None:
        return None

    def quiet_until(self, interval: float | None = None) -> float | None:
        return None

    async def partitions_changed(self) -> bool:
        """Never asked (no quiet wait without ``quiet_until``): False."""
        return False

    async def give_up(self, partition_id: str, reason: str, seconds: float) -> BalancerEvent | None:
        """A plain ``release()``: a race has no plan to keep the partition away from this worker."""
        return await self.release(partition_id, reason)

    def avoiding(self) -> frozenset[str]:
        return frozenset()

    async def cannot_read(self, seconds: float) -> None:
        """Nothing: a race has no plan to hand partitions over by (each is given up on its own)."""

    async def can_read(self) -> None:
        """Nothing (see ``cannot_read``)."""

    async def release_many(self, partition_ids: Sequence[str], reason: str = "handed off") -> list[BalancerEvent]:
        """``release()`` of each in turn; the events of those that were held. Raises what the first
        release that fails raises (those after it are not tried)."""
        events = []
        for pid in partition_ids:
            event = await self.release(pid, reason)
            if event is not None:
                events.append(event)
        return events
