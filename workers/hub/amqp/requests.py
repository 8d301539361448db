"""Request/response nodes: ``$cbs`` (claims-based authorization) and ``$management`` (properties).

A client attaches a sender (requests) and a receiver (responses) to the node, both on one session.
Requests carry a message-id and usually no reply-to; the response goes to the node's receiver on
the same session (else the one whose target is the reply-to, else any on the connection) with
correlation-id = the request's message-id and an integer ``status-code`` application property.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proton import Delivery, Disposition, Link, Message

from workers.hub.amqp.links import detach_oversize, reject
from workers.hub.amqp.messages import AMQP_VALUE, APPLICATION_PROPERTIES, PROPERTIES, BadMessage, sections

if TYPE_CHECKING:
    from workers.hub.amqp.connection import AmqpConnection
    from workers.hub.amqp.notes import AttachInfo

log = logging.getLogger("leaseboard.amqp")


@dataclass(frozen=True, slots=True)
class Request:
    """A request's message-id, reply-to, application properties (str keys) and body value."""

    message_id: Any
    reply_to: str | None
    properties: dict[str, Any]
    body: Any


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    description: str
    body: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


def parse_request(payload: bytes) -> Request:
    """Raises BadMessage."""
    message_id, reply_to, props, body = None, None, {}, None
    for code, value in sections(payload):
        if code == PROPERTIES and isinstance(value, list):
            message_id = value[0] if value else None
            reply_to = value[4] if len(value) > 4 and value[4] is not None else None
        elif code == APPLICATION_PROPERTIES and isinstance(value, dict):
            props = {str(k): v for k, v in value.items()}
        elif code == AMQP_VALUE:
            body = value
    return Request(message_id, None if reply_to is None else str(reply_to), props, body)


def encode_response(request: Request, response: Response) -> bytes:
    # "statusDescription" too: the Python SDK asks for the management description under that name
    # (it passes "description_fields", which its management link does not read).
    message = Message(
        correlation_id=request.message_id,
        properties={
            "status-code": response.status,
            "status-description": response.description,
            "statusDescription": response.description,
            **response.extra,
        },
        body=response.body,
    )
    return bytes(message.encode())


class ReplyLink:
    """Our sender on a node's response link: queues responses until the client gives credit."""

    def __init__(self, conn: AmqpConnection, link: Link, info: AttachInfo, node: str) -> None:
        self.conn, self.link, self.info, self.node = conn, link, info, node
        self.target = info.target
        self._queue: deque[bytes] = deque()
        self._tags = 0
        self.gone = False
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = Link.SND_SETTLED
        link.open()

    def send(self, payload: bytes) -> None:
        self._queue.append(payload)
        self.on_flow()

    def on_flow(self) -> None:
        while self._queue and self.link.credit > 0 and not self.gone:
            self._tags += 1
            delivery = self.link.delivery(str(self._tags))
            self.link.send(self._queue.popleft())
            self.link.advance()
            delivery.settle()

    def on_delivery(self, delivery: Delivery) -> None:
        delivery.settle()

    def on_detach(self) -> None:
        self.gone = True


class RequestLink:
    """Our receiver on a node's request link: reads whole requests, answers through ``handle``."""

    def __init__(
        self,
        conn: AmqpConnection,
        link: Link,
        info: AttachInfo,
        node: str,
        handle: Callable[[Request], Response],
        replies: Callable[[Request], ReplyLink | None],
    ) -> None:
        self.conn, self.link, self.info, self.node = conn, link, info, node
        self._handle = handle
        self._replies = replies
        self._buffer = bytearray()
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.max_message_size = conn.limits.max_message_size
        link.open()
        link.flow(50)

    def on_flow(self) -> None:
        pass

    def on_delivery(self, delivery: Delivery) -> None:
        link = self.link
        if delivery.aborted:
            self._buffer.clear()
            delivery.settle()
            return
        if delivery.readable:
            self._buffer += link.recv(delivery.pending) or b""
        if len(self._buffer) > self.conn.limits.max_message_size:
            detach_oversize(self.conn, link, len(self._buffer))
            self._buffer.clear()
            return
        if delivery.partial:
            return
        payload, self._buffer = bytes(self._buffer), bytearray()
        link.advance()
        try:
            request = parse_request(payload)
        except BadMessage as exc:
            log.warning("connection %d from %s: bad %s request: %s", self.conn.id, self.conn.peer, self.node, exc)
            reject(delivery, exc.condition, str(exc))
        else:
            started = time.monotonic()
            response = self._handle(request)
            reply = self._replies(request)
            if reply is None:
                reject(delivery, "amqp:precondition-failed", f"attach a receiver to {self.node} first for the response")
            else:
                delivery.update(Disposition.ACCEPTED)
                reply.send(encode_response(request, response))
            took = 1000 * (time.monotonic() - started)
            log.debug("%s request answered %d in %.1f ms", self.node, response.status, took)
        delivery.settle()
        if link.credit < 25:
            link.flow(50 - link.credit)

    def on_detach(self) -> None:
        self._buffer.clear()
