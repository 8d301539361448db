"""A HubServer on an event loop of its own in a daemon thread: for tests and benchmarks."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from workers.hub.amqp.server import HubServer

T = TypeVar("T")


class ServerThread:
    """A HubServer on an event loop of its own in a daemon thread."""

    def __init__(self, server: HubServer) -> None:
        self.server = server
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="amqp hub", daemon=True)

    def start(self, timeout: float = 10.0) -> ServerThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(timeout)
        return self

    def call(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """``fn()`` run on the server's loop (where its state may be read safely)."""
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return future.result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(timeout)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
            self._loop.close()

    @property
    def port(self) -> int:
        """The plain listener's port (the TLS one's if it has no plain listener)."""
        port = self.server.port if self.server.port is not None else self.server.tls_port
        assert port is not None, "the server is not listening"
        return port

    @property
    def tls_port(self) -> int | None:
        return self.server.tls_port

    @property
    def connection_string(self) -> str:
        return self.server.connection_string()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
