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

- Timers are checked at each ``cycle()`` (the runtime calls it every ``--interval`` seconds), so a
  notification goes out within one interval of its time. A node's first timer of each partition
  fires at a random point of its first normal lease time: a node that joins then races for one
  partition at a time and each race sees the counts the previous one left (all at once, every
  race would see the joiner empty and it would win them all, then lose them all back).
- Pub/sub is fire and forget: a node that missed a notification never raced. Each cycle reads
  both hashes and repairs from them: a partition this node processes whose grab hash names
  another node was lost in a race it did not hear (step 3b, late); one whose allocation names
  another node is already processed there (stopped at once); one whose allocation field is
  empty (the store restarted without persistence) gets it back (``HSETNX``), so the race forms
  again around the same owners instead of moving partitions.
- A node only publishes while it is subscribed, and for a short quiet time after it subscribed
  again, so that after a store restart nobody starts races that nodes still reconnecting cannot
  hear (they would lose partitions they process without a fair race).
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
import contextlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from .coordinator import CycleReport, EventSink, HandoffHook, PartitionSource
from .errors import StoreError
from .model import BalancerEvent, ControlKind, EventKind, HubRef, Member, OwnershipRecord, check_partition_id
from .race_backend import Channel, RaceBackend
from .race_times import GrabTimers, LoadWeights, RaceTimes, race_wait
from .store import ControlStore, OwnershipStore, by_partition

log = logging.getLogger(__name__)
T = TypeVar("T")

RESUBSCRIBE_QUIET = 2.0  # seconds without publishing after a subscription came back (> the backoff cap)
BACKOFF_CAP = 1.0
# Times closer than this count as now: asyncio runs a timer that is due within its clock resolution
# at once, and a wait for less than one float step of the clock would never end.
EPSILON = 1e-6


