"""The bytes between one connection's socket and proton's engine, in both directions.

Bytes read from the socket are cut into frames (``frames.FrameSplitter``) and noted
(``notes.FrameNotes``: what proton's binding does not expose) before proton sees them. Everything
proton writes is completed (``frames.complete``) before it goes out. Bytes that are not AMQP
frames go to proton unchanged, which closes the connection with a framing or decode error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from proton import Transport

import workers.hub.amqp.frames as frames
from workers.hub.amqp.notes import FrameNotes

log = logging.getLogger("leaseboard.amqp")
trace = logging.getLogger("leaseboard.amqp.frames")  # DEBUG: every performative, decoded (payloads are not logged)


class Wire:
    """The frames of one connection (``id`` and ``peer`` name it in the log), into and out of ``engine``."""

    def __init__(self, conn_id: int, engine: Transport, notes: FrameNotes, max_frame_size: int) -> None:
        self.id = conn_id
        self.peer = "?"
        self.heartbeats = 0  # empty frames received: a quiet peer's proof of life
        self._engine = engine
        self._notes = notes
        self._incoming = frames.FrameSplitter(max_frame_size)
        self._outgoing = frames.FrameSplitter(1 << 32)

    def receive(self, data: bytes, after_frame: Callable[[], None]) -> None:
        """Gives ``data`` read from the socket to proton, calling ``after_frame`` after each frame."""
        splitter = self._incoming
        if splitter.error is not None:
            self._push(data)
        else:
            for item in splitter.feed(data):
                self._push(item if isinstance(item, bytes) else self._inspect(item))
                # Events frame by frame: what _inspect noted belongs to the frame proton just read
                # (a link name may be detached and attached again within one read).
                after_frame()
            if splitter.error is not None:
                log.warning("connection %d from %s: %s; proton answers it", self.id, self.peer, splitter.error)
                self._push(splitter.take_rest())

    def complete(self, out: bytes) -> bytes:
        """``out``, written by proton, with every frame completed; raises FrameError if it is not frames."""
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
