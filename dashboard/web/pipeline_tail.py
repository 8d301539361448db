"""The alerts of one hub as this console process reads them, for every ``/ws/pipeline/`` socket on
that hub (``pipeline_feed.py``), as ``feed.py`` reads the event log for ``/ws/balancer/``.

A ``Tail`` reads the ``Alert`` table when woken (``workers.alerts.notify`` reaches the sockets of
its hub through the channel layer) and at the latest every POLL_EVERY seconds (the in-memory
channel layer does not cross processes). One read at a time; a wake during a read makes one more
read right after it. A read looks at the alerts raised since the newest one read minus SETTLE
seconds (ids and raise times of concurrent writers may commit out of order): their keys
(partition, sequence number) first, then the whole rows of those the tail has not handed out yet
(at 140 alerts a second the window holds about 700, read several times a second: whole rows each
time took most of the console's CPU). It hands the new ones to every subscriber; each socket keeps
the keys it has sent of that window in a ``Sent``, which forgets a key once no read can return it
again, so it stays as small as the window. A socket that joins makes the next read hand out the
whole window again (its ``Sent`` keeps what its snapshot showed from being sent twice).
Every LATENCY_EVERY seconds a read also takes the latency figures (``pipeline_latency.latency``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db.models import Max

from workers.alerts import ALERTS_KEPT
from workers.models import Alert

from ..dbthread import READ_DEADLINE, DatabaseThread
from ..live.health import report
from .pipeline import newest_alerts
from .pipeline_latency import latency

log = logging.getLogger(__name__)

POLL_EVERY = 0.25  # seconds between reads nothing woke
SETTLE = 5.0  # seconds an alert may commit after a later-raised one and still be sent
LATENCY_EVERY = 2.0  # seconds between latency messages
SNAPSHOT = 20  # alerts in the snapshot
READ_LIMIT = 2 * ALERTS_KEPT  # alerts a read returns at most (the table keeps ALERTS_KEPT per hub)
KEYS_KEPT = 4 * ALERTS_KEPT  # keys a socket remembers at most (the window keeps far fewer)

# every tail's and socket's reads (read only), on one kept connection
reads = DatabaseThread("leaseboard-pipeline-feed", retry=True, deadline=READ_DEADLINE)

Key = tuple[str, int]
Json = dict[str, Any]


def key_of(alert: Json) -> Key:
    return str(alert["partition_id"]), int(alert["sequence_number"])


def raised_since(
    hub: str, since: float | None, limit: int = READ_LIMIT, known: Mapping[Key, float] | None = None
) -> list[Json]:
    """The alerts of ``hub`` raised at or after ``since`` (epoch seconds; None: all), the newest
    ``limit`` of them, oldest raised first; with ``known``, only those whose key is not in it (the
    window's keys are read first, then the rows of the others)."""
    rows = Alert.objects.filter(hub=hub)
    if since is not None:
        rows = rows.filter(raised_at__gte=datetime.fromtimestamp(since, UTC))
    newest = rows.order_by("-raised_at", "-id")[:limit]
    if known is None:
        return [alert.as_json() for alert in reversed(list(newest))]
    wanted = [
        pk
        for pk, partition, sequence in newest.values_list("id", "partition_id", "sequence_number")
        if (str(partition), int(sequence)) not in known
    ]
    if not wanted:
        return []
    return [alert.as_json() for alert in Alert.objects.filter(id__in=wanted).order_by("raised_at", "id")]


@dataclass
class First:
    """What a socket reads when it opens: its snapshot, and the keys of the window it must not send."""

    alerts: list[Json]
    latency: Json
    floor: float | None  # alerts raised before this are history, not news (None: the table was empty)
    seen: dict[Key, float]  # key -> raised_at of the alerts already committed in the window


def first_read(hub: str, count: int = SNAPSHOT) -> First:
    # The window's keys before the snapshot: an alert committed between the two reads is either in
    # the snapshot (its key is added to ``seen`` too) or sent by the tail; none is lost.
    newest = Alert.objects.filter(hub=hub).aggregate(newest=Max("raised_at"))["newest"]
    floor = None if newest is None else min(newest.timestamp(), time.time()) - SETTLE
    seen = {key_of(a): a["raised_at"] for a in raised_since(hub, floor)}
    alerts = newest_alerts(hub, count)
    seen.update((key_of(a), a["raised_at"]) for a in alerts)
    return First(alerts, latency(hub), floor, seen)


@dataclass(eq=False)
class Subscriber:
    """One socket's side of a tail: the reads delivered and not yet taken, and how to wake the socket."""

    wake: Callable[[], None]
    reads: list[tuple[float | None, list[Json]]] = field(default_factory=list)  # (since, rows) per read

    def take(self) -> list[tuple[float | None, list[Json]]]:
        taken, self.reads = self.reads, []
        return taken


class Tail:
    """The alerts of one hub as this process reads them, for every socket on it (module docstring)."""

    def __init__(self, hub: str) -> None:
        self.hub = hub
        self.newest: float | None = None  # the newest raised_at read
        self.subscribers: set[Subscriber] = set()
        self.woken = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.error: str | None = None  # why the last round failed; None once one succeeded
        self.latency: Json | None = None
        self.latency_version = 0
        self.latency_read = float("-inf")  # monotonic time of the last latency read
        self.handed: dict[Key, float] = {}  # key -> raised_at of the window's alerts handed out

    def wake(self) -> None:
        self.woken.set()

    def since(self) -> float | None:
        """Where the next read starts: SETTLE seconds before the newest alert read (or the clock, if
        a writer's clock ran ahead of ours)."""
        return None if self.newest is None else min(self.newest, time.time()) - SETTLE

    async def _run(self) -> None:
        while self.subscribers:
            self.woken.clear()
            await self._round()
            if self.woken.is_set():
                continue  # woken during the read: the alert may have committed after it began
            with contextlib.suppress(TimeoutError):  # asyncio.timeout: wait_for (3.11) can swallow a cancel
                async with asyncio.timeout(POLL_EVERY):
                    await self.woken.wait()

    async def _round(self) -> None:
        try:
            await self._read()
        except Exception as exc:  # a database that is down must not end the tail: the next round retries
            found = report(exc)
            if found is None:
                log.warning("pipeline alert feed read failed: %s: %s", type(exc).__name__, exc)
            reason = found.reason if found is not None else f"alerts unavailable: {type(exc).__name__}: {exc}"
            if reason != self.error:
                self.error = reason
                self._wake_subscribers()
            return
        if self.error is not None:
            self.error = None
            self.latency_read = float("-inf")  # back: a latency message at once says so

    async def _read(self) -> None:
        since = self.since()
        rows = await reads.acall(raised_since, self.hub, since, READ_LIMIT, dict(self.handed))
        if since is not None:
            self.handed = {key: raised for key, raised in self.handed.items() if raised >= since}
        if rows:
            newest = max(float(row["raised_at"]) for row in rows)
            self.newest = newest if self.newest is None else max(self.newest, newest)
            self.handed.update((key_of(row), float(row["raised_at"])) for row in rows)
            for subscriber in self.subscribers:
                subscriber.reads.append((since, rows))
            self._wake_subscribers()  # before the latency read: the alerts do not wait for it
        if time.monotonic() - self.latency_read >= LATENCY_EVERY:
            self.latency = await reads.acall(latency, self.hub)
            self.latency_read = time.monotonic()
            self.latency_version += 1
            self._wake_subscribers()

    def _wake_subscribers(self) -> None:
        for subscriber in self.subscribers:
            subscriber.wake()


_tails: dict[str, Tail] = {}  # the running tails of this process (a test can see none is left)


def subscribe(hub: str, wake: Callable[[], None]) -> tuple[Tail, Subscriber]:
    """Join (or start) this process's tail of ``hub``; what it reads from now on goes to the subscriber."""
    tail, loop = _tails.get(hub), asyncio.get_running_loop()
    if tail is None or tail.task is None or tail.task.done() or tail.task.get_loop() is not loop:
        tail = _tails[hub] = Tail(hub)
    subscriber = Subscriber(wake)
    tail.subscribers.add(subscriber)
    tail.handed.clear()  # the next read hands out the whole window: the newcomer's Sent sorts it out
    if tail.task is None:
        tail.task = loop.create_task(tail._run(), name=f"pipeline alert feed {hub}")
    return tail, subscriber


def unsubscribe(tail: Tail, subscriber: Subscriber) -> None:
    """Leave ``tail``; the last to leave stops it."""
    tail.subscribers.discard(subscriber)
    if not tail.subscribers:
        if _tails.get(tail.hub) is tail:
            del _tails[tail.hub]
        if tail.task is not None:
            tail.task.cancel()


def running() -> int:
    """Tails running in this process."""
    return sum(1 for tail in _tails.values() if tail.task is not None and not tail.task.done())


class Sent:
    """The keys one socket has sent (or must not send) of the current window."""

    def __init__(self, first: First) -> None:
        self.floor = first.floor
        self.keys = dict(first.seen)

    def fresh(self, since: float | None, rows: list[Json]) -> list[Json]:
        """``rows`` (one read from ``since``) not sent yet, now counted as sent; keys no later read
        can return (raised before ``since``: the tail's reads only move forward) are forgotten."""
        found = []
        for row in rows:
            key, raised = key_of(row), float(row["raised_at"])
            if (self.floor is not None and raised < self.floor) or key in self.keys:
                continue
            self.keys[key] = raised
            found.append(row)
        if since is not None:
            self.keys = {k: raised for k, raised in self.keys.items() if raised >= since}
        if len(self.keys) > KEYS_KEPT:  # a safety net: the window never holds this many
            kept = sorted(self.keys.items(), key=lambda item: item[1])[-KEYS_KEPT // 2 :]
            self.keys = dict(kept)
            oldest = kept[0][1]
            self.floor = oldest if self.floor is None else max(self.floor, oldest)
        return found
