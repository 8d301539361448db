"""A bare AMQP client on proton's engine and a blocking socket: it does what the SDK refuses to do.

It sends oversize messages, attaches to addresses no SDK would write, goes silent, and reads the
exact error conditions the server answers with. ``pump(until)`` moves bytes both ways until a
condition holds (or fails after a deadline); nothing here sleeps to wait.
"""

from __future__ import annotations

import select
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from proton import Collector, Condition, Connection, Data, Described, Link, Message, Transport, symbol

from workers.hub.amqp.auth import SasKey


class Closed(Exception):
    """The server closed the socket while a condition was awaited."""


class RawClient:
    def __init__(self, port: int, *, sasl: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.transport = Transport()
        self.conn = Connection()
        self.collector = Collector()
        self.conn.collect(self.collector)
        if sasl:
            self.transport.sasl().allowed_mechs("ANONYMOUS")
        self.transport.bind(self.conn)
        self.conn.container = f"raw-{uuid.uuid4()}"
        self.conn.hostname = "127.0.0.1"
        self.eof = False
        self.received: list[tuple[Link, bytes]] = []

    # -- moving bytes ------------------------------------------------------------------------------

    def pump(self, until: Callable[[], Any], timeout: float = 5.0, what: str = "a condition") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            self._write()
            self._drain_events()
            result = until()
            if result:
                return result
            if self.eof:
                raise Closed(f"the server closed the connection while waiting for {what}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            readable, _, _ = select.select([self.sock], [], [], 0.02)
            if readable:
                data = self.sock.recv(1 << 20)
                if not data:
                    self.eof = True
                    self.transport.close_tail()
                else:
                    self._push(data)

    def _push(self, data: bytes) -> None:
        while data:
            capacity = self.transport.capacity()
            if capacity <= 0:
                return
            self.transport.push(data[:capacity])
            data = data[capacity:]

    def _write(self) -> None:
        pending = self.transport.pending()
        if pending > 0:
            out = self.transport.peek(pending) or b""
            self.transport.pop(pending)
            try:
                self.sock.sendall(out)
            except OSError:
                self.eof = True

    def _drain_events(self) -> None:
        while self.collector.peek() is not None:
            self.collector.pop()
        # deliveries that arrived on our receivers
        for link in self._links():
            if link.is_receiver:
                delivery = link.current
                while delivery is not None and delivery.readable and not delivery.partial:
                    self.received.append((link, link.recv(delivery.pending) or b""))
                    delivery.settle()
                    link.advance()
                    delivery = link.current

    def _links(self) -> list[Link]:
        out: list[Link] = []
        link = self.conn.link_head(0)
        while link is not None:
            out.append(link)
            link = link.next(0)
        return out

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_until_eof(self, timeout: float = 5.0) -> bytes:
        return read_until_eof(self.sock, timeout)

    def close(self) -> None:
        self.sock.close()

    # -- AMQP --------------------------------------------------------------------------------------

    def open(self) -> None:
        self.conn.open()
        self.session = self.conn.session()
        self.session.open()
        self.pump(lambda: self.conn.state & Connection.REMOTE_ACTIVE, what="the server's open")

    def authorize(self, key: SasKey, resource: str) -> int:
        """Puts a token for ``resource`` on $cbs; returns the status code."""
        sender = self.sender("$cbs")
        receiver = self.receiver("$cbs")
        receiver.flow(10)
        message = Message(
            id=uuid.uuid4(),
            properties={"operation": "put-token", "type": "servicebus.windows.net:sastoken", "name": resource},
            body=key.sign(resource, int(time.time()) + 3600),
        )
        self.send(sender, message.encode())
        _, payload = self.pump(lambda: self._reply(receiver), what="the $cbs response")
        response = Message()
        response.decode(payload)
        assert response.properties is not None, "a $cbs response carries its status in its properties"
        return int(response.properties["status-code"])

    def _reply(self, receiver: Link) -> tuple[Link, bytes] | None:
        for i, (link, _) in enumerate(self.received):
            if link == receiver:
                return self.received.pop(i)
        return None

    def sender(self, address: str, wait: bool = True) -> Link:
        link = self.session.sender(f"s-{uuid.uuid4()}")
        link.target.address = address
        link.source.address = "raw"
        link.open()
        if wait:
            self.pump(lambda: link.state & (Link.REMOTE_ACTIVE | Link.REMOTE_CLOSED), what="the sender's attach")
        return link

    def receiver(self, address: str, selector: str | None = None) -> Link:
        link = self.session.receiver(f"r-{uuid.uuid4()}")
        link.source.address = address
        link.target.address = "raw"
        if selector is not None:
            data: Data = link.source.filter
            data.put_object(
                {
                    symbol("apache.org:selector-filter:string"): Described(
                        symbol("apache.org:selector-filter:string"), selector
                    )
                }
            )
        link.open()
        self.pump(lambda: link.state & (Link.REMOTE_ACTIVE | Link.REMOTE_CLOSED), what="the receiver's attach")
        return link

    def send(self, link: Link, payload: bytes) -> Any:
        delivery = link.delivery(f"d-{uuid.uuid4()}")
        link.send(payload)
        link.advance()
        return delivery

    def detached(self, link: Link, timeout: float = 5.0) -> Condition:
        """The error the server detached ``link`` with (waits for the detach)."""
        self.pump(lambda: link.state & Link.REMOTE_CLOSED, timeout, "the link to be detached")
        condition = link.remote_condition
        assert condition is not None, "detached without an error"
        return condition


def read_until_eof(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything the server writes on ``sock`` until it closes it (for bad-input tests, raw)."""
    sock.settimeout(timeout)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        if not data:
            return b"".join(chunks)
        chunks.append(data)
    raise AssertionError(f"the server did not close the connection within {timeout}s")
