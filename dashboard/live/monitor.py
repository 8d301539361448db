"""The console's watcher: one per hub and consumer group per dashboard process (run by ``host.py``).

Every ``ROUND_SECONDS`` a monitor reads the state (``state.read``) and works out what a single read
cannot say (``console.Figures``): lag in seconds (``enqueued.py``), checkpointed events per second
per partition (over ``RATE_SECONDS``), and the partition status (``lag.py``), judged on a sample
taken every ``LEASEBOARD_LAG_SAMPLE_SECONDS``. Samples are kept in ``LagSample`` for
``LEASEBOARD_LAG_RETENTION_SECONDS`` (the partition page's chart and checkpoint history) and read
back when a monitor starts, so a restart does not forget a stalled partition.

Every websocket of the process reads the monitor's latest state and the delta to it, so 100
open pages cost one store read a second, not 100; ``/metrics`` serves it too, and ``/api/state``
takes its figures. A monitor nobody asked for in ``IDLE_SECONDS`` stops, except the configured hub's.

The monitor also tails the event log to time handoffs (a planned release until the next claim of
that partition) for ``leaseboard_handoff_duration_seconds``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from django.conf import settings
from django.db.models import Max

from balancer.model import HubRef
from workers.sources.base import EventSource
from workers.wiring import Stores, hub_ref

from ..dbthread import DatabaseThread
from ..models import EventLog, LagSample
from . import metrics
from .console import ConsoleState, Figures, Json
from .delta import delta
from .enqueued import EnqueuedTimes
from .health import DATABASE_ERRORS, outage, report
from .lag import Rules, Sample, Status, Window, lag_seconds
from .state import lag_rules, read, with_source

log = logging.getLogger(__name__)

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


@dataclass(frozen=True, slots=True)
class Published:
    """One round's result, replaced whole so a reader on another thread sees one consistent version."""

    state: ConsoleState  # with figures and ``version``
    json: Json  # ``state.as_json()``, made once for every socket; never changed in place
    delta: Json | None  # the delta message from the previous version to this one (None for the first)
    read_at: float = 0.0  # monotonic time the round's read of the store ended (every event up to
    # ``state.last_event_id`` had committed by then)


