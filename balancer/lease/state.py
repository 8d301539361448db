"""What one worker's lease coordinator is built with and what it keeps between calls.

``LeaseState`` holds the constructor's arguments and the coordinator's own state, and answers the
queries a pump asks per event (``holds``, ``deadline``). The rooms beside it add behaviour to it:
stamping, liveness, the writes, renewal, the read, handoffs and the cycle (``balancer.lease``).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from balancer import load
from balancer.changes import OwnershipTable
from balancer.model import Control, HubRef, Member, OwnershipRecord
from balancer.notices import Released
from balancer.protocol import CheckpointStore, ControlStore, EventSink, HandoffHook, OwnershipStore, PartitionSource
from balancer.strategies import Plan, Strategy

from .options import CLOCK_RENEW_SHARE, RENEW_SHARE, STALE_MAX, STALE_SHARE


@dataclass
class Lease:
    record: OwnershipRecord
    renewed_at: float  # local monotonic time the winning request was *sent*
    # A stolen lease: the local monotonic time before which the worker it was taken from may still
    # hold it by its own clock (see ``Writes._apply``); nothing is handled before then.
    fenced_until: float = -math.inf


@dataclass(frozen=True, slots=True)
class Settled:
    """What a cycle read when its plan came out empty with every partition held (``Strategy.settles``):
    the next cycle skips its plan if it reads the same and nothing else changed (``steady_cycles``)."""

    partition_ids: tuple[str, ...]
    members: tuple[Member, ...]
    controls: tuple[Control, ...]
    holders: frozenset[str]  # the members that held a live lease
    leases: frozenset[str]  # what this worker held


NOTHING = Plan()


@dataclass
class LeaseState:
    """One worker's lease coordinator for one hub and consumer group: its arguments and its state."""

    ref: HubRef
    owner_id: str
    store: OwnershipStore
    partitions: PartitionSource
    strategy: Strategy
    expiry: float = 60.0
    controls: ControlStore | None = None
    on_event: EventSink | None = None
    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], float] = time.time  # the worker's wall clock (strategies that use it)
    monotonic: Callable[[], float] = time.monotonic  # for the local lease deadline
    etag_retries: int = 3
    # Called with a partition id when a planned move starts: the runtime stops that partition's pump
    # after the event in hand, checkpoints, then calls ``release()``. None: the driver's hook, if it
    # gives one with each cycle (``Driver.on_handoff``), else release in the same cycle.
    on_handoff: HandoffHook | None = None
    handoff_timeout: float | None = None  # None: the expiry
    interval: float | None = None  # seconds between the driver's cycles (None: unknown)
    # Told the partitions this worker has just released (won releases only), so the worker waiting
    # for them hears of it at once (``balancer.notices``) instead of at its next cycle.
    on_released: Callable[[Released], None] | None = None
    # Where a load-weighted strategy (``Strategy.uses_load``) reads the checkpoints it measures rates
    # from (``balancer.load``); None: the ownership store, if it keeps checkpoints too.
    checkpoints: CheckpointStore | None = None
    # The driver calls ``renew()`` at ``next_renewal()`` between cycles: leases are renewed when
    # ``renew_share`` of the expiry has passed (see RENEW_SHARE), by those steps and by any cycle that
    # finds one due. False: as the driver says with each call (``Driver.renewal_steps``); a driver that
    # says nothing has cycles alone renew, each lease in the last cycle that is safely early.
    renewal_steps: bool = False
    # None: RENEW_SHARE, or CLOCK_RENEW_SHARE for a strategy that judges expiry by the worker's own clock.
    renew_share: float | None = None
    # A steady cycle skips the plan: with a strategy whose plan ``settles``, when the last plan was
    # empty with every partition held, and this cycle's read (a quiet delta: ``STALE_SHARE``) listed
    # no ownership record and the same members, controls and partitions, while this worker holds
    # what it held, waits for nothing and hands nothing off, and no cycle failed within the expiry.
    # Nothing the plan reads then changed but the clock, and no age crossed the expiry: every record
    # the delta left out was written within ``stale_after``. At 1024 partitions the plan and the
    # view's judgement of every record were most of an idle worker's CPU. False: plan every cycle.
    steady_cycles: bool = True
    # Tell the others when this worker joins (after its first cycle): a notice naming no partition
    # (``on_released``), which a worker waiting quietly (``quiet_until``) hears as news. Off where
    # nobody waits quietly (no notices across processes).
    announce_joining: bool = False
    _leases: dict[str, Lease] = field(default_factory=dict, init=False)
    _requests: int = field(default=0, init=False)
    _announced: bool = field(default=False, init=False)
    _proven: bool = field(default=False, init=False)  # it has run a cycle after its announcing one
    # After the first cycle, while this worker holds nothing: (local monotonic time it stops looking,
    # the members its last read found). A cycle that finds workers joined since only announces again.
    _settle: tuple[float, frozenset[str]] | None = field(default=None, init=False)
    _joined: float | None = field(default=None, init=False)  # the store's clock at its first heartbeat
    _waiting: dict[str, float] = field(default_factory=dict, init=False)
    _waiting_on: dict[str, str] = field(default_factory=dict, init=False)  # partition -> the holder waited for
    # Local monotonic send time of the last write that showed this worker alive to the others (a
    # heartbeat, a won claim or renewal). A gap longer than the expiry restarts every handoff wait.
    _proved_at: float | None = field(default=None, init=False)
    _rebalance_token: str | None = field(default=None, init=False)
    _rebalance: bool = field(default=False, init=False)
    _handing_off: set[str] = field(default_factory=set, init=False)
    # Dark time: spans on the view's clock between the last view read before a failed cycle and the
    # next one read after it. Nobody could renew then, so they do not age records (View.dark).
    _dark: list[tuple[float, float]] = field(default_factory=list, init=False)
    _last_view: float | None = field(default=None, init=False)
    _failed: bool = field(default=False, init=False)
    # (store time, local monotonic time) of the latest store clock reading: events are stamped with
    # the store's clock from it, whatever this worker's own clock says.
    _anchor: tuple[float, float] | None = field(default=None, init=False)
    _previous: dict[str, str] = field(default_factory=dict, init=False)  # the last active owner seen
    # cycle(), release() and release_all() each read and rewrite the lease table across awaits: a
    # release sent while a cycle's renewal is in flight would lose to it (the renewal moves the ETag)
    # and leave the store saying we own a partition we have forgotten. One at a time, then.
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    _heartbeat_at: float | None = field(default=None, init=False)  # local monotonic time of the last one
    # This worker's copy of the ownership table, kept current from what changed (``balancer.changes``)
    # on a store that can say; read in full at least once an expiry, as a safety net.
    _table: OwnershipTable = field(default_factory=lambda: OwnershipTable(60.0), init=False)
    # This cycle's read left renewals out (``View.fresh_after``, ``View.exact``); None: it did not.
    _fresh_after: float | None = field(default=None, init=False)
    _exact: frozenset[str] = field(default=frozenset(), init=False)
    _rows: int = field(default=0, init=False)  # ownership records read in this cycle
    _meter: load.RateMeter = field(default_factory=load.RateMeter, init=False)
    _published: dict[str, float] = field(default_factory=dict, init=False)  # rates in this worker's member info
    _retry_at: float | None = field(default=None, init=False)  # local monotonic time to retry a failed renewal
    _renew_failures: int = field(default=0, init=False)  # failed renewals in a row
    _settled: Settled | None = field(default=None, init=False)
    _partition_ids: tuple[str, ...] | None = field(default=None, init=False)  # what the last cycle read
    _quiet_empty: bool = field(default=False, init=False)  # this cycle's read: a quiet delta that listed nothing
    _read: tuple[tuple[Member, ...], tuple[Control, ...], frozenset[str]] | None = field(default=None, init=False)
    _steady: bool = field(default=False, init=False)  # this cycle skips its plan
    _read_at: float | None = field(default=None, init=False)  # local monotonic time the last read was sent
    # Partitions given up (``give_up``) -> the local monotonic time until which this worker takes none
    # of them; and those its last heartbeat named (a change makes a heartbeat due: ``balancer.avoid``).
    _avoid: dict[str, float] = field(default_factory=dict, init=False)
    _avoid_said: frozenset[str] = field(default=frozenset(), init=False)

    def __post_init__(self) -> None:
        if self.renew_share is None:
            self.renew_share = RENEW_SHARE if self.strategy.store_clock else CLOCK_RENEW_SHARE
        if not 0 < self.renew_share < 1:  # also refuses NaN
            raise ValueError(
                f"renew_share is the share of the lease expiry after which a lease is renewed: more than 0 "
                f"and less than 1, got {self.renew_share!r}"
            )
        self._table.resync_after = self.expiry
        if self.controls is None and self.strategy.uses_members and isinstance(self.store, ControlStore):
            self.controls = self.store
        if self.checkpoints is None and self.strategy.uses_load and isinstance(self.store, CheckpointStore):
            self.checkpoints = self.store
        if self.interval is not None:  # a rate spans three cycles' checkpoints, and half a minute at least
            self._meter.window = max(3 * self.interval, self._meter.window)

    # queries -------------------------------------------------------------------------------

    @property
    def share(self) -> float:
        """The share of the expiry after which a lease is renewed (``renew_share``, as decided)."""
        assert self.renew_share is not None  # decided in __post_init__
        return self.renew_share

    @property
    def owned(self) -> frozenset[str]:
        return frozenset(self._leases)

    def avoiding(self) -> frozenset[str]:
        """The partitions this worker gave up and will not take for now (``give_up``)."""
        now = self.monotonic()
        for pid in [p for p, until in self._avoid.items() if until <= now]:
            del self._avoid[pid]
        return frozenset(self._avoid)

    def handing_off(self, partition_id: str) -> bool:
        """True once a planned move of ``partition_id`` started and until it is released."""
        return partition_id in self._handing_off

    def holds(self, partition_id: str) -> bool:
        """True while this worker owns ``partition_id`` and its lease cannot have expired yet.

        Judged on the local monotonic clock from the moment the last winning claim or renewal was
        sent, so a worker that was stopped (SIGSTOP, a long GC pause) knows on waking, before it
        touches another event, that someone else may hold the partition now.

        False too while a stolen lease is fenced: the worker it was taken from may still handle
        events until its own lease deadline, which it judges by its own clock and cannot have set
        later than one expiry after this worker's steal came back (``Lease.fenced_until``).
        """
        lease = self._leases.get(partition_id)
        if lease is None:
            return False
        now = self.monotonic()
        return lease.fenced_until <= now and now - lease.renewed_at < self.expiry

    def fenced_until(self) -> float | None:
        """The latest local monotonic time a stolen lease is fenced until, if one still is, else None."""
        now = self.monotonic()
        fences = [lease.fenced_until for lease in self._leases.values() if lease.fenced_until > now]
        return max(fences, default=None)

    def deadline(self, partition_id: str) -> float:
        """The local monotonic time from which ``holds(partition_id)`` is False unless renewed meanwhile
        (-inf when not held): lets a pump check its lease per event with one clock read."""
        lease = self._leases.get(partition_id)
        return -math.inf if lease is None else lease.renewed_at + self.expiry

    def _stale_after(self) -> float:
        """Seconds without a write after which the change feed lists a record (see STALE_SHARE)."""
        return self.expiry * min(STALE_MAX, max(STALE_SHARE, self.share + 0.1))
