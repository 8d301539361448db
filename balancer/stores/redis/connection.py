"""The Redis store's connections: a client per event loop, its registered scripts, and the round trip
every command takes (bounded by the store's timeout, Redis's errors turned into StoreError or
StoreUnavailable that name host, port and database, never the password).

One ``RedisStore`` may be used from several event loops (a management command after another, a
test's threads): each loop gets its own client and connection pool.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from balancer.errors import StoreError, StoreUnavailable

from .layout import CHECKPOINT, CLAIM, STAMPED
from .records import ENCODING_ERRORS

__all__ = ["URL_ENV", "Connection", "RedisConnections", "describe_url"]

T = TypeVar("T")

POOL = 100  # connections of a store's client at most (redis-py's default), per event loop
URL_ENV = "REDIS_URL"  # the setting of the URL, named in messages; the wiring passes its value in


@dataclass
class Connection:
    """One event loop's client and its registered scripts."""

    client: Redis
    claim: AsyncScript
    checkpoint: AsyncScript
    stamped: AsyncScript
    scripts: dict[str, AsyncScript] = dataclass_field(default_factory=dict)

    def script(self, source: str) -> AsyncScript:
        """``source`` registered on this client (once)."""
        found = self.scripts.get(source)
        if found is None:
            found = self.scripts[source] = self.client.register_script(source)
        return found


def describe_url(url: str) -> str:
    """``host:port/db`` of a Redis URL: what error messages name (never the user or password)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix:{parts.path}"
    database = parts.path.strip("/") or "0"
    return f"{parts.hostname or 'localhost'}:{parts.port or 6379}/{database}"


class RedisConnections:
    """The clients of one Redis database (``url``: ``redis://[:password@]host:port/db``), one per
    event loop; the base of ``RedisStore``.

    ``requests`` counts round trips to Redis.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        connect_timeout: float = 2.0,
        timeout: float = 3.0,
        client_name: str | None = None,
    ) -> None:
        if not url:
            raise StoreError(f"no Redis URL: set {URL_ENV} (redis://host:port/db) or pass one")
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise StoreError(f"{URL_ENV} must be a redis://, rediss:// or unix:// URL, got scheme {parts.scheme!r}")
        self.url = url
        self.where = describe_url(url)
        self._secret = parts.password or ""
        self._connect_timeout = connect_timeout
        self._timeout = timeout
        self._client_name = client_name
        self._lock = threading.Lock()
        self._connections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Connection] = (
            weakref.WeakKeyDictionary()
        )
        self.requests = 0

    async def aclose(self) -> None:
        """Close this event loop's connections (others close with their loops)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            connection = self._connections.pop(loop, None)
        if connection is not None:
            await connection.client.aclose()

    def client(self) -> Redis:
        """The client of the running event loop (made on first use)."""
        return self._connection().client

    def new_client(self, retries: int = 2, *, read_timeout: bool = True) -> Redis:
        """A client of its own (e.g. for a subscription), on the same URL and timeouts. Without
        ``read_timeout`` its commands have none of their own: the caller bounds them (``run``), and
        a command finding all POOL connections in use waits for one (within that bound) instead of
        failing with "Too many connections" (16 workers of a process start 256 pumps at once)."""
        # Retries cover a pooled connection that died with a restarted server: the command never
        # ran there, so sending it again on a fresh connection is safe. Timeouts are not retried:
        # a renewal must fail fast rather than outlast its lease.
        retry = Retry(ExponentialBackoff(cap=0.2, base=0.02), retries, supported_errors=(RedisConnectionError,))
        options: dict[str, Any] = {
            "socket_connect_timeout": self._connect_timeout,
            "socket_timeout": self._timeout if read_timeout else None,
            "retry": retry,
            "client_name": self._client_name,
            "decode_responses": True,
            "encoding_errors": ENCODING_ERRORS,  # a hand edit's bytes that are not UTF-8 cannot fail a listing
        }
        if read_timeout:
            return Redis.from_url(self.url, **options)
        pool = BlockingConnectionPool.from_url(self.url, max_connections=POOL, timeout=self._timeout, **options)
        return Redis.from_pool(pool)

    def _connection(self) -> Connection:
        loop = asyncio.get_running_loop()
        with self._lock:
            connection = self._connections.get(loop)
            if connection is None:
                # No read timeout in redis-py: with one, every command's send is an asyncio.wait_for,
                # a task of its own on Python 3.11 (a third of the loop's turns of an idle worker's
                # cycle). ``run`` bounds each round trip with asyncio.timeout instead.
                client = self.new_client(read_timeout=False)
                connection = Connection(
                    client,
                    client.register_script(CLAIM),
                    client.register_script(CHECKPOINT),
                    client.register_script(STAMPED),
                )
                self._connections[loop] = connection
        return connection

    def scrub(self, message: str) -> str:
        """``message`` without the password (for messages that quote the server or the client)."""
        return message.replace(self._secret, "***") if self._secret else message

    def error(self, doing: str, exc: BaseException) -> StoreError:
        """The StoreError (or StoreUnavailable) that says why ``doing`` failed."""
        reason = self.scrub(str(exc) or type(exc).__name__)
        if isinstance(exc, AuthenticationError) or (
            isinstance(exc, ResponseError) and str(exc).startswith(("NOAUTH", "WRONGPASS"))
        ):
            return StoreError(f"Redis at {self.where} refused the credentials of {URL_ENV} ({doing}): {reason}")
        if isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError):
            return StoreUnavailable(f"cannot reach Redis at {self.where} ({doing}): {reason}")
        return StoreError(f"Redis at {self.where} refused {doing}: {reason}")

    async def run(self, doing: str, call: Callable[[Connection], Awaitable[T]], count: bool = True) -> T:
        """One round trip (counted in ``requests`` unless the caller counts it itself); Redis errors
        become StoreError/StoreUnavailable (see ``error``)."""
        self.requests += count
        connection = self._connection()
        try:
            async with asyncio.timeout(self._timeout):
                return await call(connection)
        except TimeoutError:  # the connection was dropped mid-command: the next one connects afresh
            raise self.error(doing, RedisTimeoutError(f"no answer within {self._timeout:g}s")) from None
        except (RedisConnectionError, RedisTimeoutError, ResponseError, OSError) as exc:
            raise self.error(doing, exc) from None
