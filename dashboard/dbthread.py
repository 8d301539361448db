"""A thread of its own for the ORM on a hot path, with its database connection kept between calls.

``database_sync_to_async`` (and Channels before each message a consumer handles) closes the
thread-sensitive executor's connection, since ``CONN_MAX_AGE`` is 0, so every call opens a new one.
At 200 balancer events a second that was half the cost of saving an event and a third of Daphne's
CPU for reading them back (SQLite registers its functions and runs the WAL pragma per connection).

A ``DatabaseThread`` keeps its connection open instead, with Django's own safeguards done by hand:
a connection idle for ``CHECK_AFTER`` seconds is checked (``is_usable``, what
``CONN_HEALTH_CHECKS`` does) before it is used again, so a database that restarted in between costs
nothing but a reconnect; a call that fails closes it, so the next one starts afresh.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections

P = ParamSpec("P")
R = TypeVar("R")

CHECK_AFTER = 1.0  # seconds idle after which the connection is checked before use


class DatabaseThread:
    """One thread running ORM calls for ``alias``, its connection kept between them."""

    def __init__(self, name: str, alias: str = DEFAULT_DB_ALIAS) -> None:
        self.alias = alias
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._used = 0.0  # monotonic time of the last call (read and written on the thread only)

    def _run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        connection = connections[self.alias]  # looked up per thread: this thread's own
        idle = time.monotonic() - self._used
        if connection.connection is not None and idle > CHECK_AFTER and not connection.is_usable():
            connection.close()
        try:
            return fn(*args, **kwargs)
        except Exception:
            connection.close()
            raise
        finally:
            self._used = time.monotonic()

    def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args)`` on the thread; this thread waits for it (also when it runs an event loop)."""
        return self._executor.submit(functools.partial(self._run, fn, *args, **kwargs)).result()

    async def acall(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args)`` on the thread, awaited."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(self._run, fn, *args, **kwargs))

    async def aclose_connection(self) -> None:
        """Close the thread's connection (the next call opens a new one)."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._close)

    def _close(self) -> None:
        connections[self.alias].close()
