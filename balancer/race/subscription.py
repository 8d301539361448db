"""A race node's subscription to the grab and allocated channels, kept up for as long as it runs.

Pub/sub is fire and forget: while the subscription is down this node hears nothing, so the parts
that act on what others hear read its state. ``subscribed`` is False while it is down (a node
that would not hear its own challenge does not publish one); ``quiet_until`` holds publishing back
for a moment after it came back, so that after a store restart nobody starts races that nodes still
reconnecting cannot hear; ``epoch`` counts the breaks, so a race that was waiting when one
happened knows to give up (the store may have restarted empty and lost the winner's grab mark);
``generation`` is the store's as this subscription began, which a race's ``HSETNX`` must still
find: the break is noticed a moment after the restart, and a racer whose wait ended in that moment
would otherwise win a race already won (CI: the owner lost its partition across a Redis restart).
"""

from __future__ import annotations

import asyncio

from balancer.aio import stop_if_cancelled
from balancer.errors import StoreError
from balancer.model import check_partition_id
from balancer.race.backend import Channel, Deliver, RaceBackend
from balancer.race.node import Outages, RaceNode, log

RESUBSCRIBE_QUIET = 2.0  # seconds without publishing after a subscription came back (> the backoff cap)
BACKOFF_CAP = 1.0


class Subscription:
    """Subscribes ``node`` through ``backend`` and hands each well-formed message to ``deliver``."""

    def __init__(self, node: RaceNode, backend: RaceBackend, outages: Outages, deliver: Deliver) -> None:
        self._node = node
        self._backend = backend
        self._outages = outages
        self._deliver = deliver
        self.subscribed = False
        self.epoch = 0  # subscriptions lost so far
        self.quiet_until = 0.0
        self.generation: str | None = None  # the store's, as the subscription (re)began

    def deaf(self, now: float) -> bool:
        """True while a notification published now might not reach every node (nor this one)."""
        return not self.subscribed or now < self.quiet_until

    async def run(self) -> None:
        """Keep the subscription up until the node stops; back off (up to a second) while the store
        is away."""
        node = self._node
        delay = 0.05
        first = True
        while not node.stopped:

            def ready(generation: str) -> None:
                nonlocal delay, first
                self.subscribed = True
                self.generation = generation
                if not first:
                    self.quiet_until = node.monotonic() + RESUBSCRIBE_QUIET
                    log.info("%s: race subscription is back", node.owner_id)
                first = False
                delay = 0.05
                self._outages.recovered("subscription")

            try:
                await self._backend.listen(self._heard, ready)
            except StoreError as exc:
                stop_if_cancelled()  # a cancellation the client turned into an error: end now
                self._outages.failed("subscription", exc)
            except Exception as exc:  # a bug must not end the subscription for good
                stop_if_cancelled()
                log.exception("%s: race subscription failed", node.owner_id)
                self._outages.failed("subscription", exc)
            self.subscribed = False
            self.epoch += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_CAP)

    def _heard(self, channel: Channel, pid: str) -> None:
        try:
            check_partition_id(pid)
        except ValueError:
            log.warning("%s: ignored a %s notification for %r: not a partition id", self._node.owner_id, channel, pid)
            return
        self._deliver(channel, pid)
