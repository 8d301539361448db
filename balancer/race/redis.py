"""The lease race's hashes and channels in Redis (001's own store), for ``balancer.race.coordinator``.

Keys and channels sit under the hub and consumer group's scope (``balancer.stores.redis.layout.scope``,
the same hash tag as the store's keys), so one scope is one cluster slot and nothing outside it is
touched::

    leaseboard:{<namespace>/<hub>/<consumer group>}:race:allocation      hash  partition -> node
    leaseboard:{...}:race:grab                                          hash  partition -> node
    leaseboard:{...}:race:grab-lease                                    channel
    leaseboard:{...}:race:allocated-lease                               channel
    leaseboard:{...}:race:generation                                    string  a token per server start

``HSETNX`` and the read of the winner go in one ``MULTI``; a delete that must only remove this
node's own value is a Lua compare-and-delete; a race's ``HSETNX`` is a Lua script that first
compares the generation (``SET NX`` by the first subscriber after a start: a restart without
persistence empties it with the hashes). The subscription has a connection of its own,
without retries: when it breaks, ``listen`` raises and the coordinator subscribes again (and
knows it may have missed notifications).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from balancer.aio import stop_if_cancelled, within
from balancer.model import HubRef
from balancer.race.backend import Channel, Deliver, Hash
from balancer.stores.redis.connection import Connection
from balancer.stores.redis.layout import scope
from balancer.stores.redis.notices import CLOSE, close_subscription
from balancer.stores.redis.store import RedisStore

# KEYS: one hash. ARGV: field, value. Deletes the field only while it holds the value.
DELETE_IF = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
"""
# KEYS: the generation. ARGV: a new token. The generation, written first if there is none.
GENERATION = """
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
"""
# KEYS: the grab hash, the generation. ARGV: partition, node, generation. HSETNX, then who holds the
# field; nil (nothing written) when the generation is not ARGV[3]: the server restarted since.
GRAB_IF = """
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return false end
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
return redis.call('HGET', KEYS[1], ARGV[1])
"""
_ERRORS = (RedisConnectionError, RedisTimeoutError, ResponseError, OSError)


class RedisRaceBackend:
    """One node's connection to the race of ``ref`` on the Redis of ``store``."""

    def __init__(self, store: RedisStore, ref: HubRef) -> None:
        self._store = store
        prefix = f"{scope(ref)}:race"
        self.keys: dict[Hash, str] = {"allocation": f"{prefix}:allocation", "grab": f"{prefix}:grab"}
        self.generation_key = f"{prefix}:generation"
        self.channels: dict[Channel, str] = {"grab": f"{prefix}:grab-lease", "allocated": f"{prefix}:allocated-lease"}
        self._channel_of = {name: channel for channel, name in self.channels.items()}
        self.requests = 0

    async def _run(self, doing: str, call: Callable[[Connection], Any]) -> Any:
        self.requests += 1  # counted here, not in the store's requests
        return await self._store.run(doing, call, count=False)

    async def hgetall(self, hashes: tuple[Hash, ...]) -> dict[Hash, dict[str, str]]:
        async def read(c: Connection) -> list[dict[str, str]]:
            pipe = c.client.pipeline(transaction=False)
            for name in hashes:
                pipe.hgetall(self.keys[name])
            return list(await pipe.execute())

        found = await self._run("reading the race hashes", read)
        return {name: dict(values) for name, values in zip(hashes, found, strict=True)}

    async def hget(self, name: Hash, field: str) -> str | None:
        async def read(c: Connection) -> str | None:
            value = await c.client.hget(self.keys[name], field)
            return None if value is None else str(value)

        result: str | None = await self._run(f"reading the race's {name} hash", read)
        return result

    async def hset(self, name: Hash, field: str, value: str) -> None:
        async def write(c: Connection) -> None:
            await c.client.hset(self.keys[name], field, value)

        await self._run(f"writing the race's {name} hash", write)

    async def hsetnx(self, name: Hash, field: str, value: str) -> str:
        async def race(c: Connection) -> str:
            pipe = c.client.pipeline(transaction=True)  # MULTI: nobody writes between the two
            pipe.hsetnx(self.keys[name], field, value)
            pipe.hget(self.keys[name], field)
            _, holder = await pipe.execute()
            return str(holder)

        holder: str = await self._run(f"HSETNX on the race's {name} hash", race)
        return holder

    async def grab(self, partition_id: str, node: str, generation: str) -> str | None:
        async def race(c: Connection) -> str | None:
            script = c.script(GRAB_IF)
            holder = await script(keys=[self.keys["grab"], self.generation_key], args=[partition_id, node, generation])
            return None if holder is None else str(holder)

        result: str | None = await self._run("HSETNX on the race's grab hash", race)
        return result

    async def generation(self) -> str:
        """The server's generation, written first if there is none (after a start)."""

        async def read(c: Connection) -> str:
            return str(await c.script(GENERATION)(keys=[self.generation_key], args=[secrets.token_hex(8)]))

        result: str = await self._run("reading the race's generation", read)
        return result

    async def hdel(self, name: Hash, field: str, expect: str | None = None) -> bool:
        async def delete(c: Connection) -> int:
            if expect is None:
                return int(await c.client.hdel(self.keys[name], field))
            script = c.script(DELETE_IF)
            return int(await script(keys=[self.keys[name]], args=[field, expect]))

        deleted: int = await self._run(f"deleting from the race's {name} hash", delete)
        return deleted > 0

    async def publish(self, channel: Channel, partition_id: str) -> None:
        async def send(c: Connection) -> None:
            await c.client.publish(self.channels[channel], partition_id)

        await self._run(f"publishing a {channel} notification", send)

    async def listen(self, deliver: Deliver, ready: Callable[[str], None]) -> None:
        self.requests += 1
        client = self._store.new_client(retries=0)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(*self.channels.values())
            stop_if_cancelled()  # a send may lose a cancellation (balancer.aio)
            ready(await self.generation())  # after the subscription: a restart since then breaks it
            stop_if_cancelled()
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                stop_if_cancelled()
                if message is None:
                    continue
                channel = self._channel_of.get(str(message["channel"]))
                if channel is not None:
                    deliver(channel, str(message["data"]))
        except _ERRORS as exc:
            raise self._store.error("the race subscription", exc) from None
        finally:  # a server that stopped answering never says goodbye: the close is bounded
            await within(close_subscription(pubsub, client), CLOSE)
