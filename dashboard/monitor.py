"""The console's watcher: one per hub and consumer group per dashboard process, on a thread of its own.

Every ``ROUND_SECONDS`` a monitor reads one snapshot (``state.snapshot``) and adds to it what a
single read cannot say: lag in seconds (``enqueued.py``), checkpointed events per second per
partition and per worker (over ``RATE_SECONDS``), and the partition status (``lag.py``), judged
on a sample taken every ``LEASEBOARD_LAG_SAMPLE_SECONDS``. Samples are kept in ``LagSample`` for
``LEASEBOARD_LAG_RETENTION_SECONDS`` (the partition page's chart and checkpoint history) and read
back when a monitor starts, so a restart does not forget a stalled partition.

Every websocket of the process reads the monitor's latest state and the delta to it, so 100
open pages cost one store read a second, not 100. The monitors run on one daemon thread with its
own event loop (``Host``): request loops come and go (a test client makes one per request), and a
sampler must not depend on which page is open. A monitor starts the first time anything asks for
its hub (a page, a websocket, ``/metrics``); one nobody asked for in ``IDLE_SECONDS`` stops, except
the configured hub's.

The monitor also tails the event log to time handoffs (a planned release until the next claim of
that partition) for ``leaseboard_handoff_duration_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.conf import settings
from django.db import close_old_connections, connections
from django.db.models import Max

from balancer.model import HubRef
from workers.sources.base import EventSource
from workers.wiring import Stores, build_stores, hub_ref

from . import metrics
from .delta import delta
from .enqueued import EnqueuedTimes
from .lag import Rules, Sample, Status, Window, lag_seconds
from .models import EventLog, LagSample
from .state import Snapshot, snapshot, with_source

log = logging.getLogger(__name__)
T = TypeVar("T")

ROUND_SECONDS = 1.0
RATE_SECONDS = 10.0
LOOKUP_BUDGET = 0.3  # seconds per round spent reading enqueued times
IDLE_SECONDS = 600.0
PRUNE_SECONDS = 5.0
# Rows per INSERT transaction: on SQLite a write locks the whole file, and workers' checkpoints and
# event log rows wait behind it; 128 rows is a few milliseconds.
SAMPLE_CHUNK = 128
TAIL_BATCH = 5000

Waker = Callable[[], None]


class Monitor:
    """Watches one hub and consumer group. ``state``, ``version``, ``error`` and ``last_delta`` may be
    read from any thread (each is replaced whole, never changed in place)."""

    def __init__(self, ref: HubRef, host: Host) -> None:
        self.ref = ref
        self.host = host
        self.state: Snapshot | None = None
        self.version = 0
        self.error: str | None = None
        self.updated = 0.0  # monotonic time of the last round that read the store
        self.last_delta: tuple[int, dict[str, Any]] | None = None  # (version it starts from, message)
        self.ready = threading.Event()  # set after the first round, good or not
        self.touched = time.monotonic()
        self.rules = Rules(settings.LEASEBOARD_LAG_WINDOW, settings.LEASEBOARD_LAG_STOP_SECONDS)
        self.sample_seconds = settings.LEASEBOARD_LAG_SAMPLE_SECONDS
        self.retention = settings.LEASEBOARD_LAG_RETENTION_SECONDS
        self.windows: dict[str, Window] = {}
        self.statuses: dict[str, Status | None] = {}
        self.sampled_at: float | None = None
        self._lag_seconds: dict[str, float | None] = {}
        self._times = EnqueuedTimes()
        self._rates: deque[tuple[float, dict[str, int]]] = deque()
        self._pruned = 0.0
        self._primed = False
        self._tail: int | None = None
        self._releases: dict[str, float] = {}
        self._subscribers: dict[int, Waker] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    # any thread -------------------------------------------------------------------------------

    def subscribe(self, wake: Waker) -> int:
        """Call ``wake()`` (from the monitor's thread; it must be thread-safe) after every round."""
        with self._lock:
            token = next(self._ids)
            self._subscribers[token] = wake
        self.touched = time.monotonic()
        return token

    def unsubscribe(self, token: int) -> None:
        with self._lock:
            self._subscribers.pop(token, None)
        self.touched = time.monotonic()

    def fresh(self, max_age: float) -> Snapshot | None:
        """The latest state if a round read the store within ``max_age`` seconds, else None."""
        self.touched = time.monotonic()
        if self.state is None or self.error is not None or time.monotonic() - self.updated > max_age:
            return None
        return self.state

    # the monitor's thread ------------------------------------------------------------------

    async def run(self, stores: Stores) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.round(stores)
            except Exception:  # one bad round must not end the console's view; the next one retries
                log.exception("monitor of %s/%s: round failed", self.ref.hub, self.ref.consumer_group)
            if self._idle():
                log.info("monitor of %s/%s stops: nobody asked for it", self.ref.hub, self.ref.consumer_group)
                return
            await asyncio.sleep(max(0.05, ROUND_SECONDS - (time.monotonic() - started)))

    async def round(self, stores: Stores) -> None:
        """Read, enrich, maybe sample, then publish one new version."""
        if not self._primed:
            await self._prime()
            self._primed = True
        try:
            state = await snapshot(self.ref, stores)
        except Exception as exc:  # the store is down: keep the last state, say why
            self.error = f"store unavailable: {exc}"
            self._publish(None)
            return
        self.error = None
        self.updated = time.monotonic()
        now = float(state["generated_at"])
        await self._lookup_times(state)
        rates = self._rates_of(state, now)
        if self.sampled_at is None or now - self.sampled_at >= self.sample_seconds - ROUND_SECONDS / 2:
            await self._sample(state, now)
        self._enrich(state, rates)
        await self.host.db(self._follow_events)
        self._publish(state)

    def _publish(self, state: Snapshot | None) -> None:
        if state is not None:
            state["version"] = self.version + 1
            self.last_delta = (self.version, delta(self.state, state)) if self.state is not None else None
            self.state = state
            self.version += 1
        self.ready.set()
        with self._lock:
            wakers = list(self._subscribers.items())
        for token, wake in wakers:
            try:
                wake()
            except RuntimeError:  # the subscriber's event loop has closed
                self.unsubscribe(token)

    def _idle(self) -> bool:
        if self.ref == hub_ref():
            return False
        with self._lock:
            watched = bool(self._subscribers)
        return not watched and time.monotonic() - self.touched > IDLE_SECONDS

    # lag in seconds and rates ----------------------------------------------------------------

    async def _lookup_times(self, state: Snapshot) -> None:
        wanted: dict[str, int] = {}
        for p in state["partitions"]:
            if p["lag"]:
                wanted[p["id"]] = p["sequence_number"] if p["sequence_number"] is not None else -1

        def look(source: EventSource) -> dict[str, float]:
            return self._times.lookup(source, wanted, LOOKUP_BUDGET)

        found = (await asyncio.to_thread(with_source, self.ref.hub, look)) if wanted else {}
        for p in state["partitions"]:
            pid = p["id"]
            if not p["lag"]:
                self._lag_seconds[pid] = 0.0 if p["lag"] == 0 else None
            elif pid in (found or {}):
                self._lag_seconds[pid] = lag_seconds(p["last_enqueued_time"], (found or {})[pid], p["lag"])
            # else: not read in time this round; the last figure stands until the next one

    def _rates_of(self, state: Snapshot, now: float) -> dict[str, float]:
        """Checkpointed events per second per partition over the last RATE_SECONDS."""
        current = {p["id"]: p["sequence_number"] for p in state["partitions"] if p["sequence_number"] is not None}
        self._rates.append((now, current))
        while len(self._rates) > 2 and now - self._rates[1][0] >= RATE_SECONDS:
            self._rates.popleft()
        then, old = self._rates[0]
        span = now - then
        if span <= 0:
            return {}
        return {pid: max(0, seq - old[pid]) / span for pid, seq in current.items() if pid in old and seq >= old[pid]}

    def _enrich(self, state: Snapshot, rates: dict[str, float]) -> None:
        per_worker: dict[str, float] = {}
        for p in state["partitions"]:
            pid = p["id"]
            seconds = self._lag_seconds.get(pid)
            p["lag_seconds"] = None if seconds is None else round(seconds, 1)
            # Rule 3 (no lag now: OK, unless rewound) holds between samples too; the others need the window.
            status = self.statuses.get(pid)
            if p["lag"] == 0 and status is not Status.REWIND:
                status = Status.OK
            p["lag_status"] = status.value if status is not None else None
            rate = rates.get(pid, 0.0)
            p["events_per_second"] = round(rate, 1)
            if p["owner"]:
                per_worker[p["owner"]] = per_worker.get(p["owner"], 0.0) + rate
        for w in state["workers"]:
            w["events_per_second"] = round(per_worker.get(w["id"], 0.0), 1)
            w["purgeable"] = not w["alive"] and w["owned"] == 0
        state["sampled_at"] = self.sampled_at
        state["lag_rules"] = {
            "window": self.rules.size, "sample_seconds": self.sample_seconds, "stop_seconds": self.rules.stop_seconds,
        }  # fmt: skip

    # samples and status ----------------------------------------------------------------------

    def _window(self, pid: str) -> Window:
        window = self.windows.get(pid)
        if window is None:
            window = self.windows[pid] = Window(self.rules)
        return window

    async def _sample(self, state: Snapshot, now: float) -> None:
        self.sampled_at = now
        rows = []
        scope = LagSample.scope(self.ref)
        for p in state["partitions"]:
            pid = p["id"]
            sample = Sample(now, p["sequence_number"], p["checkpoint_modified"], p["lag"])
            status = self._window(pid).add(sample)
            self.statuses[pid] = status
            rows.append(
                LagSample(
                    **scope, partition_id=pid, at=now, owner_id=p["owner"] or "",
                    sequence_number=p["sequence_number"], checkpoint_modified=p["checkpoint_modified"],
                    last_enqueued_sequence_number=p["last_enqueued_sequence_number"], lag=p["lag"],
                    lag_seconds=self._lag_seconds.get(pid), status=status.value if status is not None else "",
                )
            )  # fmt: skip
        for gone in set(self.windows) - {p["id"] for p in state["partitions"]}:
            self.windows.pop(gone, None)
            self.statuses.pop(gone, None)
        prune = now - self._pruned >= PRUNE_SECONDS
        if prune:
            self._pruned = now
        await self.host.db(self._store_samples, rows, now, prune)

    def _store_samples(self, rows: list[LagSample], now: float, prune: bool) -> None:
        scope = LagSample.scope(self.ref)
        # Two dashboard processes sample the same hub: the first round in each half-interval is kept.
        if not LagSample.objects.filter(**scope, at__gt=now - self.sample_seconds / 2).exists():
            for start in range(0, len(rows), SAMPLE_CHUNK):  # one transaction each (see SAMPLE_CHUNK)
                LagSample.objects.bulk_create(rows[start : start + SAMPLE_CHUNK])
        if prune:
            LagSample.objects.filter(**scope, at__lt=now - self.retention).delete()

    async def _prime(self) -> None:
        """Windows and statuses from the samples already stored (a restart keeps its judgement)."""
        span = self.rules.stop_seconds + self.rules.size * self.sample_seconds
        rows = await self.host.db(self._stored_samples, span)
        for pid, at, seq, modified, lag in rows:
            self.statuses[pid] = self._window(pid).add(Sample(at, seq, modified, lag))
            self.sampled_at = at if self.sampled_at is None else max(self.sampled_at, at)

    def _stored_samples(self, span: float) -> list[tuple[str, float, int | None, float | None, int | None]]:
        scope = LagSample.scope(self.ref)
        newest = LagSample.objects.filter(**scope).aggregate(top=Max("at"))["top"]
        if newest is None:
            return []
        rows = LagSample.objects.filter(**scope, at__gte=newest - span).order_by("at", "partition_id")
        return list(rows.values_list("partition_id", "at", "sequence_number", "checkpoint_modified", "lag"))

    # handoff durations -----------------------------------------------------------------------

    def _follow_events(self) -> None:
        rows = EventLog.objects.filter(**EventLog.scope(self.ref))
        if self._tail is None:
            self._tail = int(rows.aggregate(top=Max("id"))["top"] or 0)
            return
        fresh = list(
            rows.filter(id__gt=self._tail).order_by("id").values_list("id", "kind", "partition_id", "reason", "at")[
                :TAIL_BATCH
            ]
        )
        for row_id, kind, pid, reason, at in fresh:
            self._tail = row_id
            if kind == "release" and reason.startswith("handed off"):
                self._releases[pid] = at
            elif kind == "claim" and reason == "released" and pid in self._releases:
                took = at - self._releases.pop(pid)
                if 0 <= took < 3600:
                    metrics.HANDOFF_DURATION.observe(took)
            elif kind in ("claim", "expire", "steal", "lost"):
                self._releases.pop(pid, None)


class Host:
    """The thread and event loop the monitors run on, and one thread for their database work."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._db: ThreadPoolExecutor | None = None
        self._monitors: dict[HubRef, Monitor] = {}
        self._tasks: dict[HubRef, asyncio.Task[None]] = {}
        self._stores: Stores | None = None

    def monitor(self, ref: HubRef) -> Monitor:
        """The monitor of ``ref``, started if it was not running."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._start_thread()
            found = self._monitors.get(ref)
            if found is None:
                found = self._monitors[ref] = Monitor(ref, self)
                assert self._loop is not None
                self._loop.call_soon_threadsafe(self._launch, found)
        found.touched = time.monotonic()
        return found

    def running(self, ref: HubRef) -> Monitor | None:
        """The monitor of ``ref`` if one is running (nothing is started)."""
        return self._monitors.get(ref)

    async def db(self, work: Callable[..., T], *args: Any) -> T:
        """Run ORM ``work`` on the monitors' database thread (one connection for all of them)."""
        with self._lock:
            if self._db is None:
                self._db = ThreadPoolExecutor(1, thread_name_prefix="leaseboard-monitor-db")
            db = self._db
        return await asyncio.get_running_loop().run_in_executor(db, _with_connection, work, *args)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every monitor, close the stores and the database connection, end the thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            self._close_db()  # monitors driven without the thread (tests) used the database thread only
            return
        with contextlib.suppress(RuntimeError):  # the loop may have stopped on its own
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)

    # the thread ------------------------------------------------------------------------------

    def _close_db(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.submit(connections.close_all).result()
            db.shutdown(wait=True)

    def _start_thread(self) -> None:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="leaseboard-monitor", daemon=True)
        self._thread.start()
        ready.wait()

    def _launch(self, monitor: Monitor) -> None:
        if self._stores is None:
            self._stores = build_stores()
        task = asyncio.get_running_loop().create_task(monitor.run(self._stores), name=f"monitor {monitor.ref}")
        self._tasks[monitor.ref] = task
        task.add_done_callback(lambda _: self._ended(monitor))

    def _ended(self, monitor: Monitor) -> None:
        with self._lock:
            if self._monitors.get(monitor.ref) is monitor:
                del self._monitors[monitor.ref]
            self._tasks.pop(monitor.ref, None)

    async def _shutdown(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._monitors.clear()
        stores, self._stores = self._stores, None
        if stores is not None:
            for store in {id(s): s for s in (stores.ownership, stores.checkpoints, stores.controls)}.values():
                close = getattr(store, "aclose", None)
                if close is not None:
                    with contextlib.suppress(Exception):
                        await close()
        db, self._db = self._db, None
        if db is not None:
            await asyncio.get_running_loop().run_in_executor(db, connections.close_all)
            db.shutdown(wait=True)


def _with_connection(work: Callable[..., T], *args: Any) -> T:
    close_old_connections()  # a connection the database dropped is replaced, as a request would
    return work(*args)


host = Host()


def monitor(ref: HubRef) -> Monitor:
    """The running monitor of ``ref`` (started on first use)."""
    return host.monitor(ref)
