"""Release notices on Redis pub/sub (``balancer.notices``): the Redis store's ``release_channel``.

One channel per hub and consumer group (``<scope>:releases``, beside the group's keys). Publishing is
one ``PUBLISH`` on the store's connection. Listening holds a connection of its own, subscribed, and
comes back after any failure (a restarted server, a cut link) with backoff; it pings the server when
the channel has been quiet for a while, so a link that died without a word is noticed and replaced.
What was published while it was away is lost, which a notice may be: the receiver then claims at its
next cycle, as without notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from balancer.aio import stop_if_cancelled, within
from balancer.errors import StoreUnavailable
from balancer.model import HubRef
from balancer.notices import Released

from .layout import scope

log = logging.getLogger("leaseboard.notices")

QUIET = 10.0  # seconds without a message before the listener pings the server
CLOSE = 1.0  # seconds a listener waits for its connection to close before leaving it behind
BACKOFF = (0.1, 5.0)  # first and longest wait before subscribing again


def channel_name(ref: HubRef) -> str:
    return f"{scope(ref)}:releases"


class RedisReleaseChannel:
    """``client()``: the store's client of the running loop (publishing); ``new_client()``: a client of
    its own (each subscription); ``where``: the server, for log lines (no secret in it)."""

    def __init__(self, client: Callable[[], Redis], new_client: Callable[[], Redis], where: str, ref: HubRef) -> None:
        self.client, self.new_client, self.where = client, new_client, where
        self.name = channel_name(ref)

    def __repr__(self) -> str:
        return f"RedisReleaseChannel({self.where!r}, {self.name!r})"

    async def publish(self, notice: Released) -> None:
        try:
            await self.client().publish(self.name, notice.encode())
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"Redis at {self.where}: {type(exc).__name__}: {exc}") from exc

    async def listen(self) -> AsyncIterator[Released]:
        wait, failing = BACKOFF[0], False
        while True:
            client = self.new_client()
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.name)
                stop_if_cancelled()  # each send may lose a cancellation (balancer.aio)
                if failing:
                    log.info("release notices: subscribed again to %s on %s", self.name, self.where)
                wait, failing = BACKOFF[0], False
                clock = asyncio.get_running_loop().time
                ping_at = clock() + QUIET
                while True:
                    # One wake per message, or per QUIET seconds on a quiet channel (a ping).
                    message = await pubsub.get_message(timeout=max(ping_at - clock(), 0.0))
                    stop_if_cancelled()
                    if message is None:  # quiet so far (or a pong, which the subscription hides)
                        if clock() >= ping_at:
                            await pubsub.ping()
                            stop_if_cancelled()
                            ping_at = clock() + QUIET
                        continue
                    ping_at = clock() + QUIET
                    if message.get("type") == "message":
                        notice = Released.decode(message.get("data") or "")
                        if notice is not None:
                            yield notice
            except (RedisError, OSError) as exc:
                stop_if_cancelled()  # a cancellation redis-py turned into an error: end now, one close
                if not failing:
                    log.warning(
                        "release notices: lost the subscription to %s on %s (%s: %s); subscribing again with "
                        "backoff, receivers claim at their next cycle meanwhile",
                        self.name,
                        self.where,
                        type(exc).__name__,
                        exc,
                    )
                failing = True
            finally:  # a server that stopped answering never says goodbye: the close is bounded
                await within(close_subscription(pubsub, client), CLOSE)
            await asyncio.sleep(wait)
            wait = min(wait * 2, BACKOFF[1])

    async def aclose(self) -> None:
        """Nothing of its own to close: a listener closes its connection when its iteration ends."""


async def close_subscription(pubsub: PubSub, client: Redis) -> None:
    """Close a subscription and its client, whatever they raise (bound it with ``within``)."""
    with contextlib.suppress(Exception):
        await pubsub.aclose()  # type: ignore[no-untyped-call]
    with contextlib.suppress(Exception):
        await client.aclose()
