"""The landing's alert writer wakes the console's feed in another process through the Redis channel
layer (``workers.alerts.notify``): the message reaches a channel of the feed's group."""

from __future__ import annotations

import asyncio

from dashboard.live.layers import RedisChannelLayer
from tests.support.redis_server import RedisServer
from workers import alerts


async def test_notify_reaches_the_feeds_group_through_redis(redis_server: RedisServer) -> None:
    layer = RedisChannelLayer(hosts=[{"address": redis_server.url, "socket_timeout": 5}], prefix="leaseboard")
    listener = await layer.new_channel()
    await layer.group_add(alerts.group_name("sensors"), listener)
    try:
        sender = RedisChannelLayer(hosts=[{"address": redis_server.url, "socket_timeout": 5}], prefix="leaseboard")
        assert await asyncio.to_thread(alerts.notify, "sensors", None, sender)  # as the writer's thread does
        message = await asyncio.wait_for(layer.receive(listener), 5)
        assert message == {"type": alerts.MESSAGE_TYPE, "hub": "sensors"}
        assert not await asyncio.to_thread(alerts.notify, "sensors", None, None), "no layer set up: no wake-up"
    finally:
        await layer.flush()
