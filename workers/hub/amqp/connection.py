"""One client connection: socket bytes, frames, proton's protocol engine, and the link handlers.

Bytes read from the socket are cut into frames (``frames.FrameSplitter``) and noted
(``notes.FrameNotes``: what proton's binding does not expose) before proton sees them. Everything
proton writes is completed (``frames.complete``) before it goes out. Proton's ``Transport`` and
``Collector`` are driven directly, without its reactor (which would re-open links on its own).

Failure modes, each answered and logged, never raised out of the event loop:
- bytes that are not AMQP frames go to proton unchanged, which closes the connection with a
  framing or decode error;
- a peer that sends no ``open`` within ``handshake_timeout`` (half-open: connected, then silent)
  is closed with ``amqp:resource-limit-exceeded``; after ``open``, proton's idle timeout does the
  same for a peer that stops sending (heartbeats included);
- an exception in a handler closes this connection with ``amqp:internal-error``; the other
  connections and the stored events are untouched.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from proton import Collector, Condition, Connection, Delivery, Event, Link, Session, Transport

import workers.hub.amqp.frames as frames
from workers.hub.amqp.notes import AttachInfo, FrameNotes

log = logging.getLogger("leaseboard.amqp")
trace = logging.getLogger("leaseboard.amqp.frames")  # DEBUG: every performative, decoded (payloads are not logged)
_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Limits:
    """What one connection may ask of the server, and how long it may stay silent."""

    max_frame_size: int = 256 * 1024
    max_message_size: int = 1024 * 1024  # what Event Hubs' standard tier takes
    idle_timeout: float = 120.0  # seconds without a frame from the peer; it is told half of it
    handshake_timeout: float = 30.0  # seconds from connecting to the peer's open
    write_buffer: int = 4 * 1024 * 1024  # stop pumping events into a connection that has this much unsent


class LinkHandler(Protocol):
    def on_flow(self) -> None: ...

    def on_delivery(self, delivery: Delivery) -> None: ...

    def on_detach(self) -> None:
        """The link is gone (detached by the peer or by us, or the connection ended)."""


class Router(Protocol):
    def attach(self, conn: AmqpConnection, link: Link, info: AttachInfo) -> LinkHandler | None:
        """Opens (or refuses) ``link``; returns its handler, None if it was refused."""

    def connection_opened(self, conn: AmqpConnection) -> None: ...

    def connection_closed(self, conn: AmqpConnection) -> None: ...

    def wake(self) -> None:
        """Something may be sendable now (a connection can take more bytes)."""


class AmqpConnection(asyncio.Protocol):
    """The engine of one socket. Handlers call :meth:`flush` after changing links outside an
    event (the server's event pump does it for them)."""

    def __init__(self, router: Router, limits: Limits, container_id: str) -> None:
        self.id = next(_ids)
        self.router = router
        self.limits = limits
        self.peer = "?"
        self.paused = False  # the socket's write buffer is full: pump no more events into it
        self.closed = False
        self.heartbeats = 0  # empty frames received: a quiet peer's proof of life
        self._container_id = container_id
        self._io: asyncio.Transport | None = None
        self._engine = Transport(Transport.SERVER)
        self._conn = Connection()
        self._collector = Collector()
        self._incoming = frames.FrameSplitter(limits.max_frame_size)
        self._outgoing = frames.FrameSplitter(1 << 32)
        self._notes = FrameNotes()
        self._handlers: dict[Link, LinkHandler] = {}  # proton's wrappers compare by the C object
        self._opened = False
        self._remote_closed = False
        self._eof = False
        self._transport_error = False
        self._timer: asyncio.TimerHandle | None = None
        self._handshake: asyncio.TimerHandle | None = None
        self._in_process = False

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._io = transport
        transport.set_write_buffer_limits(high=self.limits.write_buffer)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        engine = self._engine
        engine.max_frame_size = self.limits.max_frame_size
        engine.idle_timeout = self.limits.idle_timeout
        engine.sasl().allowed_mechs("ANONYMOUS")
        engine.require_auth(False)
        self._conn.container = self._container_id
        self._conn.collect(self._collector)
        engine.bind(self._conn)
        loop = asyncio.get_running_loop()
        self._handshake = loop.call_later(self.limits.handshake_timeout, self._handshake_expired)
        self.router.connection_opened(self)
        log.debug("connection %d from %s", self.id, self.peer)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self._guarded(self._receive, data)

    def eof_received(self) -> bool:
        if not self.closed:
            self._guarded(self._end_of_input)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            # After an AMQP close the peer may shut its socket before our close reaches it.
            level = logging.DEBUG if self._remote_closed else logging.INFO
            log.log(level, "connection %d from %s lost: %s", self.id, self.peer, exc)
        self._finish()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.router.wake()

    # -- for handlers ----------------------------------------------------------------------------

    def pop_format(self, link: Link) -> int:
        """The message format of the oldest delivery of ``link`` not yet taken (0 if unknown)."""
        return self._notes.pop_format(link.name)

    def flush(self) -> None:
        """Writes what proton has to send, completed; closes the socket once proton is done. A
        failure closes this connection (logged), never raises."""
        self._guarded(self._flush)

    def _flush(self) -> None:
        if self._io is None or self.closed:
            return
        engine = self._engine
        while True:
            pending = engine.pending()
            if pending < 0:
                self._io.close()
                return
            if pending == 0:
                break
            out = engine.peek(pending) or b""
            engine.pop(pending)
            self._io.write(self._complete(out))
        self._schedule_tick()

    def close(self, condition: str, description: str) -> None:
        """Closes the connection with an error (the peer gets a close frame, then EOF). Never raises."""
        self._guarded(self._close, condition, description)

    def _close(self, condition: str, description: str) -> None:
        if self.closed:
            return
        if self._opened:
            self._conn.condition = Condition(condition, description)
            self._conn.close()
        else:  # before the peer's open proton closes only as a transport error (open, then close)
            self._engine.condition = Condition(condition, description)
            self._engine.close_tail()
        self._process()
        if self._io is not None:
            self._io.close()  # after what is buffered has been written

    # -- inside ----------------------------------------------------------------------------------

    def _guarded(self, step: Any, *args: Any) -> None:
        try:
            step(*args)
        except Exception:
            log.exception("connection %d from %s: internal error; closing it", self.id, self.peer)
            try:
                self._conn.condition = Condition("amqp:internal-error", "the hub failed to handle this connection")
                self._conn.close()
                self._engine.close_tail()
                self._flush()
            except Exception:
                log.debug("connection %d: could not send the close frame", self.id, exc_info=True)
            if self._io is not None:
                self._io.close()  # the close frame, if one was written, goes out first
            self._finish()

    def _receive(self, data: bytes) -> None:
        splitter = self._incoming
        if splitter.error is not None:
            self._push(data)
        else:
            for item in splitter.feed(data):
                self._push(item if isinstance(item, bytes) else self._inspect(item))
                # Events frame by frame: what _inspect noted belongs to the frame proton just read
                # (a link name may be detached and attached again within one read).
                self._events()
            if splitter.error is not None:
                log.warning("connection %d from %s: %s; proton answers it", self.id, self.peer, splitter.error)
                self._push(splitter.take_rest())
        self._process()

    def _end_of_input(self) -> None:
        self._eof = True
        self._engine.close_tail()
        self._process()

    def _push(self, data: bytes) -> None:
        engine = self._engine
        view = memoryview(data)
        while view:
            capacity = engine.capacity()
            if capacity <= 0:  # the engine has stopped reading (closed, or an error it answered)
                return
            engine.push(bytes(view[:capacity]))
            view = view[capacity:]

    def _inspect(self, frame: frames.Frame) -> bytes:
        """The bytes to give proton for ``frame``, after noting what proton will not tell."""
        if frame.kind != 0 or not frame.body:
            self.heartbeats += not frame.body
            return frame.raw
        try:
            code, fields, _ = frames.decode(frame.body)
            if trace.isEnabledFor(logging.DEBUG):
                trace.debug("%d <- [%d] 0x%02x %r", self.id, frame.channel, code, fields)
            return self._notes.note(frame, code, fields)
        except (frames.FrameError, IndexError, TypeError, ValueError) as exc:
            log.warning("connection %d from %s: malformed frame (%s); proton answers it", self.id, self.peer, exc)
        return frame.raw

    def _complete(self, out: bytes) -> bytes:
        parts = []
        for item in self._outgoing.feed(out):
            if isinstance(item, bytes) or not item.body:
                parts.append(item if isinstance(item, bytes) else item.raw)
            else:
                parts.append(item.with_body(frames.complete(item.body)).raw)
                if trace.isEnabledFor(logging.DEBUG):
                    trace.debug("%d -> [%d] %r", self.id, item.channel, frames.decode(frames.complete(item.body))[:2])
        if self._outgoing.error is not None:
            raise frames.FrameError(f"proton wrote {self._outgoing.error}")
        return b"".join(parts)

    def _process(self) -> None:
        """Handles every event proton has queued, then writes what it has to send."""
        self._events()
        self._flush()

    def _events(self) -> None:
        if self._in_process:  # a handler closed something: the outer loop picks its events up
            return
        self._in_process = True
        try:
            while True:
                event = self._collector.peek()
                if event is None:
                    break
                self._dispatch(event)
                self._collector.pop()
        finally:
            self._in_process = False

    def _dispatch(self, event: Event) -> None:
        kind = event.type
        if kind in _CONNECTION_EVENTS:
            self._connection_event(kind)
        elif kind in (Event.SESSION_REMOTE_OPEN, Event.SESSION_REMOTE_CLOSE) and event.session is not None:
            self._session_event(kind, event.session)
        elif kind in _LINK_EVENTS and event.link is not None:
            self._link_event(kind, event.link)
        elif kind == Event.DELIVERY and event.delivery is not None:
            delivery = event.delivery
            handler = self._handlers.get(delivery.link)
            if handler is not None:
                handler.on_delivery(delivery)
            elif delivery.link.is_receiver and not delivery.partial:
                delivery.settle()

    def _connection_event(self, kind: Any) -> None:
        if kind == Event.CONNECTION_REMOTE_OPEN:
            self._opened = True
            if self._handshake is not None:
                self._handshake.cancel()
            if self._conn.state & Endpoint_LOCAL_UNINIT:
                self._conn.open()
        elif kind == Event.CONNECTION_REMOTE_CLOSE:
            self._remote_closed = True
            condition = self._conn.remote_condition
            if condition is not None:
                log.info("connection %d from %s closed by the peer: %s", self.id, self.peer, _describe(condition))
            self._drop_all()
            if self._conn.state & Endpoint_LOCAL_ACTIVE:
                self._conn.close()
        elif kind == Event.TRANSPORT_ERROR:
            self._transport_error = True
            condition = self._engine.condition
            if condition is not None and condition.description == "connection aborted":
                # The peer shut its socket without an AMQP close (a client killed or closed in a hurry).
                log.info("connection %d from %s: closed without an AMQP close frame", self.id, self.peer)
            else:
                text = _describe(condition) if condition is not None else "transport error"
                log.warning("connection %d from %s: %s", self.id, self.peer, text)
        elif kind == Event.TRANSPORT_TAIL_CLOSED:
            if not (self._eof or self._transport_error or self._remote_closed):
                # Proton stops reading at a frame it cannot decode, without a word: say it ourselves.
                log.warning("connection %d from %s: a frame could not be decoded; closing it", self.id, self.peer)
                self._engine.condition = Condition("amqp:decode-error", "a frame could not be decoded")
                self._engine.close_tail()  # proton now writes the close frame with the condition
        elif kind == Event.TRANSPORT_CLOSED:
            self._drop_all()

    def _session_event(self, kind: Any, session: Session) -> None:
        if kind == Event.SESSION_REMOTE_OPEN:
            if session.state & Endpoint_LOCAL_UNINIT:
                session.incoming_capacity = 4 * self.limits.max_message_size
                session.open()
            return
        for link in [link for link in self._handlers if link.session == session]:
            self._drop(link)
        if session.state & Endpoint_LOCAL_ACTIVE:
            session.close()

    def _link_event(self, kind: Any, link: Link) -> None:
        if kind == Event.LINK_REMOTE_OPEN:
            self._link_opened(link)
        elif kind == Event.LINK_FLOW:
            handler = self._handlers.get(link)
            if handler is not None:
                handler.on_flow()
        else:  # detached or closed by the peer
            self._drop(link)
            if link.state & Endpoint_LOCAL_ACTIVE:
                if kind == Event.LINK_REMOTE_CLOSE:
                    link.close()
                else:
                    link.detach()
            self._notes.forget(link.name, link.is_sender)
            link.free()  # proton keeps it until our detach is written

    def _link_opened(self, link: Link) -> None:
        info = self._notes.attach(link.name, link.is_sender)
        if info is None:  # cannot happen: every attach passed _inspect first
            info = AttachInfo(link.name, -1, -1, link.is_receiver, link.remote_source.address,
                              link.remote_target.address)  # fmt: skip
        handler = self.router.attach(self, link, info)
        if handler is not None:
            self._handlers[link] = handler

    def _drop(self, link: Link) -> None:
        handler = self._handlers.pop(link, None)
        if handler is not None:
            handler.on_detach()

    def _drop_all(self) -> None:
        handlers = list(self._handlers.values())
        self._handlers.clear()
        for handler in handlers:
            handler.on_detach()

    def _schedule_tick(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = self._engine.tick(loop.time())
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if deadline and not self.closed:
            self._timer = loop.call_at(deadline, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if not self.closed:
            self._guarded(self._process)

    def _handshake_expired(self) -> None:
        self._handshake = None
        if self._opened or self.closed:
            return
        log.warning(
            "connection %d from %s: no AMQP open within %gs (half-open); closing it",
            self.id, self.peer, self.limits.handshake_timeout,
        )  # fmt: skip
        self.close("amqp:resource-limit-exceeded", f"no open frame within {self.limits.handshake_timeout:g}s")

    def _finish(self) -> None:
        if self.closed:
            return
        self.closed = True
        for timer in (self._timer, self._handshake):
            if timer is not None:
                timer.cancel()
        self._drop_all()
        self.router.connection_closed(self)


Endpoint_LOCAL_UNINIT = Link.LOCAL_UNINIT
Endpoint_LOCAL_ACTIVE = Link.LOCAL_ACTIVE
_CONNECTION_EVENTS = frozenset({
    Event.CONNECTION_REMOTE_OPEN, Event.CONNECTION_REMOTE_CLOSE, Event.TRANSPORT_ERROR, Event.TRANSPORT_TAIL_CLOSED,
    Event.TRANSPORT_CLOSED,
})  # fmt: skip
_LINK_EVENTS = frozenset({Event.LINK_REMOTE_OPEN, Event.LINK_FLOW, Event.LINK_REMOTE_CLOSE, Event.LINK_REMOTE_DETACH})


def _describe(condition: Condition) -> str:
    return f"{condition.name}: {condition.description}" if condition.description else str(condition.name)
