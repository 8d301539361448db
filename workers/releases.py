"""Release notices for one ``runworkers`` process (``balancer.notices``): each coordinator's
releases are published on the store's channel, and a notice from another worker of the same hub
wakes this process's workers, whose next cycle (now) claims what was released to them.

The channel is the store's own where it has one (Redis pub/sub; PostgreSQL ``LISTEN/NOTIFY``); else
the channel layer's where ``CHANNEL_LAYERS`` crosses processes (``channels_redis``, with ``REDIS_URL``:
``workers.layer_notices``), which serves the Blob store and SQLite; else one inside this process,
which still joins the workers of one process (``--count``, embedded workers), and a receiver on
another process claims at its next cycle, polling a quarter interval while it waits. A notice that
cannot be sent is logged once per outage; losing it costs no more than that wait. While the layer's
listener is out of its group (its Redis down), this process's workers poll while waiting as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from balancer.model import HubRef
from balancer.notices import LocalChannel, ReleaseChannel, Released, concerns, release_channel, wakes

from .layer_notices import channel_layer_channel

log = logging.getLogger("leaseboard.notices")

PUBLISH_TIMEOUT = 2.0  # seconds: a notice later than this is no better than the receiver's next cycle
RESTART = 1.0  # seconds before a listener that failed unexpectedly listens again


class Wakeable(Protocol):
    @property
    def owner_id(self) -> str: ...

    def wake(self) -> None: ...

    def news(self) -> None: ...


class Notices:
    """The release notices of the workers of one process on one hub and consumer group."""

    def __init__(self, store: object, ref: HubRef, *, across_processes: bool = True, layer: Any = None) -> None:
        """``across_processes=False`` keeps notices inside this process even where the store or the
        channel layer has a channel (``--no-release-notices``). ``layer``: the channel layer to use
        where the store has no channel (default: Django's default one)."""
        self._workers: Sequence[Wakeable] = ()
        found = release_channel(store, ref) if across_processes else None
        through_layer = None
        if found is None and across_processes:  # no channel of the store's own: the layer's, if it crosses
            through_layer = channel_layer_channel(ref, layer)
            if through_layer is not None:
                through_layer.on_health = self._layer_health
                found = through_layer
        self.channel: ReleaseChannel = found if found is not None else LocalChannel()
        if found is not None:
            self.kind = repr(found)
        else:
            self.kind = "in this process only" + ("" if across_processes else " (turned off across processes)")
        # Else a receiver in another process polls while waiting. Through the layer only once its listener
        # is in its group (``_layer_health``): a process that never listens (or cannot) keeps polling.
        self.across_processes = found is not None and found is not through_layer
        self.ref = ref
        self._sending: set[asyncio.Task[None]] = set()
        self._failing = False

    def publisher(self) -> Callable[[Released], None]:
        """A coordinator's ``on_released``: sends each notice in the background (never blocks a cycle)."""

        def publish(notice: Released) -> None:
            task = asyncio.get_running_loop().create_task(self._send(notice), name="release notice")
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

        return publish

    async def _send(self, notice: Released) -> None:
        try:
            await asyncio.wait_for(self.channel.publish(notice), PUBLISH_TIMEOUT)
        except Exception as exc:  # a hint lost: the receiver claims at its next cycle
            if not self._failing:
                log.warning(
                    "release notices: could not send one (%s: %s); receivers claim at their next cycle",
                    type(exc).__name__,
                    exc,
                )
            self._failing = True
        else:
            if self._failing:
                log.info("release notices: sending again")
            self._failing = False

    def _layer_health(self, up: bool) -> None:
        """The channel layer's listener joined its group (``up``) or lost it: while it is out, this
        process's workers poll while waiting for a handoff (``poll_waiting``), as without notices."""
        self.across_processes = up
        for worker in self._workers:
            if hasattr(worker, "poll_waiting"):
                worker.poll_waiting = not up

    async def listen(self, workers: Sequence[Wakeable]) -> None:
        """Wake ``workers`` on each notice of another worker's release on this hub, until cancelled."""
        self._workers = workers
        while True:
            try:
                async for notice in self.channel.listen():
                    for worker in workers:
                        if not concerns(notice, self.ref, worker.owner_id):
                            continue
                        if wakes(notice):  # a release, an operator's control
                            worker.wake()
                        else:  # a join: news for a worker waiting quietly
                            worker.news()
            except Exception as exc:  # never let a notice take a worker down: listen again
                log.warning("release notices: the listener failed (%s: %s); listening again", type(exc).__name__, exc)
            await asyncio.sleep(RESTART)

    async def aclose(self) -> None:
        for task in list(self._sending):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._sending, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.channel.aclose()
