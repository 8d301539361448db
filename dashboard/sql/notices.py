"""Release notices on PostgreSQL's ``LISTEN/NOTIFY`` (``balancer.notices``): the SQL store's
``release_channel`` on PostgreSQL (SQLite has no notification: receivers there claim at their next
cycle).

One channel for every hub (``leaseboard_releases``); the payload names the hub and consumer group and
a listener keeps what concerns it. Publishing is one ``pg_notify`` on the store's lease lane (the
connection its claims use). Listening holds an async connection of its own, opened with the same
settings as Django's (host, credentials, and the TCP timeouts of ``LEASEBOARD_DB_TCP_TIMEOUT``), and
comes back after any failure with backoff; when the channel has been quiet for a while it sends a
``SELECT 1``, so a link that died without a word is noticed and replaced. Notices sent while it was
away are lost, which a notice may be: the receiver then claims at its next cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
from django.db import connections

from balancer.aio import stop_if_cancelled, within
from balancer.model import HubRef
from balancer.notices import Released

log = logging.getLogger("leaseboard.notices")

CHANNEL = "leaseboard_releases"
PAYLOAD_MAX = 7000  # bytes: NOTIFY refuses a payload of 8000 or more; a longer notice is split
QUIET = 10.0  # seconds without a notice before the listener checks its connection
BACKOFF = (0.1, 5.0)
CLOSE = 1.0  # seconds a listener waits for its connection to close before leaving it behind


def split(notice: Released) -> list[Released]:
    """``notice`` as notices whose payloads each fit in one NOTIFY."""
    if len(notice.encode().encode()) <= PAYLOAD_MAX or len(notice.partition_ids) <= 1:
        return [notice]
    half = len(notice.partition_ids) // 2
    first, second = notice.partition_ids[:half], notice.partition_ids[half:]
    return split(Released(notice.ref, first, notice.by)) + split(Released(notice.ref, second, notice.by))


def listener_params(using: str) -> dict[str, Any]:
    """Keyword arguments of ``psycopg.AsyncConnection.connect`` for database ``using``: Django's own,
    less what only its sync connections take."""
    params = dict(connections[using].get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    return params


class QuietConnection(psycopg.AsyncConnection[Any]):
    """The listener's connection: a wait for the server sleeps until the socket has something to read
    (or the wait's own timeout), where psycopg's waits also wake every 0.1 s to look again. That look
    serves a blocking wait, which a Ctrl-C must interrupt; an asyncio wait is cancelled without it.
    For a listener idle between notices it was ten wake-ups a second in every worker, for nothing."""

    async def wait(self, gen: Any, interval: float = QUIET, timeout: float | None = None) -> Any:
        return await super().wait(gen, interval=interval, timeout=timeout)


class PostgresReleaseChannel:
    """``notify(payload)``: runs ``pg_notify`` on the store's lease lane (raises StoreUnavailable)."""

    def __init__(self, using: str, ref: HubRef, notify: Callable[[str, str], Awaitable[None]]) -> None:
        self.using, self.ref, self._notify = using, ref, notify

    def __repr__(self) -> str:
        return f"PostgresReleaseChannel(database {self.using!r}, {CHANNEL!r})"

    async def publish(self, notice: Released) -> None:
        for part in split(notice):
            await self._notify(CHANNEL, part.encode())

    async def listen(self) -> AsyncIterator[Released]:
        wait, failing = BACKOFF[0], False
        while True:
            connection: QuietConnection | None = None
            try:
                connection = await QuietConnection.connect(autocommit=True, **listener_params(self.using))
                await connection.execute(f"LISTEN {CHANNEL}")
                stop_if_cancelled()  # a library may have lost a cancellation (balancer.aio)
                if failing:
                    log.info("release notices: listening again on database %r", self.using)
                wait, failing = BACKOFF[0], False
                while True:
                    async for notify in connection.notifies(timeout=QUIET):
                        notice = Released.decode(notify.payload)
                        if notice is not None and notice.ref == self.ref:
                            yield notice
                    stop_if_cancelled()
                    await connection.execute("SELECT 1")  # quiet for a while: is the link still there?
            except (psycopg.Error, OSError) as exc:
                stop_if_cancelled()  # a cancellation the driver turned into an error: end now, one close
                if not failing:
                    log.warning(
                        "release notices: lost the LISTEN connection to database %r (%s: %s); listening again "
                        "with backoff, receivers claim at their next cycle meanwhile",
                        self.using,
                        type(exc).__name__,
                        exc,
                    )
                failing = True
            finally:
                if connection is not None:  # a server that stopped answering: the close is bounded
                    await within(_close(connection), CLOSE)
            await asyncio.sleep(wait)
            wait = min(wait * 2, BACKOFF[1])

    async def aclose(self) -> None:
        """Nothing of its own to close: a listener closes its connection when its iteration ends."""


async def _close(connection: QuietConnection) -> None:
    with contextlib.suppress(Exception):
        await connection.close()
