"""The Redis channel layer as Leaseboard configures it (``CHANNEL_LAYERS`` when ``REDIS_URL`` is set).

channels_redis waits for a message with a ``BZPOPMIN`` of 5 s, then issues it again (after an
``EVAL`` of its own): every idle receiver wakes, with two round trips, every 5 s. Every worker
process holds one such receiver (``workers.runtime.runner.listen_for_wakeups``) and every
websocket another, all of them idle nearly always. This layer waits ``IDLE_WAIT`` seconds instead,
where every host's reads are allowed longer than that (``socket_timeout``, given with a margin);
else channels_redis's 5 s. A message still arrives at once: only an idle wait is longer.
"""

from __future__ import annotations

from typing import Any

from channels_redis.core import RedisChannelLayer as ChannelsRedisLayer

IDLE_WAIT = 12.0  # seconds a BZPOPMIN waits for a message
MARGIN = 3.0  # seconds a host's read timeout must exceed the wait by


def idle_wait(hosts: list[dict[str, Any]], default: float) -> float:
    """The longest wait every host's ``socket_timeout`` allows (at most ``IDLE_WAIT``, at least
    ``default``): a host without one (redis-py then times reads out after 5 s) keeps ``default``."""
    timeouts: list[float] = []
    for host in hosts:
        timeout = host.get("socket_timeout") if isinstance(host, dict) else None
        if not isinstance(timeout, int | float) or isinstance(timeout, bool):
            return default
        timeouts.append(float(timeout))
    return max(default, min(IDLE_WAIT, min(timeouts, default=0.0) - MARGIN))


class RedisChannelLayer(ChannelsRedisLayer):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.brpop_timeout = idle_wait(self.hosts, ChannelsRedisLayer.brpop_timeout)
