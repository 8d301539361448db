"""The channel layer the settings configure for ``REDIS_URL`` (``dashboard.live.layers``): an idle
receiver waits 12 s per ``BZPOPMIN`` instead of channels_redis's 5 s where the host's reads are
allowed longer, and a message still arrives at once. Against a real ``redis-server``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels_redis.core import RedisChannelLayer as ChannelsRedisLayer
from redis.asyncio import Redis

from dashboard.live.layers import IDLE_WAIT, RedisChannelLayer, idle_wait
from tests.support.redis_server import RedisServer


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        ([{"address": "redis://h", "socket_timeout": 15}], IDLE_WAIT),  # what the settings give
        ([{"address": "redis://h", "socket_timeout": 60}], IDLE_WAIT),  # never longer than IDLE_WAIT
        ([{"address": "redis://h", "socket_timeout": 10}], 7.0),  # the margin below the read timeout
        ([{"address": "redis://h", "socket_timeout": 6}], 5),  # never shorter than channels_redis's
        ([{"address": "redis://h"}], 5),  # redis-py's own read timeout: keep channels_redis's wait
        ([{"address": "redis://a", "socket_timeout": 15}, {"address": "redis://b", "socket_timeout": 11}], 8.0),
        ([{"address": "redis://a", "socket_timeout": 15}, {"address": "redis://b"}], 5),
        ([{"address": "redis://h", "socket_timeout": True}], 5),
    ],
)
def test_the_idle_wait_stays_below_every_hosts_read_timeout(hosts: list[dict[str, Any]], expected: float) -> None:
    assert idle_wait(hosts, ChannelsRedisLayer.brpop_timeout) == expected


async def test_an_idle_receive_waits_twelve_seconds_per_bzpopmin_and_a_message_arrives_at_once(
    redis_server: RedisServer,
) -> None:
    layer = RedisChannelLayer(hosts=[{"address": redis_server.url, "socket_timeout": 15}], prefix="wait-test")
    channel = await layer.new_channel()
    async with Redis.from_url(redis_server.url, decode_responses=True) as raw, raw.monitor() as monitor:
        receiving = asyncio.create_task(layer.receive(channel))
        try:
            while True:  # the layer's commands, as the server saw them
                command = (await asyncio.wait_for(monitor.next_command(), 10))["command"]
                if command.upper().startswith("BZPOPMIN"):
                    break
            assert command.split()[-1] == str(IDLE_WAIT)  # BZPOPMIN <channel> 12.0
            await layer.send(channel, {"type": "hello"})
            assert (await asyncio.wait_for(receiving, 5))["type"] == "hello"
        finally:
            receiving.cancel()
            await asyncio.gather(receiving, return_exceptions=True)
    await layer.flush()
