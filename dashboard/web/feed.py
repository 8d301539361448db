"""One reader of a hub's event log per console process, shared by every websocket watching that hub.

Each socket used to read the event log itself every ``POLL_EVERY`` seconds, so 500 idle sockets cost
1,000 queries a second (issue 37: one client's idle sockets kept 88 % of a core busy). Now a ``Feed``
per hub and consumer group reads it, at most every ``POLL_EVERY`` seconds and when a worker's
message or a socket asks (``wake``, ``read_now``), and pushes what it read to its subscribers; a
socket reads the log itself only once, to catch up from its snapshot's watermark when it joins.

The feed keeps the delivery rule the sockets had: rows above the last id read, and (at most every
``LATE_EVERY`` seconds) rows between where that stood ``SETTLE`` seconds ago and it that were not
delivered yet (PostgreSQL hands out ids before commit, so a row can commit after a higher one).
Every row read goes to every subscriber exactly once, in id order within one delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q

from balancer.model import HubRef

from ..control.audit import recent_audit
from ..dbthread import READ_DEADLINE, DatabaseThread
from ..live.health import report
from ..models import EventLog

log = logging.getLogger(__name__)

POLL_EVERY = 0.5  # seconds between reads of a feed that nothing woke
SETTLE = 3.0  # seconds a late-committing EventLog row may trail a higher id and still be delivered
GATHER = 0.04  # seconds a wake-up waits after the last read: at 200 events/s, 25 reads a second, not 200
LATE_EVERY = 0.5  # seconds between looks for late rows (at 200 events/s, looking on every wake-up is most of the work)
BATCH = 500
AUDIT = 20  # audit entries a socket is sent when it joins, and at most at each delta

# every feed's and socket's reads (read only), on one kept connection
reads = DatabaseThread("leaseboard-feed", retry=True, deadline=READ_DEADLINE)


def unsent(ref: HubRef, floor: int, last_sent: int, sent: frozenset[int], limit: int) -> list[dict[str, Any]]:
    """Rows above ``last_sent``, and rows between ``floor`` and it that were not sent, in id order."""
    rows = EventLog.objects.filter(**EventLog.scope(ref))
    late: list[int] = []
    if floor < last_sent:
        late = [i for i in rows.filter(id__gt=floor, id__lt=last_sent).values_list("id", flat=True) if i not in sent]
    chosen = rows.filter(Q(id__gt=last_sent) | Q(id__in=late)).order_by("id")[:limit]
    return [EventLog.json_of(row) for row in chosen.values(*EventLog.JSON_FIELDS)]


@dataclass(eq=False)
class Subscriber:
    """One socket's side of a feed: the rows delivered and not yet taken, and how to wake the socket."""

    wake: Callable[[], None]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def take(self) -> list[dict[str, Any]]:
        rows, self.rows = self.rows, []
        return rows


