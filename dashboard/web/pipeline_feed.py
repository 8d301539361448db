"""``/ws/pipeline/``: the pipeline's alerts as they are raised, and its live latency.

Messages to the client (JSON):
- ``{"type": "snapshot", "hub", "alerts": [...], "latency": {...}}`` — once, on connect: the
  SNAPSHOT newest alerts by event time, newest first (``Alert.as_json()``, as ``/api/pipeline``
  lists them), and the latency object of ``/api/pipeline`` (``pipeline_latency.latency``).
- ``{"type": "alerts", "alerts": [...]}`` — alerts raised since, oldest raised first, each at most
  once on a connection (neither one of the snapshot again, nor one raised by both paths).
- ``{"type": "latency", "latency": {...}}`` — about every LATENCY_EVERY seconds.
- ``{"type": "error", "error": "..."}`` — the database cannot be read: sent once per outage; the
  socket stays open and keeps trying (a snapshot or a latency message says it is over). Also the
  answer to any client frame: the socket is read-only (a frame over MAX_FRAME, or more than
  FLOOD_FRAMES in FLOOD_WINDOW seconds, closes it as ``/ws/balancer/`` does).

Every alert sent is read from the ``Alert`` table, not taken from a message: the group message
(``workers.alerts.notify`` to ``workers.alerts.group_name(hub)``) only wakes this process's reader of
the hub's alerts (``pipeline_tail.Tail``, shared by the hub's sockets), which also reads every
``pipeline_tail.POLL_EVERY`` seconds, so alerts raised in processes the channel layer does not reach
arrive too. The snapshot is read after the socket joined the reader, and what the socket has sent of
the window the reader looks back over is kept (``pipeline_tail.Sent``), so no alert is missed or sent
twice on one socket.
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

from workers.alerts import group_name

from ..live.health import report
from ..live.state import parse_ref
from .consumers import CLOSE_FLOOD, CLOSE_TOO_BIG, CLOSE_TRY_LATER, FLOOD_FRAMES, FLOOD_WINDOW, MAX_FRAME, READ_ONLY
from .pipeline_tail import LATENCY_EVERY, First, Json, Sent, Subscriber, Tail, first_read, reads, subscribe, unsubscribe
from .sockets import SEATS, client_of

log = logging.getLogger(__name__)

RETRY_EVERY = 1.0  # seconds between snapshot attempts while the database is down
RELEASE_WAIT = 2.0  # seconds a closing socket waits for its pump and its connection to end

_open = 0  # pipeline sockets connected in this process


def open_sockets() -> int:
    """Pipeline sockets connected in this process."""
    return _open


class PipelineFeedConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    """Streams the alerts and latency of one hub (``?hub=``, default: the configured one). The read
    rule is applied before it is built (``access.ReadRuleSocket``). Whatever ends it, ``_release``
    stops what ``connect`` started."""

    pump: asyncio.Task[None] | None = None
    tailing: tuple[Tail, Subscriber] | None = None
    grouped = False
    seated = False
    counted = False
    stopping = False
    closing = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()

    async def connect(self) -> None:
        self.wake = asyncio.Event()
        self.frames: deque[float] = deque()
        query = parse_qs(self.scope.get("query_string", b"").decode("latin1"))
        await self.accept()
        try:
            self.hub = parse_ref(query.get("hub", [""])[0], None).hub
        except ValueError as exc:
            await self.send_json({"type": "error", "error": str(exc)})
            await self.close(code=4400)
            return
        self.seat = client_of(self.scope)
        refused = SEATS.take(*self.seat)
        if refused is not None:
            await self.send_json({"type": "error", "error": refused})
            await self.close(code=CLOSE_TRY_LATER)
            return
        self.seated = True
        if self.channel_layer is not None:
            try:
                await self.channel_layer.group_add(group_name(self.hub), self.channel_name)
                self.grouped = True
            except Exception as exc:  # no wake-ups then: the tail's poll still finds every alert
                log.info("pipeline alert feed without the channel layer: %s", exc)
        global _open
        _open += 1
        self.counted = True
        self.tailing = subscribe(self.hub, self.wake.set)  # before the snapshot: nothing read after it is lost
        self.pump = asyncio.create_task(self._run(), name=f"pipeline socket {self.hub}")

    async def disconnect(self, code: int) -> None:
        await self._release()

    async def _release(self) -> None:
        """Stop what ``connect`` started; safe to call more than once and from any state."""
        self.stopping = True
        pump, self.pump = self.pump, None
        if pump is not None:
            pump.cancel()
        tailing, self.tailing = self.tailing, None
        if tailing is not None:
            unsubscribe(*tailing)
        if self.seated:
            self.seated = False
            SEATS.give_back(*self.seat)
        last = False
        if self.counted:
            self.counted = False
            global _open
            _open -= 1
            last = _open == 0
        if pump is not None:
            await asyncio.wait([pump], timeout=RELEASE_WAIT)
        grouped, self.grouped = self.grouped, False
        if grouped and self.channel_layer is not None:
            with contextlib.suppress(Exception):
                await self.channel_layer.group_discard(group_name(self.hub), self.channel_name)
        if last:
            with contextlib.suppress(Exception):  # nobody left to read for: the kept connection goes
                await asyncio.wait_for(reads.aclose_connection(), RELEASE_WAIT)

    async def pipeline_alerts(self, message: Json) -> None:
        """``workers.alerts.notify``: new alerts are committed; read now rather than at the next poll."""
        if self.tailing is not None and message.get("hub", self.hub) == self.hub:
            self.tailing[0].wake()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        """Any client frame is answered with the read-only refusal; a flood or a big frame closes."""
        if self.closing:
            return
        now = time.monotonic()
        self.frames.append(now)
        while self.frames and self.frames[0] <= now - FLOOD_WINDOW:
            self.frames.popleft()
        size = len(text_data) if text_data is not None else len(bytes_data or b"")
        if len(self.frames) > FLOOD_FRAMES or size > MAX_FRAME:
            self.closing = True
            await self._release()
            flood = len(self.frames) > FLOOD_FRAMES
            reason = f"more than {FLOOD_FRAMES} frames in {FLOOD_WINDOW:.0f}s" if flood else f"frame over {MAX_FRAME}"
            await self.close(code=CLOSE_FLOOD if flood else CLOSE_TOO_BIG, reason=reason)
            return
        await self.send_json({"type": "error", "error": READ_ONLY, "code": "read_only"})

    # the pump: the only coroutine that sends after connect -----------------------------------

    async def _run(self) -> None:
        first = await self._first()
        if first is None:
            return
        sent = Sent(first)
        await self.send_json({"type": "snapshot", "hub": self.hub, "alerts": first.alerts, "latency": first.latency})
        told: str | None = None
        if self.tailing is None:
            return  # released meanwhile
        tail, subscriber = self.tailing
        latency_version = tail.latency_version
        while not self.stopping:
            self.wake.clear()
            fresh = [row for since, rows in subscriber.take() for row in sent.fresh(since, rows)]
            if fresh:
                fresh.sort(key=lambda row: (row["raised_at"], row["partition_id"], row["sequence_number"]))
                await self.send_json({"type": "alerts", "alerts": fresh})
            if tail.error is not None and tail.error != told:
                await self.send_json({"type": "error", "error": tail.error})
            told = tail.error
            if tail.latency_version != latency_version and tail.latency is not None and tail.error is None:
                latency_version = tail.latency_version
                await self.send_json({"type": "latency", "latency": tail.latency})
            with contextlib.suppress(TimeoutError):  # the tail wakes it; the timeout is a safety net
                async with asyncio.timeout(LATENCY_EVERY):
                    await self.wake.wait()

    async def _first(self) -> First | None:
        """The first read, tried until the database answers (saying once that it does not)."""
        told = False
        while not self.stopping:
            try:
                return await reads.acall(first_read, self.hub)
            except Exception as exc:
                found = report(exc)
                if found is None:
                    log.warning("pipeline alert feed snapshot failed: %s: %s", type(exc).__name__, exc)
                if not told:
                    told = True
                    reason = found.reason if found is not None else f"alerts unavailable: {type(exc).__name__}"
                    await self.send_json({"type": "error", "error": reason})
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RETRY_EVERY):
                    await self.wake.wait()
            self.wake.clear()
        return None