class Monitor:
    """Watches one hub and consumer group; its ORM work runs on ``db``. ``published``, ``error``,
    ``figures`` and ``updated`` may be read from any thread (each is replaced whole)."""

    def __init__(self, ref: HubRef, db: DatabaseThread) -> None:
        self.ref = ref
        self.db = db
        self.published: Published | None = None
        self.error: str | None = None
        self.figures: Figures | None = None  # of the last round that read the store
        self.updated = 0.0  # monotonic time of the last round that read the store
        self.ready = threading.Event()  # set after the first round, good or not
        self.touched = time.monotonic()
        self.keep = False  # never stops for want of viewers (the configured hub's, and serve's)
        self.lag_rules = lag_rules()
        self.rules = Rules(self.lag_rules.window, self.lag_rules.stop_seconds)
        self.sample_seconds = self.lag_rules.sample_seconds
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

    @property
    def state(self) -> ConsoleState | None:
        published = self.published
        return published.state if published is not None else None

    @property
    def version(self) -> int:
        published = self.published
        return published.state.version or 0 if published is not None else 0

    async def first_round(self, timeout: float) -> None:
        """Return once the first round is done (good or not), or after ``timeout`` seconds. Polled on
        the caller's loop, not waited for on a thread: a caller cancelled meanwhile (a socket closed
        as soon as it opened) leaves no thread blocked behind it."""
        deadline = time.monotonic() + timeout
        while not self.ready.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

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

    def fresh(self, max_age: float) -> ConsoleState | None:
        """The latest state if a round read the store within ``max_age`` seconds, else None."""
        self.touched = time.monotonic()
        state = self.state
        if state is None or self.error is not None or time.monotonic() - self.updated > max_age:
            return None
        return state

    def fresh_figures(self, max_age: float) -> Figures | None:
        """The latest figures if a round read the store within ``max_age`` seconds, else None."""
        figures = self.figures
        if figures is None or self.error is not None or time.monotonic() - self.updated > max_age:
            return None
        return figures

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
        """Read, work out the figures, maybe sample, then publish one new version."""
        if not self._primed:
            try:
                await self._prime()
                self._primed = True
            except DATABASE_ERRORS as exc:  # the database is down: prime once it answers
                report(exc)
        try:
            plain = await read(self.ref, db=self.db, stores=stores)
        except Exception as exc:  # the store is down: keep the last state, say why (read told health)
            found = outage(exc)
            error = found.reason if found is not None else f"store unavailable: {type(exc).__name__}: {exc}"
            if found is None and error != self.error:
                log.warning("monitor of %s/%s cannot read the state: %s", self.ref.hub, self.ref.consumer_group, error)
            self.error = error
            self._publish(None)
            return
        self.error = None
        self.updated = time.monotonic()
        now = plain.generated_at
        await self._lookup_times(plain)
        rates = self._rates_of(plain, now)
        if self.sampled_at is None or now - self.sampled_at >= self.sample_seconds - ROUND_SECONDS / 2:
            await self._sample(plain, now)
        self.figures = Figures(self.lag_rules, dict(self._lag_seconds), dict(self.statuses), rates, self.sampled_at)
        try:
            await self.db.acall(self._follow_events)
        except DATABASE_ERRORS as exc:  # the store answered, the event log did not: the state still goes out
            report(exc)
        self._publish(plain.with_figures(self.figures))

    def _publish(self, state: ConsoleState | None) -> None:
        if state is not None:
            previous = self.published
            state = replace(state, version=self.version + 1)
            json = state.as_json()
            changed = delta(previous.json, json) if previous is not None else None
            self.published = Published(state, json, changed, self.updated)
        self.ready.set()
        with self._lock:
            wakers = list(self._subscribers.items())
        for token, wake in wakers:
            try:
                wake()
            except RuntimeError:  # the subscriber's event loop has closed
                self.unsubscribe(token)

    @property
    def watched(self) -> bool:
        """Whether a socket follows this monitor."""
        with self._lock:
            return bool(self._subscribers)

    def _idle(self) -> bool:
        if self.keep or self.ref == hub_ref():
            return False
        with self._lock:
            watched = bool(self._subscribers)
        return not watched and time.monotonic() - self.touched > IDLE_SECONDS

    # lag in seconds and rates ----------------------------------------------------------------

    async def _lookup_times(self, state: ConsoleState) -> None:
        wanted: dict[str, int] = {}
        for p in state.partitions:
            if p.lag:
                wanted[p.id] = p.sequence_number if p.sequence_number is not None else -1

        def look(source: EventSource) -> dict[str, float]:
            return self._times.lookup(source, wanted, LOOKUP_BUDGET)

        found = (await asyncio.to_thread(with_source, self.ref.hub, look)) if wanted else {}
        for p in state.partitions:
            if not p.lag:
                self._lag_seconds[p.id] = 0.0 if p.lag == 0 else None
            elif p.id in (found or {}):
                self._lag_seconds[p.id] = lag_seconds(p.last_enqueued_time, (found or {})[p.id], p.lag)
            # else: not read in time this round; the last figure stands until the next one

    def _rates_of(self, state: ConsoleState, now: float) -> dict[str, float]:
        """Checkpointed events per second per partition over the last RATE_SECONDS."""
        current = {p.id: p.sequence_number for p in state.partitions if p.sequence_number is not None}
        self._rates.append((now, current))
        while len(self._rates) > 2 and now - self._rates[1][0] >= RATE_SECONDS:
            self._rates.popleft()
        then, old = self._rates[0]
        span = now - then
        if span <= 0:
            return {}
        return {pid: max(0, seq - old[pid]) / span for pid, seq in current.items() if pid in old and seq >= old[pid]}

    # samples and status ----------------------------------------------------------------------

    def _window(self, pid: str) -> Window:
        window = self.windows.get(pid)
        if window is None:
            window = self.windows[pid] = Window(self.rules)
        return window

    async def _sample(self, state: ConsoleState, now: float) -> None:
        self.sampled_at = now
        rows = []
        scope = LagSample.scope(self.ref)
        for p in state.partitions:
            sample = Sample(now, p.sequence_number, p.checkpoint_modified, p.lag)
            status = self._window(p.id).add(sample)
            self.statuses[p.id] = status
            rows.append(
                LagSample(
                    **scope,
                    partition_id=p.id,
                    at=now,
                    owner_id=p.owner or "",
                    sequence_number=p.sequence_number,
                    checkpoint_modified=p.checkpoint_modified,
                    last_enqueued_sequence_number=p.last_enqueued_sequence_number,
                    lag=p.lag,
                    lag_seconds=self._lag_seconds.get(p.id),
                    status=status.value if status is not None else "",
                )
            )
        for gone in set(self.windows) - {p.id for p in state.partitions}:
            self.windows.pop(gone, None)
            self.statuses.pop(gone, None)
        prune = now - self._pruned >= PRUNE_SECONDS
        if prune:
            self._pruned = now
        try:
            await self.db.acall(self._store_samples, rows, now, prune)
        except DATABASE_ERRORS as exc:  # the statuses stand; this round's samples are not kept
            report(exc)

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
        rows = await self.db.acall(self._stored_samples, span)
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
        fields = ("id", "kind", "partition_id", "reason", "at", "handoff")
        fresh = list(rows.filter(id__gt=self._tail).order_by("id").values_list(*fields)[:TAIL_BATCH])
        for row_id, kind, pid, reason, at, handoff in fresh:
            self._tail = row_id
            if kind == "release" and handoff:
                self._releases[pid] = at
            elif kind == "claim" and reason == "released" and pid in self._releases:
                took = at - self._releases.pop(pid)
                if 0 <= took < 3600:
                    metrics.HANDOFF_DURATION.observe(took)
            elif kind in ("claim", "expire", "steal", "lost"):
                self._releases.pop(pid, None)
