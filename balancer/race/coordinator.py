"""``race``: the Redis lease race of ``001_552f7490fd2b6e08.txt``, as a coordinator (``RaceCoordinator``).
The package's docstring (``balancer/race/__init__.py``) gives 001 step by step and how what it
leaves open is closed here, part by part.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from balancer.errors import StoreError
from balancer.model import BalancerEvent, Controls, EventKind, HubRef, Member, OwnershipRecord
from balancer.protocol import (
    CYCLES_ONLY,
    Balancer,
    ControlStore,
    CycleReport,
    CyclesAlone,
    Driver,
    EventSink,
    HandoffHook,
    OwnershipStore,
    PartitionSource,
    by_partition,
)
from balancer.race.backend import Channel, RaceBackend
from balancer.race.challenge import Challenger
from balancer.race.leases import Leases
from balancer.race.node import Outages, RaceNode, log
from balancer.race.steps import Racer
from balancer.race.subscription import Subscription
from balancer.race.times import LoadWeights, RaceTimes

T = TypeVar("T")


class RaceCoordinator(CyclesAlone):
    """One node of the lease race for one hub and consumer group: a ``Balancer``.

    The runtime drives it like ``balancer.lease.Coordinator``: ``cycle()`` on its schedule,
    ``owned``/``holds()``/``handing_off()`` before handing events on, ``release()`` at the end of a
    handoff, ``release_all()`` when stopping; ``on_event`` gets every ownership change.
    """

    def __init__(
        self,
        ref: HubRef,
        owner_id: str,
        store: OwnershipStore,
        backend: RaceBackend,
        partitions: PartitionSource,
        times: RaceTimes | None = None,
        *,
        controls: ControlStore | None = None,
        on_event: EventSink | None = None,
        on_handoff: HandoffHook | None = None,
        load: LoadWeights | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        node = RaceNode(ref, owner_id, times or RaceTimes(), rng or random.Random(), clock, monotonic, load)
        self.node = node
        self.backend = backend
        self.partitions = partitions
        self.controls = controls
        self.on_event = on_event
        self.on_handoff = on_handoff
        self._driver = CYCLES_ONLY  # the last cycle's: its hook is told of races lost meanwhile
        outages = Outages(owner_id)  # what is failing now, each logged once
        self._leases = Leases(node, store)
        self._subscription = Subscription(node, backend, outages, self._deliver)
        self._racer = Racer(node, backend, self._leases, self._subscription, outages, lose=self._lose, emit=self._emit)
        self._challenger = Challenger(node, backend, self._subscription, self._racer, outages)
        self._listener: asyncio.Task[None] | None = None
        self._timer_task: asyncio.Task[None] | None = None
        self._releasing: set[asyncio.Task[None]] = set()  # releases of lost races without a runtime
        self._contact: float | None = None  # monotonic time the last successful read was sent
        self._events: list[BalancerEvent] = []  # since the last cycle's report

    # who this node is, what it holds ------------------------------------------------------

    @property
    def ref(self) -> HubRef:
        return self.node.ref

    @property
    def owner_id(self) -> str:
        return self.node.owner_id

    @property
    def times(self) -> RaceTimes:
        return self.node.times

    @property
    def clock(self) -> Callable[[], float]:
        return self.node.clock

    @property
    def monotonic(self) -> Callable[[], float]:
        return self.node.monotonic

    @property
    def load(self) -> LoadWeights | None:
        """Measured load (the load-weighted variant); None counts partitions."""
        return self.node.load

    @load.setter
    def load(self, load: LoadWeights | None) -> None:
        self.node.load = load

    @property
    def expiry(self) -> float:
        """The local lease: see ``holds()``."""
        return self.node.times.maximum_shutdown

    @property
    def owned(self) -> frozenset[str]:
        return frozenset(self.node.owned)

    @property
    def requests(self) -> int:
        """Round trips so far: the race store's and the ownership store's."""
        return self.backend.requests + self._leases.requests

    def handing_off(self, partition_id: str) -> bool:
        """True from a lost race until ``release()``."""
        return partition_id in self.node.handing_off

    def holds(self, partition_id: str) -> bool:
        """True while this node processes ``partition_id`` and reached the race store recently."""
        contact, owned = self._contact, partition_id in self.node.owned
        return owned and contact is not None and self.monotonic() - contact < self.times.maximum_shutdown

    def deadline(self, partition_id: str) -> float:
        """The monotonic time from which ``holds(partition_id)`` is False unless the race's store is
        reached again meanwhile (-inf when not held)."""
        contact = self._contact
        if partition_id not in self.node.owned or contact is None:
            return -math.inf
        return contact + self.times.maximum_shutdown

    # the cycle -----------------------------------------------------------------------------

    async def cycle(self, driver: Driver = CYCLES_ONLY) -> CycleReport:
        """Read both hashes, repair from them, renew ownership records (grab timers and races run in
        tasks of their own, started by the first cycle; a lost race goes to ``on_handoff``, else ``driver``'s).

        Raises StoreUnavailable (or StoreError) when a store fails; what is held is kept.
        """
        node, self._driver = self.node, driver
        started = self.monotonic()
        before = self.requests
        self._start_tasks()
        pids = tuple(await self.partitions())
        node.known = frozenset(pids)
        sent = self.monotonic()
        state = await self.backend.hgetall(("allocation", "grab"))
        self._contact = sent
        allocation, grab = state["allocation"], state["grab"]
        node.grab_seen = dict(grab)
        self._challenger.add(pids)
        if self.controls is not None:
            await self._controls(self.controls)
        if node.load is not None:
            node.load.sample(node.owned, self.monotonic())
        await self._repair(allocation, grab)
        async with self._leases.lock:
            await self._leases.renew(self._drop)
        await self._racer.clear_due_marks()
        events, self._events = self._events, []
        return CycleReport(
            owned=self.owned,
            gained=tuple(e for e in events if e.owner_id == self.owner_id),
            lost=tuple(e for e in events if e.owner_id != self.owner_id),
            requests=self.requests - before,
            seconds=self.monotonic() - started,
        )

    async def _controls(self, controls: ControlStore) -> None:
        member = Member(self.ref, self.owner_id, self.clock(), {"strategy": "race"})
        await self._leases.call(controls.heartbeat(member))
        listed = await self._leases.call(controls.list_controls(self.ref))
        self._challenger.obey(Controls.of(listed))

    async def _repair(self, allocation: dict[str, str], grab: dict[str, str]) -> None:
        """Settle what pub/sub may have missed (see the module docstring)."""
        for pid in list(self.node.owned):
            if pid in self.node.handing_off or self._racer.deciding(pid):
                continue  # a race of ours not decided yet: its outcome settles this partition
            winner, holder = grab.get(pid), allocation.get(pid)
            if winner is not None and winner != self.owner_id:
                self._lose(pid, f"{winner} won a race for it that this node did not hear")
            elif holder is not None and holder != self.owner_id:
                self._drop(pid, holder, f"the allocation hash names {holder}")
            elif holder is None:
                # The allocation field is gone (a store restarted without persistence): put it back.
                got = await self.backend.hsetnx("allocation", pid, self.owner_id)
                if got != self.owner_id:
                    self._drop(pid, got, f"the allocation hash names {got}")

    async def adopt(self, pids: Sequence[str], reason: str = "adopted") -> None:
        """Process ``pids`` as if this node had won their races (restoring a known state, such as
        the simulator's balanced start): allocation marked, ownership records taken."""
        for pid in pids:
            await self.backend.hset("allocation", pid, self.owner_id)
            async with self._leases.lock:
                record = await self._leases.take(pid)
            if record is not None:
                self.node.owned[pid] = record
                self._emit(
                    BalancerEvent(
                        EventKind.CLAIM, self.ref, pid, self.owner_id, None, self.owner_id, reason, self.clock()
                    )
                )

    # notifications -------------------------------------------------------------------------

    def _start_tasks(self) -> None:
        if self._listener is None and not self.node.stopped:
            loop = asyncio.get_running_loop()
            self._listener = loop.create_task(self._subscription.run(), name=f"race listener {self.owner_id}")
            self._timer_task = loop.create_task(self._challenger.run(), name=f"race timers {self.owner_id}")

    def _deliver(self, channel: Channel, pid: str) -> None:
        """A notification heard: an allocated notice ends a winner's wait (step 4); a challenge
        resets the partition's timer and starts a race (step 2), one per partition at a time."""
        if channel == "allocated":
            self._racer.allocated(pid)
            return
        now = self.monotonic()
        self._challenger.heard(pid, now)
        if self.node.stopped or self._racer.racing(pid) or self.node.unknown(pid):
            return  # one race at a time per partition: a second notification joins the first
        self._racer.start(pid, now)

    # losing --------------------------------------------------------------------------------

    def _lose(self, pid: str, why: str) -> None:
        """Step 3b: shut the partition down gracefully, then ``release`` it."""
        node = self.node
        if pid in node.handing_off or pid not in node.owned:
            return
        node.handing_off.add(pid)
        node.load_dropped()
        log.info("%s: partition %s: lost the lease race: %s; shutting it down", self.owner_id, pid, why)
        on_handoff = self.on_handoff if self.on_handoff is not None else self._driver.on_handoff
        if on_handoff is not None:
            on_handoff(pid)
        else:
            task = asyncio.get_running_loop().create_task(self._hand_back(pid, why))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    async def _hand_back(self, pid: str, why: str) -> None:
        await self.release(pid, why)

    def _drop(self, pid: str, holder: str | None, why: str) -> None:
        """Stop processing at once: someone else already processes the partition."""
        if self.node.owned.pop(pid, None) is None:
            return
        self.node.handing_off.discard(pid)
        self.node.load_dropped()
        event = BalancerEvent(EventKind.LOST, self.ref, pid, holder, self.owner_id, self.owner_id, why, self.clock())
        self._emit(event)

    async def release(self, partition_id: str, reason: str = "handed off") -> BalancerEvent | None:
        """Step 3b's end: release the record, clear the allocation field, publish allocated (a planned
        handoff: the event's ``handoff`` is True).

        None if the partition was not held. Raises the first store error (after trying every step).
        """
        async with self._leases.lock:
            record = self.node.owned.pop(partition_id, None)
            self.node.handing_off.discard(partition_id)
            if record is None:
                return None
            errors: list[StoreError] = []
            released = await _attempt(errors, self._leases.release([record]))
            await _attempt(errors, self.backend.hdel("allocation", partition_id, expect=self.owner_id))
            await _attempt(errors, self.backend.publish("allocated", partition_id))
        kind = EventKind.RELEASE if released else EventKind.LOST
        why = reason if released else "ownership record taken before the release"
        event = BalancerEvent(
            kind, self.ref, partition_id, None, self.owner_id, self.owner_id, why, self.clock(), handoff=bool(released)
        )
        self._emit(event)
        if errors:
            raise errors[0]
        return event

    async def release_all(self, reason: str = "shutting down") -> list[BalancerEvent]:
        """Stop racing, release everything, and challenge each released partition so that others
        race for it now. Raises the first store error (after trying every step)."""
        node = self.node
        tasks = self.abort()
        if tasks:
            await asyncio.wait(tasks)
        errors: list[StoreError] = []
        events: list[BalancerEvent] = []
        async with self._leases.lock:
            held = dict(node.owned)
            node.owned.clear()
            node.handing_off.clear()
            released: list[OwnershipRecord] = []
            if held:
                released = await _attempt(errors, self._leases.release(held.values())) or []
            won = by_partition(released)
            for pid in sorted(held, key=int):
                await _attempt(errors, self.backend.hdel("allocation", pid, expect=self.owner_id))
            for pid in sorted(self._racer.marked() | node.starting, key=int):
                await _attempt(errors, self.backend.hdel("grab", pid, expect=self.owner_id))
            self._racer.forget_marks()
            for pid in sorted(held, key=int):
                await _attempt(errors, self.backend.publish("allocated", pid))
                await _attempt(errors, self.backend.publish("grab", pid))
                kind = EventKind.RELEASE if pid in won else EventKind.LOST
                why = reason if pid in won else "ownership record taken before the release"
                events.append(BalancerEvent(kind, self.ref, pid, None, self.owner_id, self.owner_id, why, self.clock()))
            if self.controls is not None:
                await _attempt(errors, self._leases.call(self.controls.remove_member(self.ref, self.owner_id)))
        for event in events:
            self._emit(event)
        if errors:
            raise errors[0]
        return events

    def abort(self) -> list[asyncio.Task[None]]:
        """What a crash leaves behind: every task cancelled, nothing released (tests, simulator).
        Returns the cancelled tasks (await them to be sure they are done)."""
        self.node.stopped = True
        running = (self._listener, self._timer_task, *self._racer.tasks(), *self._releasing)
        tasks = [t for t in running if t]
        for task in tasks:
            task.cancel()
        return tasks

    def healed(self, partition_id: str, reason: str) -> None:
        """A healing step on held ``partition_id`` (``Balancer.healed``): a HEAL event."""
        owner = self.owner_id
        self._emit(BalancerEvent(EventKind.HEAL, self.ref, partition_id, owner, owner, owner, reason, self.clock()))

    def _emit(self, event: BalancerEvent) -> None:
        self._events.append(event)
        if self.on_event is not None:
            self.on_event(event)


async def _attempt(errors: list[StoreError], awaitable: Awaitable[T]) -> T | None:
    """Await ``awaitable``; on a store error note it in ``errors`` and return None (the caller goes
    on with its other steps and raises the first error at the end)."""
    try:
        return await awaitable
    except StoreError as exc:
        errors.append(exc)
        return None


_IS_A_BALANCER: type[Balancer] = RaceCoordinator  # the type checker proves it satisfies the protocol