class RaceCoordinator:
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
        drained = any(c.kind is ControlKind.DRAIN and c.target == self.owner_id for c in listed)
        now = self.monotonic()
        if drained and not self._drained:  # challenge everything held now, so others take it
            for pid in self._owned:
                self._set_timer(pid, now)
        self._drained = drained
        pins = {c.target: c.value for c in listed if c.kind is ControlKind.PIN}
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

    # grab timers (step 1) ------------------------------------------------------------------

    def _add_timers(self, pids: Sequence[str]) -> None:
        """A first timer for each partition not seen before, at a random point of a normal lease time."""
        now = self.monotonic()
        for pid in pids:
            if pid not in self._timers:
                self._last_grab.setdefault(pid, now)
                self._set_timer(pid, now + self.rng.uniform(0, self.times.normal_lease))

    def _set_timer(self, pid: str, at: float) -> None:
        head = self._timers.next_at()
        self._timers.set(pid, at)
        if head is None or at < head:
            self._timers_moved.set()

    def _arm(self, pid: str, now: float) -> None:
        """The next timer of ``pid``: one normal lease time (plus jitter) from ``now``."""
        self._set_timer(pid, now + self.times.normal_lease * (1 + self.rng.uniform(0, self.times.jitter)))

    async def _run_timers(self) -> None:
        """Fire grab timers when they are due (a task: notifications go out on time, not per cycle)."""
        while not self._stopped:
            for pid in self._timers.pop_due(self.monotonic() + EPSILON):
                try:
                    await self._fire(pid)
                except StoreError as exc:
                    self._failed("grab notification", exc)
                    self._set_timer(pid, self.monotonic() + self._retry_in())
                else:
                    self._recovered("grab notification")
            head = self._timers.next_at()
            self._timers_moved.clear()
            timeout = None if head is None else max(0.0, head - self.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._timers_moved.wait(), timeout)

    def _retry_in(self) -> float:
        """How soon to look at a timer again that could not act now (the jitter window)."""
        return max(self.times.normal_lease * self.times.jitter, self.times.leases_held_delay)

    async def _fire(self, pid: str) -> None:
        """Step 1 for one partition whose timer fired (see the module docstring)."""
        now = self.monotonic()
        grab = self._grab_seen
        if not self._subscribed or now < self._quiet_until or grab is None:
            self._set_timer(pid, max(now + self._retry_in(), self._quiet_until))  # we would not hear our race
            return
        pin = self._pins.get(pid)
        elsewhere = pin is not None and pin != self.owner_id
        if pid in self._owned or pid in self._starting:
            # a drained owner, or one holding a partition pinned elsewhere, asks others to take it
            candidate = pid not in self._handing_off and (elsewhere or (self._drained and pin is None))
        else:  # only the pinned node challenges a pinned partition; a drained node nothing
            candidate = not elsewhere and not (self._drained and pin is None)
        if not candidate or pid in self._racing or (self._known and pid not in self._known):
            self._arm(pid, now)
            return
        if grab.get(pid) == self.owner_id and pid in self._owned:
            # our own mark from a race we won: we want out now, not after the minimum lease grab time
            await self._clear_mark(pid)
        if pid not in grab:
            await self._publish_grab(pid, now)
        elif now - self._last_grab.get(pid, now) > self.times.maximum_lease:
            # (b): the winner died between steps 3 and 6. Allocation first: while the grab mark
            # stands nobody can win, so no new allocation can be wiped by this.
            log.warning(
                "%s: partition %s: grab mark of %s is older than the maximum lease time (%gs); clearing it",
                self.owner_id, pid, grab[pid], self.times.maximum_lease,
            )
            await self.backend.hdel("allocation", pid)
            if await self.backend.hdel("grab", pid, expect=grab[pid]):
                grab.pop(pid, None)
                await self._publish_grab(pid, now)
            else:
                self._arm(pid, now)
        else:  # a race is on (or our view is a little old): look again soon
            self._set_timer(pid, now + self._retry_in())

    async def _publish_grab(self, pid: str, now: float) -> None:
        self._arm(pid, now)
        await self.backend.publish("grab", pid)

    # notifications -------------------------------------------------------------------------

    def _start_tasks(self) -> None:
        if self._listener is None and not self._stopped:
            loop = asyncio.get_running_loop()
            self._listener = loop.create_task(self._listen(), name=f"race listener {self.owner_id}")
            self._timer_task = loop.create_task(self._run_timers(), name=f"race timers {self.owner_id}")

    async def _listen(self) -> None:
        """Keep the subscription up; back off (up to a second) while the store is away."""
        delay = 0.05
        first = True
        while not self._stopped:

            def ready() -> None:
                nonlocal delay, first
                self._subscribed = True
                if not first:
                    self._quiet_until = self.monotonic() + RESUBSCRIBE_QUIET
                    log.info("%s: race subscription is back", self.owner_id)
                first = False
                delay = 0.05
                self._recovered("subscription")

            try:
                await self.backend.listen(self._deliver, ready)
            except StoreError as exc:
                self._failed("subscription", exc)
            except Exception as exc:  # a bug must not end the subscription for good
                log.exception("%s: race subscription failed", self.owner_id)
                self._failed("subscription", exc)
            self._subscribed = False
            self._epoch += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_CAP)

    def _deliver(self, channel: Channel, pid: str) -> None:
        try:
            check_partition_id(pid)
        except ValueError:
            log.warning("%s: ignored a %s notification for %r: not a partition id", self.owner_id, channel, pid)
            return
        if channel == "allocated":
            event = self._allocated.get(pid)
            if event is not None:
                event.set()
            return
        now = self.monotonic()
        self._last_grab[pid] = now
        self._arm(pid, now)  # step 2: the timer is reset on receipt
        if self._stopped or pid in self._racing or (self._known and pid not in self._known):
            return  # one race at a time per partition: a second notification joins the first
        task = asyncio.get_running_loop().create_task(self._race(pid, now), name=f"race {self.owner_id} {pid}")
        self._racing[pid] = task
        task.add_done_callback(lambda done: self._race_done(pid, done))

    def _race_done(self, pid: str, task: asyncio.Task[None]) -> None:
        if self._racing.get(pid) is task:
            del self._racing[pid]
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            assert exc is not None
            if isinstance(exc, StoreError):
                self._failed("race", exc)
            else:
                log.error("%s: race for partition %s failed", self.owner_id, pid, exc_info=exc)

    # one race ------------------------------------------------------------------------------

    async def _race(self, pid: str, heard: float) -> None:
        """Steps 2 to 6 for one notification."""
        pin = self._pins.get(pid)
        if (pin is not None and pin != self.owner_id) or (self._drained and pin != self.owner_id):
            return  # never takes it; if it holds it, the next cycle sees who won (step 3b, late)
        self._deciding.add(pid)
        try:
            decided = await self._decide(pid, heard, pin == self.owner_id)
        finally:
            self._deciding.discard(pid)
        if decided is None:
            return
        winner, waited = decided
        self._recovered("race")
        if self._grab_seen is not None:
            self._grab_seen[pid] = winner
        if winner != self.owner_id:
            if pid in self._owned and pid not in self._handing_off:
                self._lose(pid, f"{winner} won the race (this node waited {waited:.2f}s)")
            return
        self._marks[pid] = self.monotonic() + self.times.minimum_lease_grab
        if pid in self._owned and pid not in self._handing_off:
            await self._keep(pid)
        else:
            await self._take(pid, waited)
        task = asyncio.get_running_loop().create_task(self._clear_mark_later(pid))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _clear_mark_later(self, pid: str) -> None:
        """Step 6: after the minimum lease grab time (and not before the winner has started)."""
        await asyncio.sleep(max(0.0, self._marks.get(pid, 0.0) - self.monotonic()))
        with contextlib.suppress(StoreError):  # the cycle tries again (``_clear_marks``)
            await self._clear_mark(pid)

    async def _clear_mark(self, pid: str) -> None:
        """Delete this node's grab mark of ``pid`` (only ours: a newer winner's stays)."""
        await self.backend.hdel("grab", pid, expect=self.owner_id)
        self._marks.pop(pid, None)
        if self._grab_seen is not None and self._grab_seen.get(pid) == self.owner_id:
            del self._grab_seen[pid]

    async def _decide(self, pid: str, heard: float, pinned_here: bool) -> tuple[str, float] | None:
        """Steps 2 and 3: wait ``race_wait`` from when the notification was heard, then HSETNX.
        Returns (the winner, seconds waited), or None when this node did not try.

        The load is read again whenever the wait ends, and a node sends one HSETNX to take a
        partition at a time: of several challenges heard at once, each attempt sees the answer of
        the one before (a win counts at once), instead of all of them going out at the same instant
        with the same count (one idle node would then win every one of them). An owner defending
        its partition does not queue behind its own attempts to take others.
        """
        epoch = self._epoch
        while True:
            owner = pid in self._owned and pid not in self._handing_off
            left = heard + self._wait(pid, owner, pinned_here) - self.monotonic()
            if left > EPSILON:
                await self._sleep_unless_load_drops(left)
                continue
            waited = self.monotonic() - heard
            if waited > self.times.wait_cap + self.times.leases_held_delay / 2:
                log.warning("%s: partition %s: woke too late to race (%.2fs)", self.owner_id, pid, waited)
                return None
            if epoch != self._epoch:
                # The subscription broke while we waited: the store may have restarted and lost the
                # winner's grab mark, and a late HSETNX would win a second race. Let this one go.
                return None
            if owner:
                return await self.backend.hsetnx("grab", pid, self.owner_id), waited
            async with self._taking:
                if heard + self._wait(pid, False, pinned_here) - self.monotonic() > EPSILON:
                    continue  # an attempt before this one won: this node is busier now
                winner = await self.backend.hsetnx("grab", pid, self.owner_id)
                if winner == self.owner_id:
                    self._starting.add(pid)  # counted from the answer on, before it is processed
                return winner, waited

    def _wait(self, pid: str, owner: bool, pinned_here: bool) -> float:
        if pinned_here:
            return 0.0
        challenged = (self.load.weight(pid) if self.load is not None else 1.0) if owner else None
        return race_wait(self.load_now(), challenged, self.times)

    async def _sleep_unless_load_drops(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if this node's load drops meanwhile (a loss shortens waits)."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(seconds, _resolve, woken)
        self._waiters.add(woken)
        try:
            await woken
        finally:
            timer.cancel()
            self._waiters.discard(woken)

    def _load_dropped(self) -> None:
        for waiter in self._waiters:
            _resolve(waiter)

    async def _keep(self, pid: str) -> None:
        """Steps 4 and 5 for a winner that already processes the partition."""
        holder = await self.backend.hget("allocation", pid)
        if holder == self.owner_id:
            return
        if holder is not None:  # a node this one never heard of believes it processes it
            await self._await_allocated(pid)
        await self.backend.hset("allocation", pid, self.owner_id)

    async def _take(self, pid: str, wait: float) -> None:
        """Steps 4 and 5: wait for the previous processor, mark the allocation, take the record."""
        try:
            event = self._allocated.setdefault(pid, asyncio.Event())
            event.clear()  # before reading: a notice sent after the read is not missed
            holder = await self.backend.hget("allocation", pid)
            handed = True
            if holder is not None and holder != self.owner_id:
                handed = await self._await_allocated(pid)
            await self.backend.hset("allocation", pid, self.owner_id)
            async with self._lock:
                record = await self._claim_record(pid)
                if record is None or self._stopped:
                    await self.backend.hdel("allocation", pid, expect=self.owner_id)
                    return
                self._owned[pid] = record
        finally:
            self._starting.discard(pid)
            self._allocated.pop(pid, None)
            if pid not in self._owned:
                self._load_dropped()
        if holder is None or holder == self.owner_id:
            kind, why = EventKind.CLAIM, "won the lease race; nobody was processing it"
        elif handed:
            kind, why = EventKind.STEAL, f"won the lease race; {holder} shut it down and handed it over"
        else:
            kind = EventKind.EXPIRE
            why = f"won the lease race; {holder} did not hand it over within {self.times.maximum_shutdown:g}s"
        why += f" (waited {wait:.2f}s)"
        self._emit(BalancerEvent(kind, self.ref, pid, self.owner_id, holder, self.owner_id, why, self.clock()))

    async def _await_allocated(self, pid: str) -> bool:
        """Wait for the allocated notice of ``pid``; False when the maximum shutdown time passed first."""
        event = self._allocated.setdefault(pid, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), self.times.maximum_shutdown)
        except TimeoutError:
            return False
        return True

    async def _claim_record(self, pid: str) -> OwnershipRecord | None:
        """The partition's ownership record, taken over whoever holds it (the race decided)."""
        for _ in range(4):
            listed = by_partition(await self._store_call(self.store.list_ownership(self.ref)))
            current = listed.get(pid)
            request = current.claimed_by(self.owner_id) if current else OwnershipRecord(self.ref, pid, self.owner_id)
            won = await self._store_call(self.store.claim_ownership([request]))
            if won:
                return won[0]
        log.warning("%s: partition %s: its ownership record kept changing; not taken", self.owner_id, pid)
        return None

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
        log.info("%s: partition %s: lost the lease race: %s; shutting it down", self.owner_id, pid, why)
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


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
