"""What the parts of ``RaceCoordinator`` (``race``, ``race_notify``, ``race_steps``) share, for the
type checker only: the modules import it under ``TYPE_CHECKING`` and subclass ``object`` at run
time, so each part is checked against the whole without importing the others."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from balancer.coordinator import HandoffHook
from balancer.model import BalancerEvent, HubRef, OwnershipRecord
from balancer.protocol import OwnershipStore
from balancer.race.backend import Channel, RaceBackend
from balancer.race.times import GrabTimers, LoadWeights, RaceTimes

T = TypeVar("T")


class RaceState(Protocol):
    ref: HubRef
    owner_id: str
    store: OwnershipStore
    backend: RaceBackend
    times: RaceTimes
    load: LoadWeights | None
    rng: random.Random
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    on_handoff: HandoffHook | None
    _owned: dict[str, OwnershipRecord]
    _handing_off: set[str]
    _starting: set[str]
    _taking: asyncio.Lock
    _racing: dict[str, asyncio.Task[None]]
    _deciding: set[str]
    _background: set[asyncio.Task[Any]]
    _marks: dict[str, float]
    _timers: GrabTimers
    _timers_moved: asyncio.Event
    _timer_task: asyncio.Task[None] | None
    _last_grab: dict[str, float]
    _grab_seen: dict[str, str] | None
    _waiters: set[asyncio.Future[None]]
    _allocated: dict[str, asyncio.Event]
    _listener: asyncio.Task[None] | None
    _subscribed: bool
    _epoch: int
    _quiet_until: float
    _stopped: bool
    _drained: bool
    _pins: dict[str, str]
    _known: frozenset[str]
    _lock: asyncio.Lock

    def load_now(self) -> float: ...

    def _lose(self, pid: str, why: str) -> None: ...

    def _emit(self, event: BalancerEvent) -> None: ...

    def _failed(self, what: str, exc: BaseException) -> None: ...

    def _recovered(self, what: str) -> None: ...

    async def _store_call(self, awaitable: Awaitable[T]) -> T: ...

    def _deliver(self, channel: Channel, pid: str) -> None: ...

    async def _race(self, pid: str, heard: float) -> None: ...

    async def _clear_mark(self, pid: str) -> None: ...

    def _load_dropped(self) -> None: ...
