"""``ThreadLane``: the one thread of a pump, where its reads and its sync handler calls run in order.

Reading and sync handlers never run on the event loop, so a slow handler delays only its own
partition and never a lease renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("leaseboard.pump")
T = TypeVar("T")


class ThreadLane:
    """One daemon thread that runs calls in order, awaited from the event loop.

    Daemon, unlike a ThreadPoolExecutor's workers: a handler stuck forever must not keep the
    process from exiting once the bounded shutdown has given up on it.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Callable[[Any, BaseException | None], None]] | None]
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` run in the lane after what is queued; its result, or what it raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if future.done():
                return  # the awaiting task was cancelled meanwhile
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        def done(result: Any, error: BaseException | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(settle, result, error)

        self._queue.put((lambda: fn(*args), done))
        return await future

    def submit(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` after what is queued, without waiting for it (errors are logged)."""

        def done(_result: Any, error: BaseException | None) -> None:
            if error is not None:
                log.warning("%s failed: %s", fn, error)

        self._queue.put((fn, done))

    def close(self) -> None:
        """Let the thread end after what is queued."""
        self._queue.put(None)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, done = item
            try:
                result = fn()
            except BaseException as exc:
                done(None, exc)
            else:
                done(result, None)