class Feed:
    """The event log of ``ref`` as one process reads it (module docstring). Runs while it has
    subscribers; ``subscribe`` starts it at ``since`` (the first subscriber's watermark)."""

    def __init__(self, ref: HubRef, since: int) -> None:
        self.ref = ref
        self.last = since  # the highest id delivered
        self.sent: set[int] = set()  # ids above the floor delivered
        self.marks: deque[tuple[float, int]] = deque([(time.monotonic(), since)])  # (when, ``last`` then)
        self.late_checked = 0.0
        self.read_started = 0.0  # monotonic time the last read began
        self.subscribers: set[Subscriber] = set()
        self.woken = asyncio.Event()
        self.lock = asyncio.Lock()  # one read at a time
        self.task: asyncio.Task[None] | None = None
        self.audit: list[dict[str, Any]] = []  # the newest AUDIT entries of the audit log, newest first
        self.audit_read = -1.0  # monotonic time that read began
        self.audit_lock = asyncio.Lock()

    async def read_now(self, after: float | None = None) -> None:
        """Return once a read that began after ``after`` (monotonic; default now) has delivered: every
        row committed by then is with the subscribers. The sockets sending one monitor round's delta
        all pass that round's time, and share one read."""
        asked = time.monotonic() if after is None else after
        async with self.lock:
            if self.read_started >= asked:
                return  # a read began after that time, and has delivered
            while await self._read_locked() >= BATCH:
                pass

    def wake(self) -> None:
        self.woken.set()

    async def audit_after(self, after: int, read_at: float | None = None) -> list[dict[str, Any]]:
        """The newest audit entries above id ``after`` (at most AUDIT, newest first), from a read of the
        audit log that began after ``read_at`` (default now): the sockets sending one monitor round's
        delta share one read, as ``read_now``."""
        asked = time.monotonic() if read_at is None else read_at
        async with self.audit_lock:
            if self.audit_read < asked:
                self.audit_read = time.monotonic()
                self.audit = await reads.acall(recent_audit, self.ref, AUDIT)
        return [entry for entry in self.audit if int(entry["id"]) > after]

    async def _read_locked(self) -> int:
        """One read (the lock held): deliver what it found; how many rows it read (BATCH: maybe more)."""
        self.read_started = now = time.monotonic()
        floor = self._floor()
        if now - self.late_checked >= LATE_EVERY:
            self.late_checked = now
        else:
            floor = self.last  # no look below ``last`` this time
        rows: list[dict[str, Any]] = await reads.acall(unsent, self.ref, floor, self.last, frozenset(self.sent), BATCH)
        fresh = [row for row in rows if row["id"] not in self.sent]
        if fresh:
            for row in fresh:
                self.sent.add(row["id"])
            self.last = max(self.last, max(row["id"] for row in fresh))
            for subscriber in self.subscribers:
                subscriber.rows.extend(fresh)
                subscriber.wake()
        self.marks.append((time.monotonic(), self.last))
        return len(rows)

    def _floor(self) -> int:
        """``last`` as it stood SETTLE seconds ago; forget delivered ids at or below it."""
        horizon = time.monotonic() - SETTLE
        while len(self.marks) > 1 and self.marks[1][0] <= horizon:
            self.marks.popleft()
        floor = self.marks[0][1]
        self.sent = {i for i in self.sent if i > floor}
        return floor

    async def _run(self) -> None:
        while self.subscribers:
            try:
                async with self.lock:
                    while await self._read_locked() >= BATCH and self.subscribers:
                        pass  # a burst: keep reading before waiting
            except Exception as exc:  # a database hiccup must not end the feed; the next round retries
                if report(exc) is None:  # an outage is logged once by health, not per poll
                    log.warning("event feed read failed: %s: %s", type(exc).__name__, exc)
            with contextlib.suppress(TimeoutError):  # asyncio.timeout: wait_for (3.11) can swallow a cancel
                async with asyncio.timeout(POLL_EVERY):
                    await self.woken.wait()
            gathered = self.read_started + GATHER - time.monotonic()
            if gathered > 0:  # a busy hub: let the next events join this read
                await asyncio.sleep(gathered)
            self.woken.clear()


_feeds: dict[HubRef, Feed] = {}  # the running feeds of this process (a test can see none is left)


def subscribe(ref: HubRef, since: int, wake: Callable[[], None]) -> tuple[Feed, Subscriber]:
    """Join (or start) this process's feed of ``ref``; rows it reads from now on go to the subscriber."""
    feed, loop = _feeds.get(ref), asyncio.get_running_loop()
    if feed is None or feed.task is None or feed.task.done() or feed.task.get_loop() is not loop:
        feed = _feeds[ref] = Feed(ref, since)
    subscriber = Subscriber(wake)
    feed.subscribers.add(subscriber)
    if feed.task is None:
        feed.task = loop.create_task(feed._run(), name=f"event feed {ref.hub}")
    return feed, subscriber


def unsubscribe(feed: Feed, subscriber: Subscriber) -> None:
    """Leave ``feed``; the last to leave stops it (at once: nothing waits on it)."""
    feed.subscribers.discard(subscriber)
    if not feed.subscribers:
        if _feeds.get(feed.ref) is feed:
            del _feeds[feed.ref]
        if feed.task is not None:
            feed.task.cancel()


def running() -> int:
    """Feeds running in this process."""
    return sum(1 for feed in _feeds.values() if feed.task is not None and not feed.task.done())
