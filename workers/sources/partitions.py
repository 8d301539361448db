"""The partition ids a coordinator balances, never waiting long on the event source.

A coordinator's cycle asks for the hub's partition ids before it plans. When the hub cannot be
reached (a network cut between the worker and Event Hubs, not a refusal) the SDK's request hangs
until its own retries give up, and a cycle waiting for it renews nothing: the worker's leases
lapse and its partitions move although its store answered all along. ``PartitionList`` waits at
most ``bound`` seconds for an answer; past that it returns the last ids it had (partitions are
never removed, so they are a true subset) and lets the request finish in the background. At most
one request is in flight, however many cycles ask meanwhile. Before the first answer there is
nothing to fall back on, and the wait is the caller's to bound.

A source that lists its partitions from this machine (the embedded hub: a file's ``stat``) says so
(``lists_partitions_locally``) and is asked in the cycle itself: a thread for it cost every idle
worker more than the question.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from balancer.aio import off_loop

log = logging.getLogger(__name__)


class PartitionList:
    """``await partitions()``: the ids, waiting at most ``bound`` seconds once some are known. A
    request outstanding for more than ``warn_after`` seconds is warned once (a slow answer now and
    then is not: the cycle simply used the last ids), and its end once."""

    def __init__(
        self,
        fetch: Callable[[], tuple[str, ...]],
        bound: float,
        name: str = "the event source",
        warn_after: float = 5.0,
        local: bool = False,
    ) -> None:
        self._fetch = fetch
        self.local = local  # ``fetch`` never waits on a network: called in the event loop, no thread
        self.bound = bound
        self.warn_after = warn_after
        self.name = name
        self.known: tuple[str, ...] = ()
        self._pending: asyncio.Future[tuple[str, ...]] | None = None
        self._since = 0.0
        self._slow = False

    async def __call__(self) -> tuple[str, ...]:
        if self.local:
            self.known = self._fetch()
            return self.known
        loop = asyncio.get_running_loop()
        if self._pending is None or self._pending.done():
            self._pending = off_loop(self._fetch, name="partition list")
            self._since = loop.time()
        if not self.known:
            self.known = await asyncio.shield(self._pending)
            return self.known
        try:
            self.known = await asyncio.wait_for(asyncio.shield(self._pending), self.bound)
        except TimeoutError:
            waited = loop.time() - self._since
            if not self._slow and waited > self.warn_after:
                log.warning(
                    "%s has not listed its partitions for %.1fs: balancing the last %d known meanwhile",
                    self.name,
                    waited,
                    len(self.known),
                )
                self._slow = True
            return self.known
        if self._slow:
            log.warning("%s lists its partitions again", self.name)
            self._slow = False
        return self.known
