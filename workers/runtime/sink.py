"""Where a worker's reports go: balancer events (log, metrics, dashboard) and outage logging.

``EventSink`` is the ``on_event`` callback of the coordinator. The coordinator calls it inside its
cycle, on the event loop, so it must never block: the event is logged and counted at once, and
handed to the publisher the settings name (``LEASEBOARD_EVENT_PUBLISHER``: by default the dashboard's
event log row + channel-layer message) in a background task.
A failure to broadcast is logged and counted, never raised into the cycle, so a dashboard database
that is locked, down or cut off cannot cost a worker its leases; the event is kept and tried again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import workers.metrics as metrics
from balancer.aio import off_loop
from balancer.errors import StoreError
from balancer.model import BalancerEvent
from workers.runtime import tracing

log = logging.getLogger("leaseboard.events")

Publish = Callable[[BalancerEvent], Any]


class OutageLog:
    """Logs a failing operation once when it starts failing and once when it works again.

    A store that is down fails every few seconds; logging each failure with a traceback would
    bury the one line that matters. Failures in between are counted and logged at DEBUG.
    Unexpected errors (not a StoreError) get their traceback on the first line.
    """

    def __init__(self, logger: logging.Logger, what: str, retry: str = "") -> None:
        self._log = logger
        self.what = what
        self.retry = retry
        self.failures = 0

    @property
    def down(self) -> bool:
        return self.failures > 0

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        if self.failures > 1:
            self._log.debug("%s still failing (%d times): %s", self.what, self.failures, exc)
            return
        expected = isinstance(exc, StoreError)
        suffix = f"; {self.retry}" if self.retry else ""
        self._log.warning(
            "%s failed: %s: %s%s", self.what, type(exc).__name__, exc, suffix, exc_info=None if expected else exc
        )

    def ok(self) -> None:
        if self.failures:
            self._log.warning("%s works again after %d failed attempts", self.what, self.failures)
        self.failures = 0


class EventSink:
    """Logs, counts and broadcasts balancer events; one per process, shared by its workers.

    ``publish`` receives every event (``is_async``: it returns an awaitable); None broadcasts
    nothing. ``workers.wiring.build_sink`` gives it the publisher the settings name.

    Events wait in a queue and are handed over one at a time, in the order they happened. One that
    cannot be handed over (the dashboard's database is down, locked, or cut off by the network) stays
    at the head of the queue and is tried again after ``retry`` seconds, doubling up to
    ``retry_max``, so an outage delays the console's event log but does not leave holes in it. The
    backoff stops at a second so that after a heal the queue drains well within the 5 s a stopping
    worker gives ``flush`` (a retry 5 s away could miss it, and those events would be lost). At most
    ``backlog`` events wait; beyond that the oldest are dropped, counted and logged. An event's time is
    the time it happened, not the time it reached the dashboard. A publisher that saved an event and
    then failed to say so (the connection cut during the commit) makes its retry a second row.
    """

    def __init__(
        self,
        publish: Publish | None = None,
        is_async: bool = False,
        *,
        retry: float = 0.5,
        retry_max: float = 1.0,
        backlog: int = 10_000,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._publish = publish
        self._is_async = is_async
        self._retry = retry
        self._retry_max = retry_max
        self._sleep = sleep
        self._queue: deque[BalancerEvent] = deque()
        self._backlog = backlog
        self._sender: asyncio.Task[None] | None = None
        self._outage = OutageLog(log, "broadcasting balancer events to the dashboard", "kept and tried again")
        self.dropped = 0
        self.seen: list[BalancerEvent] = []  # the latest events, for tests and status output
        self.keep = 1000

    def __call__(self, event: BalancerEvent) -> None:
        frm = event.previous_owner or "-"
        to = event.owner_id or "-"
        log.info(
            "%s partition %s: %s -> %s (by %s: %s)",
            event.kind.value,
            event.partition_id,
            frm,
            to,
            event.reporter,
            event.reason,
        )
        metrics.observe_event(event)
        tracing.ownership(event)  # a span event, while tracing is on
        self.seen.append(event)
        del self.seen[: -self.keep]
        if self._publish is not None:
            self._schedule(event)

    @property
    def unsent(self) -> int:
        """Events waiting to be handed to the dashboard."""
        return len(self._queue)

    def _schedule(self, event: BalancerEvent) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # Not on a loop (a sync caller): a daemon thread, so a hung database cannot block exit.
            threading.Thread(target=self._publish_sync, args=(event,), daemon=True).start()
            return
        if len(self._queue) >= self._backlog:
            self._queue.popleft()
            metrics.BROADCAST_BACKLOG.dec()
            self.dropped += 1
            metrics.BROADCAST_DROPPED.inc()
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.error(
                    "balancer events dropped without reaching the dashboard: %d so far (more than %d waited)",
                    self.dropped,
                    self._backlog,
                )
        self._queue.append(event)
        metrics.BROADCAST_BACKLOG.inc()
        if self._sender is None or self._sender.done():
            self._sender = loop.create_task(self._send_all())

    async def _send_all(self) -> None:
        """Hands the queue over in order; the head is retried until it goes through."""
        wait = self._retry
        while self._queue:
            event = self._queue[0]
            try:
                await self._publish_one(event)
            except Exception as exc:  # best effort: see the module docstring
                metrics.BROADCAST_ERRORS.inc()
                self._outage.failed(exc)
                await self._sleep(wait)
                wait = min(wait * 2, self._retry_max)
                continue
            wait = self._retry
            self._outage.ok()
            if self._queue and self._queue[0] is event:  # not dropped meanwhile as the oldest
                self._queue.popleft()
                metrics.BROADCAST_BACKLOG.dec()

    async def _publish_one(self, event: BalancerEvent) -> None:
        assert self._publish is not None
        if self._is_async:
            result = self._publish(event)
            if isinstance(result, Awaitable):
                await result
        else:
            await off_loop(self._publish, event, name="event publish")  # a hung database holds no exit

    def _publish_sync(self, event: BalancerEvent) -> None:
        try:
            result = self._publish(event) if self._publish is not None else None
            if isinstance(result, Awaitable):
                asyncio.run(_awaited(result))
        except Exception as exc:
            metrics.BROADCAST_ERRORS.inc()
            self._outage.failed(exc)

    async def flush(self, timeout: float = 5.0) -> bool:
        """Wait up to ``timeout`` seconds for the queue to be handed over; True if nothing is left.
        What is left is logged (at exit, those events never reach the console's event log)."""
        sender = self._sender
        if sender is None or sender.done():
            return not self._queue
        _, pending = await asyncio.wait({sender}, timeout=timeout)
        if pending:
            log.warning("%d balancer events not yet handed to the dashboard after %gs", len(self._queue), timeout)
        return not pending


async def _awaited(awaitable: Awaitable[Any]) -> None:
    await awaitable
