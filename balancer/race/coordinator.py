"""``race``: the Redis lease race of ``001_552f7490fd2b6e08.txt``, as a coordinator.

001, step by step (numbers as in the document), for one node:

1. Per partition, a timer of one normal lease time (``RaceTimes``), reset whenever a grab
   notification for that partition is heard from anyone. When it fires and the partition is
   (a) not processed by this node and has no value in the grab hash, the node publishes a grab
   notification; (b) if the grab hash has held a value for longer than the maximum lease time
   since the last notification (a winner died between steps 3 and 6), the node first clears
   the partition's allocation and grab fields, then publishes.
2. Every node that hears a notification waits ``race_wait`` (``race_times``: (n - 1)·d for the
   owner, (n + 1/2)·d for the others, and why that reading) ...
3. ... then ``HSETNX`` the grab hash: the first to set it wins.
3b. An owner that did not win stops processing gracefully (``on_handoff``: the runtime stops the
   pump after the event in hand and its final checkpoint, then calls ``release``), clears its
   allocation field and publishes an allocated notification.
4. The winner reads the allocation hash: if another node is processing the partition, it waits
   for that node's allocated notification, at most the maximum shutdown time.
5. The winner marks the allocation hash with itself and starts processing.
6. After the minimum lease grab time the winner clears its grab mark, so the partition can be
   challenged again.

What 001 leaves open, and how it is closed here:

- Timers (``race_notify``) run in a task of their own. A partition's first timer fires at the
  same point of the first normal lease time on every node (a hash of its id, plus jitter), so
  challenges are spread over the lease time and a node that joins races for one partition at a
  time, each race seeing the counts the previous one left. (Random first timers would not do:
  the earliest of many nodes' timers fires near the start, and the partitions would be challenged
  all together, then again all together one lease time later.)
- Of several challenges heard at once, a node sends one HSETNX to take a partition at a time and
  reads its load again before each (``race_steps``): a win counts at once, so an idle node does
  not win every one of a burst of races with the same count.
- Pub/sub is fire and forget: a node that missed a notification never raced. Each cycle reads
  both hashes and repairs from them: a partition this node processes whose grab hash names
  another node was lost in a race it did not hear (step 3b, late); one whose allocation names
  another node is already processed there (stopped at once); one whose allocation field is
  empty (the store restarted without persistence) gets it back (``HSETNX``), so the race forms
  again around the same owners instead of moving partitions.
- A node only publishes while it is subscribed, and not for a short quiet time after it
  subscribed again, so that after a store restart nobody starts races that nodes still
  reconnecting cannot hear (they would lose partitions they process without a fair race). A race
  still waiting when the subscription broke is given up: the store may have restarted empty and
  lost the winner's grab mark, and a late HSETNX would win a second time.
- A loser's allocation field is cleared only while it still names the loser: after the maximum
  shutdown time the winner has already written it.
- Ownership records: checkpoints are fenced by the ownership store (``update_checkpoint`` checks
  the record's owner), and the dashboard shows owners from it. So a node that starts a partition
  also claims its ownership record (taking it from whoever held it: the race decided), renews
  the records it holds each cycle, and releases one when it hands the partition over. A record
  taken by someone else means this node lost the partition.
- ``holds()``: a node that has not reached the race store for the maximum shutdown time stops
  processing (it could not hear that it lost, and a winner starts after that time at the latest).
- Controls: a drained node never tries to win and challenges its own partitions so others take
  them; a partition pinned to a node is won by that node at once and tried by nobody else.
- A clean stop (``release_all``) clears this node's fields, releases its records and publishes a
  grab notification for each of its partitions, so they are raced for now, not a lease time later.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from balancer.coordinator import CycleReport, EventSink, HandoffHook, PartitionSource
from balancer.errors import StoreError
from balancer.model import BalancerEvent, Controls, EventKind, HubRef, Member, OwnershipRecord
from balancer.protocol import ControlStore, OwnershipStore, by_partition
from balancer.race.backend import RaceBackend
from balancer.race.notify import RaceNotifications
from balancer.race.steps import RaceSteps
from balancer.race.times import GrabTimers, LoadWeights, RaceTimes

log = logging.getLogger(__name__)
T = TypeVar("T")



class RaceCoordinator(RaceNotifications, RaceSteps):
    """One node of the lease race for one hub and consumer group.

    The runtime drives it like ``balancer.coordinator.Coordinator``: ``cycle()`` on its schedule,
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
        self.ref = ref
        self.owner_id = owner_id
        self.store = store
        self.backend = backend
        self.partitions = partitions
        self.times = times or RaceTimes()
        self.controls = controls
        self.on_event = on_event
        self.on_handoff = on_handoff
        self.load = load
        self.rng = rng or random.Random()
        self.clock = clock
        self.monotonic = monotonic
        self.expiry = self.times.maximum_shutdown  # the local lease: see holds()
        self._owned: dict[str, OwnershipRecord] = {}  # processing, with the ownership record held
        self._handing_off: set[str] = set()
        self._starting: set[str] = set()  # won, not processing yet (step 4)
        self._taking = asyncio.Lock()  # one HSETNX to take a partition at a time (see _decide)
        self._racing: dict[str, asyncio.Task[None]] = {}  # from the notification until started (step 5)
        self._deciding: set[str] = set()  # ... until the HSETNX has answered
        self._background: set[asyncio.Task[Any]] = set()  # mark clearing; releases without a runtime
        self._marks: dict[str, float] = {}  # grab marks this node set -> monotonic time to clear them
        self._timers = GrabTimers()
        self._timers_moved = asyncio.Event()  # a timer moved earlier: the timer task looks again
        self._timer_task: asyncio.Task[None] | None = None
        self._last_grab: dict[str, float] = {}  # monotonic time a grab notification was last heard
        self._grab_seen: dict[str, str] | None = None  # the grab hash as last read (and kept up locally)
        self._waiters: set[asyncio.Future[None]] = set()  # race waits to end early when the load drops
        self._allocated: dict[str, asyncio.Event] = {}
        self._contact: float | None = None  # monotonic time the last successful read was sent
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = False
        self._epoch = 0  # subscriptions lost so far
        self._quiet_until = 0.0
        self._stopped = False
        self._drained = False
        self._pins: dict[str, str] = {}
        self._known: frozenset[str] = frozenset()
        self._events: list[BalancerEvent] = []
        self._store_requests = 0
        self._failing: set[str] = set()  # what is failing now, each logged once
        # Ownership-record writes (start, renew, release) read and rewrite the lease table across
        # awaits; a release racing a renewal would lose to it. One at a time.
        self._lock = asyncio.Lock()

    # queries -------------------------------------------------------------------------------

    @property
    def owned(self) -> frozenset[str]:
        return frozenset(self._owned)

    @property
    def requests(self) -> int:
        """Round trips so far: the race store's and the ownership store's."""
        return self.backend.requests + self._store_requests

    def handing_off(self, partition_id: str) -> bool:
        """True from a lost race until ``release()``."""
        return partition_id in self._handing_off

    def holds(self, partition_id: str) -> bool:
        """True while this node processes ``partition_id`` and reached the race store recently."""
        contact = self._contact
        return (
            partition_id in self._owned
            and contact is not None
            and self.monotonic() - contact < self.times.maximum_shutdown
        )

    def deadline(self, partition_id: str) -> float:
        """The monotonic time from which ``holds(partition_id)`` is False unless the race's store is
        reached again meanwhile (-inf when not held)."""
        contact = self._contact
        if partition_id not in self._owned or contact is None:
            return -math.inf
        return contact + self.times.maximum_shutdown

    def load_now(self) -> float:
        """``n`` of the wait formula: partitions processing (not being handed off) or won and
        starting; or, load-weighted, their weights (a starting partition weighs the floor)."""
        mine = [p for p in self._owned if p not in self._handing_off] + sorted(self._starting)
        if self.load is None:
            return float(len(mine))
        return sum(self.load.weight(p) if p in self._owned else self.load.floor for p in mine)

    # the cycle -----------------------------------------------------------------------------

    async def cycle(self) -> CycleReport:
        """Read both hashes, repair from them, renew ownership records (grab timers and races run
        in tasks of their own, started by the first cycle).

        Raises StoreUnavailable (or StoreError) when a store fails; what is held is kept.
        """
        started = self.monotonic()
        before = self.requests
        self._start_tasks()
        pids = tuple(await self.partitions())
        self._known = frozenset(pids)
        sent = self.monotonic()
        state = await self.backend.hgetall(("allocation", "grab"))
        self._contact = sent
        allocation, grab = state["allocation"], state["grab"]
        self._grab_seen = dict(grab)
        self._add_timers(pids)
        if self.controls is not None:
            await self._controls(self.controls)
        if self.load is not None:
            self.load.sample(self._owned, self.monotonic())
        await self._repair(allocation, grab)
        async with self._lock:
            await self._renew()
        await self._clear_marks()
        events, self._events = self._events, []
        return CycleReport(
            owned=self.owned,
            gained=tuple(e for e in events if e.owner_id == self.owner_id),
            lost=tuple(e for e in events if e.owner_id != self.owner_id),
            requests=self.requests - before,
            seconds=self.monotonic() - started,
        )

    async def _controls(self, controls: ControlStore) -> None:
        await self._store_call(controls.heartbeat(Member(self.ref, self.owner_id, self.clock())))
        listed = await self._store_call(controls.list_controls(self.ref))
        standing = Controls.of(listed)
        drained = self.owner_id in standing.drained
        now = self.monotonic()
        if drained and not self._drained:  # challenge everything held now, so others take it
            for pid in self._owned:
                self._set_timer(pid, now)
        self._drained = drained
        pins = dict(standing.pins)
        for target, _ in set(pins.items()) ^ set(self._pins.items()):  # a new or moved pin: act on it now
            self._set_timer(target, now)
        self._pins = pins

    async def _repair(self, allocation: dict[str, str], grab: dict[str, str]) -> None:
        """Settle what pub/sub may have missed (see the module docstring)."""
        for pid in list(self._owned):
            if pid in self._handing_off or pid in self._deciding:
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

    async def _renew(self) -> None:
        """Renew every ownership record held; one taken by someone else is a lost partition."""
        if not self._owned:
            return
        won = by_partition(await self._store_call(self.store.claim_ownership(list(self._owned.values()))))
        failed = [p for p in self._owned if p not in won]
        if failed:
            listed = by_partition(await self._store_call(self.store.list_ownership(self.ref)))
            again: list[OwnershipRecord] = []
            for pid in failed:
                current = listed.get(pid)
                if current is None:  # the store lost it (restart without persistence): claim it anew
                    again.append(OwnershipRecord(self.ref, pid, self.owner_id))
                elif current.owner_id == self.owner_id:
                    again.append(current)
                else:
                    self._drop(pid, current.owner_id or None, f"ownership record taken by {current.owner_id!r}")
            if again:
                won.update(by_partition(await self._store_call(self.store.claim_ownership(again))))
        for pid in list(self._owned):
            if pid in won:
                self._owned[pid] = won[pid]
            else:
                self._drop(pid, None, "ownership record could not be renewed")

    async def _clear_marks(self) -> None:
        """Step 6 for marks whose race task could not clear them (a store error, a stop)."""
        now = self.monotonic()
        for pid, due in list(self._marks.items()):
            if due + self.times.leases_held_delay <= now and pid not in self._racing:
                await self._clear_mark(pid)

    async def adopt(self, pids: Sequence[str], reason: str = "adopted") -> None:
        """Process ``pids`` as if this node had won their races (restoring a known state, such as
        the simulator's balanced start): allocation marked, ownership records taken."""
        for pid in pids:
            await self.backend.hset("allocation", pid, self.owner_id)
            async with self._lock:
                record = await self._claim_record(pid)
            if record is not None:
                self._owned[pid] = record
                self._emit(BalancerEvent(EventKind.CLAIM, self.ref, pid, self.owner_id, None, self.owner_id, reason,
                                         self.clock()))

    # losing --------------------------------------------------------------------------------

    def _lose(self, pid: str, why: str) -> None:
        """Step 3b: shut the partition down gracefully, then ``release`` it."""
        if pid in self._handing_off or pid not in self._owned:
            return
        self._handing_off.add(pid)
        self._load_dropped()
        log.debug("%s: partition %s: lost the lease race: %s; shutting it down", self.owner_id, pid, why)
        if self.on_handoff is not None:
            self.on_handoff(pid)
        else:
            task = asyncio.get_running_loop().create_task(self.release(pid, why))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _drop(self, pid: str, holder: str | None, why: str) -> None:
        """Stop processing at once: someone else already processes the partition."""
        if self._owned.pop(pid, None) is None:
            return
        self._handing_off.discard(pid)
        self._load_dropped()
        event = BalancerEvent(EventKind.LOST, self.ref, pid, holder, self.owner_id, self.owner_id, why, self.clock())
        self._emit(event)

    async def release(self, partition_id: str, reason: str = "handed off") -> BalancerEvent | None:
        """Step 3b's end: release the record, clear the allocation field, publish allocated.

        None if the partition was not held. Raises the first store error (after trying every step).
        """
        async with self._lock:
            record = self._owned.pop(partition_id, None)
            self._handing_off.discard(partition_id)
            if record is None:
                return None
            errors: list[StoreError] = []
            release = self.store.claim_ownership([replace(record, owner_id="")])
            released = await self._attempt(errors, self._store_call(release))
            await self._attempt(errors, self.backend.hdel("allocation", partition_id, expect=self.owner_id))
            await self._attempt(errors, self.backend.publish("allocated", partition_id))
        kind = EventKind.RELEASE if released else EventKind.LOST
        why = reason if released else "ownership record taken before the release"
        event = BalancerEvent(kind, self.ref, partition_id, None, self.owner_id, self.owner_id, why, self.clock())
        self._emit(event)
        if errors:
            raise errors[0]
        return event

    async def release_all(self, reason: str = "shutting down") -> list[BalancerEvent]:
        """Stop racing, release everything, and challenge each released partition so that others
        race for it now. Raises the first store error (after trying every step)."""
        self._stopped = True
        tasks = [t for t in (self._listener, self._timer_task, *self._racing.values(), *self._background) if t]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        errors: list[StoreError] = []
        events: list[BalancerEvent] = []
        async with self._lock:
            held = dict(self._owned)
            self._owned.clear()
            self._handing_off.clear()
            released: list[OwnershipRecord] = []
            if held:
                records = [replace(r, owner_id="") for r in held.values()]
                released = await self._attempt(errors, self._store_call(self.store.claim_ownership(records))) or []
            won = by_partition(released)
            for pid in sorted(held, key=int):
                await self._attempt(errors, self.backend.hdel("allocation", pid, expect=self.owner_id))
            for pid in sorted(set(self._marks) | self._starting, key=int):
                await self._attempt(errors, self.backend.hdel("grab", pid, expect=self.owner_id))
            self._marks.clear()
            for pid in sorted(held, key=int):
                await self._attempt(errors, self.backend.publish("allocated", pid))
                await self._attempt(errors, self.backend.publish("grab", pid))
                kind = EventKind.RELEASE if pid in won else EventKind.LOST
                why = reason if pid in won else "ownership record taken before the release"
                events.append(BalancerEvent(kind, self.ref, pid, None, self.owner_id, self.owner_id, why, self.clock()))
            if self.controls is not None:
                await self._attempt(errors, self._store_call(self.controls.remove_member(self.ref, self.owner_id)))
        for event in events:
            self._emit(event)
        if errors:
            raise errors[0]
        return events

    def abort(self) -> list[asyncio.Task[None]]:
        """What a crash leaves behind: every task cancelled, nothing released (tests, simulator).
        Returns the cancelled tasks (await them to be sure they are done)."""
        self._stopped = True
        tasks = [t for t in (self._listener, self._timer_task, *self._racing.values(), *self._background) if t]
        for task in tasks:
            task.cancel()
        return tasks

    # helpers -------------------------------------------------------------------------------

    async def _store_call(self, awaitable: Awaitable[T]) -> T:
        self._store_requests += 1
        return await awaitable

    @staticmethod
    async def _attempt(errors: list[StoreError], awaitable: Awaitable[T]) -> T | None:
        try:
            return await awaitable
        except StoreError as exc:
            errors.append(exc)
            return None

    def _emit(self, event: BalancerEvent) -> None:
        self._events.append(event)
        if self.on_event is not None:
            self.on_event(event)

    def _failed(self, what: str, exc: BaseException) -> None:
        if what not in self._failing:
            self._failing.add(what)
            log.warning("%s: race %s failed: %s: %s; retrying", self.owner_id, what, type(exc).__name__, exc)

    def _recovered(self, what: str) -> None:
        if what in self._failing:
            self._failing.discard(what)
            log.warning("%s: race %s works again", self.owner_id, what)
