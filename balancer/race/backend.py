"""What the lease race of ``001_552f7490fd2b6e08.txt`` needs from its store, and an in-memory one.

Two hashes and two channels per hub and consumer group, nothing else (001: "any key value store
that provides publish and subscribe functionality should do"):

- hash ``allocation``: partition -> the node processing it (001's "lease allocation");
- hash ``grab``: partition -> the node that won the latest race for it (001's "lease grab");
- channel ``grab``: a partition's lease is challenged (001's "grab lease subscription");
- channel ``allocated``: a loser finished shutting a partition down (001's "allocated lease");

and the store's generation: a token the first subscriber after a start writes, so that a race
decided across a restart without persistence (which emptied the grab hash) is not won a second
time by a racer that has not yet noticed the restart (``grab``).

``RaceBackend`` is one node's connection to them; every call is one round trip and counts one in
``requests``. ``MemoryRaceHub`` holds the state in a process; each node talks to it through its own
``MemoryRaceBackend``, optionally with a network latency per call and per delivered message (the
simulator's). The Redis backend is ``balancer.race.redis``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from balancer.errors import StoreUnavailable
from balancer.model import HubRef

Hash = Literal["allocation", "grab"]
Channel = Literal["grab", "allocated"]
HASHES: tuple[Hash, Hash] = ("allocation", "grab")
CHANNELS: tuple[Channel, Channel] = ("grab", "allocated")
Deliver = Callable[[Channel, str], None]


class RaceBackend(Protocol):
    """One node's connection to the race's hashes and channels of one hub and consumer group.

    Every method raises StoreUnavailable when the store cannot be reached.
    """

    requests: int

    async def hgetall(self, hashes: tuple[Hash, ...]) -> dict[Hash, dict[str, str]]:
        """Every field of each of ``hashes``, read in one round trip."""

    async def hget(self, name: Hash, field: str) -> str | None:
        """The value of one field, None when it is not set."""

    async def hset(self, name: Hash, field: str, value: str) -> None:
        """Set one field, whatever it held."""

    async def hsetnx(self, name: Hash, field: str, value: str) -> str:
        """Set one field only if it is not set (Redis ``HSETNX``); return the value it holds
        afterwards: ``value`` if this call set it, else whoever set it first."""

    async def grab(self, partition_id: str, node: str, generation: str) -> str | None:
        """``hsetnx("grab", partition_id, node)`` while the store's generation is still ``generation``
        (the one this node subscribed in); None, and nothing written, when it restarted since."""

    async def hdel(self, name: Hash, field: str, expect: str | None = None) -> bool:
        """Delete one field (only while it holds ``expect``, when given); True if it was deleted."""

    async def publish(self, channel: Channel, partition_id: str) -> None:
        """Notify every subscriber of ``channel`` (fire and forget: a subscriber away misses it)."""

    async def listen(self, deliver: Deliver, ready: Callable[[str], None]) -> None:
        """Subscribe to both channels, call ``ready(generation)`` once subscribed (the store's
        generation, written first if none is), then ``deliver`` every message until cancelled.
        Raises StoreUnavailable when the subscription breaks."""


@dataclass
class MemoryRaceHub:
    """The race's hashes and subscribers, shared by the nodes of one process (or one simulation).

    ``down`` models an outage: calls raise and subscriptions break. ``flush()`` models a restart
    without persistence: both hashes are emptied, the generation is new and every subscription
    breaks (``subscriptions=False``: the restart the nodes have not noticed yet).
    """

    hashes: dict[tuple[HubRef, Hash], dict[str, str]] = field(default_factory=dict)
    subscribers: dict[HubRef, list[asyncio.Queue[tuple[Channel, str] | None]]] = field(default_factory=dict)
    down: bool = False
    published: int = 0
    generation: int = 0

    def table(self, ref: HubRef, name: Hash) -> dict[str, str]:
        return self.hashes.setdefault((ref, name), {})

    def break_subscriptions(self) -> None:
        for queues in self.subscribers.values():
            for queue in queues:
                queue.put_nowait(None)
            queues.clear()

    def flush(self, subscriptions: bool = True) -> None:
        """What a restart of a Redis without persistence does to the race."""
        self.hashes.clear()
        self.generation += 1
        if subscriptions:
            self.break_subscriptions()


class MemoryRaceBackend:
    """One node's connection to a ``MemoryRaceHub``.

    ``latency`` (seconds per round trip, drawn per call) is spent half on the way there and half
    on the way back; a published message reaches each subscriber after a one-way ``latency``
    of its own. Both run on the event loop's clock, so the simulator's loop makes them free.
    """

    def __init__(
        self,
        hub: MemoryRaceHub,
        ref: HubRef,
        latency: tuple[float, float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._hub = hub
        self._ref = ref
        self._latency = latency
        self._rng = rng or random.Random(0)
        self.requests = 0

    def _delay(self) -> float:
        if self._latency is None:
            return 0.0
        low, high = self._latency
        return self._rng.uniform(low, high)

    async def _travel(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds)

    def _check(self) -> None:
        if self._hub.down:
            raise StoreUnavailable("the in-memory race hub is marked down")

    async def _round_trip(self) -> float:
        """Count the request, travel there, and check the hub is up; the time left for the way back."""
        self.requests += 1
        half = self._delay() / 2
        await self._travel(half)
        self._check()
        return half

    async def hgetall(self, hashes: tuple[Hash, ...]) -> dict[Hash, dict[str, str]]:
        back = await self._round_trip()
        result = {name: dict(self._hub.table(self._ref, name)) for name in hashes}
        await self._travel(back)
        return result

    async def hget(self, name: Hash, field: str) -> str | None:
        back = await self._round_trip()
        value = self._hub.table(self._ref, name).get(field)
        await self._travel(back)
        return value

    async def hset(self, name: Hash, field: str, value: str) -> None:
        back = await self._round_trip()
        self._hub.table(self._ref, name)[field] = value
        await self._travel(back)

    async def hsetnx(self, name: Hash, field: str, value: str) -> str:
        back = await self._round_trip()
        holder = self._hub.table(self._ref, name).setdefault(field, value)
        await self._travel(back)
        return holder

    async def grab(self, partition_id: str, node: str, generation: str) -> str | None:
        back = await self._round_trip()
        same = generation == str(self._hub.generation)
        holder = self._hub.table(self._ref, "grab").setdefault(partition_id, node) if same else None
        await self._travel(back)
        return holder

    async def hdel(self, name: Hash, field: str, expect: str | None = None) -> bool:
        back = await self._round_trip()
        table = self._hub.table(self._ref, name)
        deleted = field in table and (expect is None or table[field] == expect)
        if deleted:
            del table[field]
        await self._travel(back)
        return deleted

    async def publish(self, channel: Channel, partition_id: str) -> None:
        back = await self._round_trip()
        self._hub.published += 1
        loop = asyncio.get_running_loop()
        for queue in list(self._hub.subscribers.get(self._ref, ())):
            delay = self._delay() / 2
            if delay > 0:
                loop.call_later(delay, queue.put_nowait, (channel, partition_id))
            else:
                queue.put_nowait((channel, partition_id))
        await self._travel(back)

    async def listen(self, deliver: Deliver, ready: Callable[[str], None]) -> None:
        await self._round_trip()
        queue: asyncio.Queue[tuple[Channel, str] | None] = asyncio.Queue()
        subscribers = self._hub.subscribers.setdefault(self._ref, [])
        subscribers.append(queue)
        try:
            ready(str(self._hub.generation))
            while True:
                message = await queue.get()
                if message is None:
                    raise StoreUnavailable("the in-memory race hub broke the subscription")
                deliver(*message)
        finally:
            if queue in subscribers:
                subscribers.remove(queue)
