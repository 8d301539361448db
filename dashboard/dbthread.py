"""The dashboard's one way to run the ORM off an event loop: a thread of its own, its connection kept.

Four ways were in use (``sync_to_async``, ``database_sync_to_async``, bare ``run_in_executor`` and
this class); the dashboard now uses this one everywhere (views, websockets, the monitor, event
publishing, the SQL store's lanes), for these reasons:

- it works the same from any thread and any event loop. ``database_sync_to_async`` is
  thread-sensitive: outside a request (the monitor runs on a loop of its own, stores run in worker
  processes) asgiref sends every call to one process-wide thread, shared with every other such
  caller, so one slow query delays unrelated work, and nobody can close that thread's connection;
- it keeps its connection. ``database_sync_to_async`` (and Channels before each message a consumer
  handles) closes the connection when ``CONN_MAX_AGE`` is 0, so every call opens a new one: at 200
  balancer events a second that was half the cost of saving an event and a third of Daphne's CPU
  for reading them back (SQLite registers its functions and runs the WAL pragma per connection);
- its threads have names (``leaseboard-monitor-db``, ``sqlstore-default-lease``...), so a stack
  dump says whose query is stuck, and whoever made one closes it (``aclose``) when done.

Django's own safeguards are done by hand: a connection idle for ``CHECK_AFTER`` seconds is
checked (``is_usable``, what ``CONN_HEALTH_CHECKS`` does) before it is used again, so a database
that restarted in between costs nothing but a reconnect; a call that fails closes it, so the next
one starts afresh. A thread made with ``retry=True`` (read-only work: the console's views, feed
and monitor) also runs a call once more on a fresh connection when a *kept* connection fails with a
connection error (``OperationalError``/``InterfaceError``), so the first request after a database
restart succeeds instead of finding out that its connection died; a call on a connection it had
just opened is not retried (the server is really down: say so at once).

Cancelling a caller does not stop its call: the statement runs to its end on the thread (Python
cannot interrupt a thread), and whatever is queued behind it waits. Whoever holds a database lock
must therefore never wait for a ``DatabaseThread`` call that needs that lock (see ``live/host.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections

P = ParamSpec("P")
R = TypeVar("R")

CHECK_AFTER = 1.0  # seconds idle after which the connection is checked before use
# Seconds a console read (views, feed, monitor: ``deadline``) waits for the database before it is
# taken as down. A database cut off by a silent network holds a query until the TCP timeout
# (LEASEBOARD_DB_TCP_TIMEOUT, 10 s), and every call queued behind it waits too; the console answers
# with a 503 or its last state (and ``leaseboard_database_up 0``) within a scrape's timeout instead.
READ_DEADLINE = 3.0


class DatabaseThread:
    """One thread running ORM calls for ``alias``, its connection kept between them.

    ``checks=False`` never checks an idle connection: the first call after the server dropped it
    fails, and the next one reconnects (no extra round trip; the SQL store's choice, whose callers
    retry next cycle anyway). ``retry=True`` runs a call that failed on a kept connection with a
    connection error once more on a new one (only for work that may safely run twice).
    ``deadline``: seconds ``acall`` waits (queueing included) before it raises OperationalError;
    the call itself runs on to its end on the thread (for reads only: a write may still land).
    """

    def __init__(
        self,
        name: str,
        alias: str = DEFAULT_DB_ALIAS,
        *,
        checks: bool = True,
        retry: bool = False,
        deadline: float | None = None,
    ) -> None:
        self.name = name
        self.deadline = deadline
        self.alias = alias
        self.checks = checks
        self.retry = retry
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._used = 0.0  # monotonic time of the last call (read and written on the thread only)

    def _thread(self) -> ThreadPoolExecutor:
        # Made on first use, and again after aclose(): a module-level instance outlives tests.
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
            return self._executor

    def _run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        connection = connections[self.alias]  # looked up per thread: this thread's own
        idle = time.monotonic() - self._used
        if self.checks and connection.connection is not None and idle > CHECK_AFTER and not connection.is_usable():
            connection.close()
        kept = connection.connection is not None
        try:
            return fn(*args, **kwargs)
        except (OperationalError, InterfaceError):
            connection.close()
            if not (self.retry and kept):
                raise
        except Exception:
            connection.close()
            raise
        finally:
            self._used = time.monotonic()
        try:  # the kept connection had died (a database restart): once more, on a new one
            return fn(*args, **kwargs)
        except Exception:
            connection.close()
            raise
        finally:
            self._used = time.monotonic()

    def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args)`` on the thread; this thread waits for it (also when it runs an event loop)."""
        return self._thread().submit(functools.partial(self._run, fn, *args, **kwargs)).result()

    async def acall(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args)`` on the thread, awaited. The thread hands the outcome to the loop itself (one
        ``call_soon_threadsafe``), without ``run_in_executor``'s chain of a concurrent future copied
        into an asyncio one: every cycle of every worker on the SQL store makes this hop."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[R] = loop.create_future()
        self._thread().submit(_answer, loop, answer, functools.partial(self._run, fn, *args, **kwargs))
        if self.deadline is None:
            return await answer
        try:
            return await asyncio.wait_for(answer, self.deadline)
        except TimeoutError:
            raise OperationalError(
                f"the database did not answer within {self.deadline:g} s (cut off or overloaded)"
            ) from None

    async def aclose_connection(self) -> None:
        """Close the thread's connection (the next call opens a new one)."""
        await asyncio.get_running_loop().run_in_executor(self._thread(), self._close)

    async def aclose(self) -> None:
        """Close the connection and end the thread (a later call starts a new one)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.get_running_loop().run_in_executor(executor, self._close)
            executor.shutdown(wait=True)

    def close(self) -> None:
        """``aclose`` for code without an event loop: blocks until queued calls are done."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.submit(self._close).result()
            executor.shutdown(wait=True)

    def close_soon(self) -> None:
        """Close the connection after the queued calls and let the thread end, without waiting
        (for a finalizer, which may run in garbage collection)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            with contextlib.suppress(RuntimeError):  # at interpreter exit the executor is shut already
                executor.submit(self._close)
            executor.shutdown(wait=False)

    def _close(self) -> None:
        connections[self.alias].close()


def _answer(loop: asyncio.AbstractEventLoop, answer: asyncio.Future[R], call: Callable[[], R]) -> None:
    """On the thread: ``call()``, its outcome handed to ``answer`` on ``loop``."""
    try:
        result = call()
    except BaseException as exc:  # whatever it raised reaches the caller (a caller left waiting would hang)
        outcome: tuple[R | None, BaseException | None] = (None, exc)
    else:
        outcome = (result, None)
    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody awaits the answer
        loop.call_soon_threadsafe(_settle, answer, *outcome)


def _settle(answer: asyncio.Future[R], result: R | None, error: BaseException | None) -> None:
    """On the loop: ``answer`` resolved, unless its caller was cancelled meanwhile."""
    if answer.done():
        return
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(result)  # type: ignore[arg-type]
