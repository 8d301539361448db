"""``/ws/balancer/``: a snapshot on connect, then deltas, every balancer event, and the audit log.

Messages to the client (JSON):
- ``{"type": "snapshot", "state": {...}}`` — once, on connect: the monitor's latest state
  (``ConsoleState.as_json()``, the ``/api/state`` shape); the page loads nothing else to start.
- ``{"type": "history", "events": [...]}`` — once, after it: recent events already reflected in it.
- ``{"type": "audit", "entries": [...]}`` — once with the recent audit log, then each new entry.
- ``{"type": "delta", ...}`` — about once a second: what changed since the last state sent, field
  by field (``live/delta.py``), with the new ``last_event_id``.
- ``{"type": "events", "events": [...], "sent_at": t}`` — new events, each exactly once, in id order
  (``sent_at``: the server's clock when it sent them, for measuring the last leg).
- ``{"type": "error", "error": "..."}`` — the store could not be read (the socket stays open), or the
  client sent something (the socket is read-only: actions are HTTP POSTs with a staff login and
  CSRF token). Whoever may not read never reaches this consumer (``access.ReadRuleSocket``: close 4401).

A page applies exactly the events above a state's ``last_event_id`` on top of it; a state is read
after that watermark, so every event at or below it is already reflected (see ``live/state.py``). Before
each delta, every event committed so far is sent, so the page's feed is complete to the watermark.

Every event sent comes from the EventLog table, not from the channel-layer message: the message
only wakes the process's reader of the log (``feed.py``: one per hub, shared by every socket, which
pushes what it reads). That is what makes delivery whole when workers run in other processes
without Redis (the in-memory layer does not cross processes, and drops messages to a full
channel), and it keeps one order for both paths; late-committing rows are the feed's to find. A
socket reads the log itself once, to catch up from its snapshot's watermark to the feed, so an idle
socket costs no query.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from balancer.model import HubRef

from ..control.audit import recent_audit
from ..live.broadcast import GROUP
from ..live.console import Json
from ..live.delta import delta
from ..live.health import Outage, health, report
from ..live.host import FIRST_ROUND_SECONDS, Full, current_state, host, unknown
from ..live.monitor import Monitor
from ..live.state import parse_ref
from ..models import EventLog
from . import feed
from .access import audit_for, events_for
from .feed import AUDIT, BATCH, POLL_EVERY, SETTLE, unsent
from .feed import reads as _feed
from .sockets import SEATS, client_of

log = logging.getLogger(__name__)

STALE_AFTER = 2.5  # seconds without a monitor round before a delta is read here instead
HISTORY = 50
CHANNEL_LAYER = "channel layer"
READ_ONLY = "this socket is read-only: actions are POSTed to /api/actions/ with a staff login and a CSRF token"
MAX_FRAME = 4096  # characters (or bytes) of one client frame; larger: closed with 4413
FLOOD_FRAMES = 10  # client frames allowed per FLOOD_WINDOW seconds; more: closed with 4429
FLOOD_WINDOW = 10.0
CLOSE_TOO_BIG = 4413
CLOSE_FLOOD = 4429
CLOSE_UNKNOWN = 4404  # a hub and consumer group the store does not know: nothing is started for it
# LEASEBOARD_SOCKETS_MAX sockets open, every monitor slot taken, or the store down: 503's number in the
# private range, as the others here. Daphne sends no close code but 1000 and 3000-4999 (1013, "try
# again later", made it answer 1011 with a traceback instead).
CLOSE_TRY_LATER = 4503


_open = 0  # consumers connected in this process
_pumps: set[asyncio.Task[None]] = set()  # every running pump, so a test can see none is left


def open_sockets() -> int:
    """Consumers streaming in this process."""
    return _open


def _history(ref: HubRef, upto: int, limit: int) -> list[dict[str, Any]]:
    rows = EventLog.objects.filter(**EventLog.scope(ref), id__lte=upto).order_by("-id")[:limit]
    return [row.as_json() for row in reversed(list(rows))]


class BalancerConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    """Streams one hub and consumer group (``?hub=&consumer_group=``, default: the configured ones).

    Any client frame is answered: JSON text with the read-only refusal, other text or a binary frame
    with an error naming it (the socket stays open), a frame over MAX_FRAME or more than
    FLOOD_FRAMES within FLOOD_WINDOW seconds with a close (4413, 4429). Whatever ends the consumer
    (a close, an exception anywhere), ``_release`` runs and stops what ``connect`` started.
    """

    pump: asyncio.Task[None] | None = None
    watching: tuple[Monitor, int] | None = None
    feeding: tuple[feed.Feed, feed.Subscriber] | None = None
    grouped = False
    counted = False
    seated = False
    stopping = False  # set by _release: the pump ends at its next turn even if a cancel was lost

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()

    async def connect(self) -> None:
        self.pump = None
        self.wake = asyncio.Event()
        self.last_sent: int | None = None  # None until the first snapshot went out
        self.sent: set[int] = set()  # ids above the floor already sent
        self.marks: deque[tuple[float, int]] = deque()  # (monotonic time, last_sent then)
        self.since = 0  # the snapshot's watermark: every event at or below it is in the state sent
        self.state: Json | None = None  # the state the page has
        self.version = 0
        self.audit_after = 0
        self.error: str | None = None
        self.frames: deque[float] = deque()  # monotonic times of the client's recent frames
        self.closing = False
        query = parse_qs(self.scope.get("query_string", b"").decode("latin1"))
        await self.accept()
        try:
            self.ref = parse_ref(query.get("hub", [""])[0], query.get("consumer_group", [""])[0])
        except ValueError as exc:
            await self.send_json({"type": "error", "error": str(exc)})
            await self.close(code=4400)
            return
        self.seat = client_of(self.scope)
        refused = SEATS.take(*self.seat)  # sockets.py: per client, and some kept for signed-in users
        if refused is not None:
            await self.send_json({"type": "error", "error": refused})
            await self.close(code=CLOSE_TRY_LATER)
            return
        self.seated = True
        try:
            watched = await host.admit(self.ref)
        except Exception as exc:  # the store cannot say whether it knows the hub, or no monitor slot is free
            if not isinstance(exc, Full) and report(exc) is None:
                raise
            await self.send_json({"type": "error", "error": str(exc)})
            await self.close(code=CLOSE_TRY_LATER)
            return
        if watched is None:
            await self.send_json({"type": "error", "error": unknown(self.ref)})
            await self.close(code=CLOSE_UNKNOWN)
            return
        await self._join_group()
        self.grouped = True
        loop = asyncio.get_running_loop()

        def wake() -> None:
            loop.call_soon_threadsafe(self.wake.set)

        self.watching = (watched, watched.subscribe(wake))
        global _open
        _open += 1
        self.counted = True
        self.pump = asyncio.create_task(self._run())
        _pumps.add(self.pump)
        self.pump.add_done_callback(_pumps.discard)  # the registry holds exactly the pumps still running

    async def disconnect(self, code: int) -> None:
        await self._release()

    async def _release(self) -> None:
        """Stop what ``connect`` started; safe to call more than once, from any state, and while
        this task is itself being cancelled (what needs no wait is done before the first await)."""
        self.stopping = True
        pump, self.pump = self.pump, None
        if pump is not None:
            pump.cancel()
        watching, self.watching = self.watching, None
        if watching is not None:
            watching[0].unsubscribe(watching[1])
        feeding, self.feeding = self.feeding, None
        if feeding is not None:
            feed.unsubscribe(*feeding)
        if self.seated:
            self.seated = False
            SEATS.give_back(*self.seat)
        last = False
        if self.counted:
            self.counted = False
            global _open
            _open -= 1
            last = _open == 0
        grouped, self.grouped = self.grouped, False
        if pump is not None:
            await asyncio.wait([pump])  # cancellation of this task propagates; the pump's own is not raised
        if grouped and self.channel_layer is not None:
            with contextlib.suppress(Exception):  # a channel layer that is down forgets the group anyway
                await self.channel_layer.group_discard(GROUP, self.channel_name)
        if last:
            with contextlib.suppress(Exception):
                await _feed.aclose_connection()  # nobody left to read for: the kept connection goes

    async def _refuse(self, code: int, reason: str) -> None:
        """Stop streaming, then close: nothing more is sent on this socket."""
        self.closing = True
        await self._release()
        await self.close(code=code, reason=reason)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        """Every client frame lands here, whatever it holds; none raises."""
        if self.closing:
            return
        now = time.monotonic()
        self.frames.append(now)
        while self.frames and self.frames[0] <= now - FLOOD_WINDOW:
            self.frames.popleft()
        if len(self.frames) > FLOOD_FRAMES:
            await self._refuse(CLOSE_FLOOD, f"more than {FLOOD_FRAMES} frames in {FLOOD_WINDOW:.0f}s")
            return
        size = len(text_data) if text_data is not None else len(bytes_data or b"")
        if size > MAX_FRAME:
            await self._refuse(CLOSE_TOO_BIG, f"frame over {MAX_FRAME} characters")
            return
        if text_data is None:
            await self.send_json({"type": "error", "error": "binary frames are not accepted", "code": "bad_frame"})
            return
        try:
            content = await self.decode_json(text_data)
        except (ValueError, RecursionError):  # not JSON, or nested past the recursion limit
            await self.send_json({"type": "error", "error": "frames must be JSON text", "code": "bad_frame"})
            return
        await self.receive_json(content, **kwargs)

    async def _join_group(self) -> None:
        """Join the group workers publish to; when the channel layer (Redis) is down the socket still
        streams, by polling the event log (every event sent comes from there anyway)."""
        if self.channel_layer is None:
            return
        try:
            await self.channel_layer.group_add(GROUP, self.channel_name)
        except Exception as exc:
            health.failed(Outage(CHANNEL_LAYER, f"channel layer unavailable: {type(exc).__name__}: {exc}"))
        else:
            health.ok(CHANNEL_LAYER)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The page never needs to send; an attempt to act here is refused, whoever is logged in."""
        await self.send_json({"type": "error", "error": READ_ONLY, "code": "read_only"})

    async def balancer_event(self, message: dict[str, Any]) -> None:
        """A worker published an event: read the log now rather than at the next poll."""
        event = message.get("event") or {}
        if (event.get("namespace"), event.get("hub"), event.get("consumer_group")) == (
            self.ref.namespace,
            self.ref.hub,
            self.ref.consumer_group,
        ) and self.feeding is not None:
            self.feeding[0].wake()

    # the pump: the only coroutine that sends after connect --------------------------------

    async def _run(self) -> None:
        assert self.watching is not None
        watched = self.watching[0]
        await self._send_first(watched)
        while not self.stopping:
            try:
                await self._flush()
                if watched.version != self.version or watched.error != self.error:
                    await self._send_state(watched)
                elif watched.error is None and time.monotonic() - watched.updated > STALE_AFTER and self.state:
                    stuck = await current_state(self.ref, _feed)  # the monitor is stuck: read here
                    await self._send_state_of(stuck.as_json(), watched.version)
            except Exception as exc:  # a database hiccup must not end the stream; the next round retries
                if report(exc) is None:  # an outage is logged once by health, not per socket and poll
                    log.warning("balancer websocket round failed: %s: %s", type(exc).__name__, exc)
            with contextlib.suppress(TimeoutError):  # asyncio.timeout: wait_for (3.11) can swallow a cancel
                async with asyncio.timeout(POLL_EVERY):
                    await self.wake.wait()
            self.wake.clear()

    async def _send_first(self, watched: Monitor) -> None:
        await watched.first_round(FIRST_ROUND_SECONDS)
        published = watched.published if watched.error is None else None
        state = published.json if published is not None else None
        while state is None:
            if self.stopping:
                return
            try:  # the monitor has not read the store yet (or cannot)
                state = (await current_state(self.ref, _feed)).as_json()
            except Exception as exc:
                found = report(exc)
                await self.send_json({"type": "error", "error": found.reason if found else f"store unavailable: {exc}"})
                await asyncio.sleep(1.0)
        self.state, self.version = state, int(state.get("version") or 0)
        watermark = int(state["last_event_id"])
        await self.send_json({"type": "snapshot", "state": state})
        history: list[dict[str, Any]] = await _feed.acall(_history, self.ref, watermark, HISTORY)
        await self.send_json({"type": "history", "events": events_for(self.scope.get("user"), history)})
        entries: list[dict[str, Any]] = await _feed.acall(recent_audit, self.ref, AUDIT)
        self.audit_after = max((int(e["id"]) for e in entries), default=0)
        await self.send_json({"type": "audit", "entries": audit_for(self.scope.get("user"), entries[::-1])})
        self.last_sent = self.since = watermark
        self.marks.append((time.monotonic(), watermark))
        self.feeding = feed.subscribe(self.ref, watermark, self.wake.set)  # the feed runs on this loop
        await self._catch_up(watermark)

    async def _catch_up(self, watermark: int) -> None:
        """Send the events above ``watermark`` committed so far (the feed may have read past it before
        this socket joined); what the feed delivers meanwhile as well is sent once."""
        after = watermark
        while True:
            rows: list[dict[str, Any]] = await _feed.acall(unsent, self.ref, after, after, frozenset(), BATCH)
            await self._send_events(rows)
            if len(rows) < BATCH:
                return
            after = max(row["id"] for row in rows)

    async def _send_state(self, watched: Monitor) -> None:
        self.error = watched.error
        if watched.error is not None:
            await self.send_json({"type": "error", "error": watched.error})
            return
        published = watched.published
        if published is None:
            return
        version = published.state.version or 0
        if published.delta is not None and version == self.version + 1:
            # the common case: one diff for every page
            await self._send_delta(published.json, published.delta, published.read_at)
        else:
            await self._send_state_of(published.json, version, published.read_at)
        self.version = version

    async def _send_state_of(self, state: Json, version: int, read_at: float | None = None) -> None:
        assert self.state is not None
        await self._send_delta(state, delta(self.state, state), read_at)
        self.version = version

    async def _send_delta(self, state: Json, message: Json, read_at: float | None) -> None:
        # Everything committed when the state was read goes out first; the client replays the events
        # above the delta's watermark on top of it, so none is lost whichever side of the read it fell on.
        if self.feeding is not None:
            await self.feeding[0].read_now(read_at)  # the sockets sending one round's delta share one read
        await self._flush()
        await self.send_json(message)
        self.state = state
        await self._flush_audit(read_at)

    async def _flush_audit(self, read_at: float | None) -> None:
        if self.feeding is None:
            return
        entries = await self.feeding[0].audit_after(self.audit_after, read_at)
        if entries:
            self.audit_after = max(int(e["id"]) for e in entries)
            await self.send_json({"type": "audit", "entries": audit_for(self.scope.get("user"), entries[::-1])})

    async def _flush(self) -> None:
        """Send what the feed delivered and this socket has not sent."""
        if self.feeding is not None:
            await self._send_events(self.feeding[1].take())

    async def _send_events(self, rows: list[dict[str, Any]]) -> None:
        """Send ``rows`` above the snapshot's watermark not sent yet, in id order, BATCH a message."""
        if self.last_sent is None:
            return
        self._floor()
        fresh = sorted((row for row in rows if row["id"] > self.since and row["id"] not in self.sent), key=_id)
        for start in range(0, len(fresh), BATCH):
            chunk = fresh[start : start + BATCH]
            shown = events_for(self.scope.get("user"), chunk)
            await self.send_json({"type": "events", "events": shown, "sent_at": time.time()})
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "sent %d events, the oldest reported %.0f ms ago",
                    len(chunk),
                    (time.time() - min(row["at"] for row in chunk)) * 1000,
                )
        for row in fresh:
            self.sent.add(row["id"])
        if fresh:
            self.last_sent = max(self.last_sent, fresh[-1]["id"])
        self.marks.append((time.monotonic(), self.last_sent))

    def _floor(self) -> int:
        """``last_sent`` as it stood SETTLE seconds ago; forget sent ids at or below it (the feed
        delivers none of them again, and the catch-up is long over)."""
        assert self.last_sent is not None
        horizon = time.monotonic() - SETTLE
        while len(self.marks) > 1 and self.marks[1][0] <= horizon:
            self.marks.popleft()
        floor = self.marks[0][1] if self.marks else self.last_sent
        self.sent = {i for i in self.sent if i > floor}
        return floor


def _id(row: dict[str, Any]) -> int:
    return int(row["id"])
