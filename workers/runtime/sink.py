"""Where a worker's reports go: balancer events (log, metrics, dashboard) and outage logging.

``EventSink`` is the ``on_event`` callback of the coordinator. The coordinator calls it inside its
cycle, on the event loop, so it must never block: the event is logged and counted at once, and
handed to the publisher the settings name (``LEASEBOARD_EVENT_PUBLISHER``: by default the dashboard's
event log row + channel-layer message) in a background task.
Broadcasting is best effort: a failure is logged and counted, never raised into the cycle, so a
dashboard database that is locked or down cannot cost a worker its leases.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import workers.metrics as metrics
from balancer.errors import StoreError
from balancer.model import BalancerEvent

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
    """

    def __init__(self, publish: Publish | None = None, is_async: bool = False) -> None:
        self._publish = publish
        self._is_async = is_async
        self._last: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self._outage = OutageLog(log, "broadcasting balancer events to the dashboard")
        self.seen: list[BalancerEvent] = []  # the latest events, for tests and status output
        self.keep = 1000

    def __call__(self, event: BalancerEvent) -> None:
        frm = event.previous_owner or "-"
        to = event.owner_id or "-"
        log.info(
            "%s partition %s: %s -> %s (by %s: %s)",
            event.kind.value, event.partition_id, frm, to, event.reporter, event.reason,
        )
        metrics.observe_event(event)
        self.seen.append(event)
        del self.seen[: -self.keep]
        if self._publish is not None:
            self._schedule(event)

    def _schedule(self, event: BalancerEvent) -> None:
        if self._publish is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # Not on a loop (a sync caller): a daemon thread, so a hung database cannot block exit.
            threading.Thread(target=self._publish_sync, args=(event,), daemon=True).start()
            return
        # Chained, so one worker's events reach the dashboard in the order they happened.
        task = loop.create_task(self._publish_after(self._last, event))
        self._last = task
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _publish_after(self, previous: asyncio.Task[None] | None, event: BalancerEvent) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        assert self._publish is not None
        try:
            if self._is_async:
                result = self._publish(event)
                if isinstance(result, Awaitable):
                    await result
            else:
                await asyncio.to_thread(self._publish, event)
        except Exception as exc:  # best effort: see the module docstring
            metrics.BROADCAST_ERRORS.inc()
            self._outage.failed(exc)
        else:
            self._outage.ok()

    def _publish_sync(self, event: BalancerEvent) -> None:
        try:
            result = self._publish(event) if self._publish is not None else None
            if isinstance(result, Awaitable):
                asyncio.run(_awaited(result))
        except Exception as exc:
            metrics.BROADCAST_ERRORS.inc()
            self._outage.failed(exc)

    async def flush(self, timeout: float = 5.0) -> bool:
        """Wait up to ``timeout`` seconds for pending broadcasts; True if none is left."""
        if not self._pending:
            return True
        _, pending = await asyncio.wait(set(self._pending), timeout=timeout)
        return not pending


async def _awaited(awaitable: Awaitable[Any]) -> None:
    await awaitable
