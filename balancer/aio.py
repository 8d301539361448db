"""Ending tasks for sure: what every listener and receive loop needs to stop within a bound.

A cancellation is a request, and a library can lose it. The one found (a worker's stop on Redis
hung): on Python 3.11, ``asyncio.wait_for`` returns its inner future's result when that future ends
in the same loop turn as the cancellation of the task awaiting it, and the cancellation is gone
(CPython gh-86296, fixed in 3.12 where ``wait_for`` is built on ``asyncio.timeout``). redis-py wraps
every send in ``wait_for`` when the client has a socket timeout, so a listener cancelled while
sending its ping went on listening for ever. The task still counts the request
(``Task.cancelling()``), so a loop that looks after each round (``stop_if_cancelled``) ends anyway.

Cleanup may hang too: closing a connection to a server that stopped answering waits for a goodbye
that never comes. ``within`` gives such a call a bound and leaves it behind after that.

A blocking call into a network client (a hub's properties, its partition list) may hang until the
client gives up, long after its caller stopped waiting. In ``asyncio.to_thread`` or a
``ThreadPoolExecutor`` such a call holds the process at its end: ``asyncio.run`` joins the default
executor's threads, and the interpreter joins every executor's at exit (a worker on a starved hub
took 16-19 s to exit after its stop was done). ``off_loop`` runs it on a daemon thread instead,
which nothing waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def stop_if_cancelled() -> None:
    """Raise ``CancelledError`` when the running task was asked to stop and a library swallowed the
    request (it is still counted by ``Task.cancelling()``); nothing otherwise."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def detached(task: asyncio.Task[Any]) -> asyncio.Task[Any]:
    """``task``, its outcome retrieved whenever it ends (it may end after nobody awaits it)."""
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    return task


async def within(call: Awaitable[Any], seconds: float) -> None:
    """Run ``call`` for at most ``seconds``, then leave it (cancelled, not awaited); never raises but
    for the caller's own cancellation."""
    task = detached(asyncio.ensure_future(call))
    await asyncio.wait({task}, timeout=seconds)
    if not task.done():
        task.cancel()


def off_loop(fn: Callable[..., T], *args: Any, name: str = "off-loop") -> asyncio.Future[T]:
    """``fn(*args)`` on a daemon thread of its own; its result (or what it raised) as a future of the
    running loop. Nobody waits for the thread: not the loop's end, not the process's exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return  # the caller stopped waiting (cancelled)
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as exc:
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
