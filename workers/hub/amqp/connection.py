"""One client connection: the socket, proton's protocol engine, the connection's lifetime and timers.

The bytes between the socket and proton go through ``wire.Wire`` (frames cut, noted and completed);
sessions, links and their handlers are ``endpoints.Endpoints``. Proton's ``Transport`` and
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
from typing import Any, Protocol

from proton import Collector, Condition, Connection, Event, Link, Transport

from workers.hub.amqp.endpoints import Endpoint_LOCAL_ACTIVE, Endpoint_LOCAL_UNINIT, Endpoints, LinkHandler
from workers.hub.amqp.limits import Limits
from workers.hub.amqp.notes import AttachInfo, FrameNotes
from workers.hub.amqp.wire import Wire

__all__ = ["AmqpConnection", "Limits", "LinkHandler", "Router"]  # Limits, LinkHandler: imported from here too

log = logging.getLogger("leaseboard.amqp")
_ids = itertools.count(1)


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
        self._container_id = container_id
        self._io: asyncio.Transport | None = None
        self._engine = Transport(Transport.SERVER)
        self._conn = Connection()
        self._collector = Collector()
        self._notes = FrameNotes()
        self._wire = Wire(self.id, self._engine, self._notes, limits.max_frame_size)
        self._endpoints = Endpoints(limits, self._notes, self._attach)
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
        self.peer = self._wire.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        engine = self._engine
        engine.max_frame_size = self.limits.max_frame_size
        engine.idle_timeout = 2 * self.limits.idle_timeout  # proton advertises half of it
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

    @property
    def heartbeats(self) -> int:
        """Empty frames received: a quiet peer's proof of life."""
        return self._wire.heartbeats

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
            self._io.write(self._wire.complete(out))
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
        self._wire.receive(data, self._events)
        self._process()

    def _end_of_input(self) -> None:
        self._eof = True
        self._engine.close_tail()
        self._process()

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
        else:
            self._endpoints.dispatch(event)

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
            self._endpoints.drop_all()
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
            self._endpoints.drop_all()

    def _attach(self, link: Link, info: AttachInfo) -> LinkHandler | None:
        return self.router.attach(self, link, info)

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
            self.id,
            self.peer,
            self.limits.handshake_timeout,
        )
        self.close("amqp:resource-limit-exceeded", f"no open frame within {self.limits.handshake_timeout:g}s")

    def _finish(self) -> None:
        if self.closed:
            return
        self.closed = True
        for timer in (self._timer, self._handshake):
            if timer is not None:
                timer.cancel()
        self._endpoints.drop_all()
        self.router.connection_closed(self)


_CONNECTION_EVENTS = frozenset(
    {
        Event.CONNECTION_REMOTE_OPEN,
        Event.CONNECTION_REMOTE_CLOSE,
        Event.TRANSPORT_ERROR,
        Event.TRANSPORT_TAIL_CLOSED,
        Event.TRANSPORT_CLOSED,
    }
)


def _describe(condition: Condition) -> str:
    return f"{condition.name}: {condition.description}" if condition.description else str(condition.name)
