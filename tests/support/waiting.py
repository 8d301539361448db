"""Waiting for a condition: poll it with a deadline, never sleep for a guessed time.

``await until(condition, what)`` (tests on an event loop) and ``until_sync(condition, what)``
(everything else) share one meaning: call ``condition`` until it returns something truthy and
return that; between polls ``check()`` may raise (a process died: fail now, not at the deadline);
once ``timeout`` seconds have passed on ``clock``, fail with an AssertionError naming ``what`` was
waited for, the last value ``condition`` returned (or raised, for exceptions in ``ignoring``) and
``detail()`` (a log, the state of a fleet). ``until`` also takes an async ``condition``.

The clock is ``time.monotonic`` unless a test runs on simulated time: with an event loop whose
clock jumps to the next timer, pass ``clock=loop.time`` and the wait is in simulated seconds.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

TIMEOUT = 10.0  # seconds
STEP = 0.005  # seconds between two polls


class _Poll:
    """One wait's bookkeeping: the deadline and the last thing ``condition`` gave."""

    def __init__(self, what: str, timeout: float, clock: Callable[[], float], detail: Callable[[], str] | None) -> None:
        self.what, self.timeout, self.clock, self.detail = what, timeout, clock, detail
        self.deadline = clock() + timeout
        self.last: object = "(not called yet)"

    def expired(self) -> bool:
        return self.clock() > self.deadline

    def failure(self) -> AssertionError:
        message = f"timed out after {self.timeout:g}s waiting for {self.what}; last seen: {self.last!r}"
        if self.detail is not None:
            message += f"\n{self.detail()}"
        return AssertionError(message)


# An async condition is awaited; either way None (not yet) is not what a successful wait returns.
@overload
async def until(
    condition: Callable[[], Awaitable[T | None]],
    what: str,
    timeout: float = TIMEOUT,
    *,
    step: float = STEP,
    check: Callable[[], None] | None = None,
    detail: Callable[[], str] | None = None,
    ignoring: tuple[type[BaseException], ...] = (),
    clock: Callable[[], float] = time.monotonic,
) -> T: ...
@overload
async def until(
    condition: Callable[[], T | None],
    what: str,
    timeout: float = TIMEOUT,
    *,
    step: float = STEP,
    check: Callable[[], None] | None = None,
    detail: Callable[[], str] | None = None,
    ignoring: tuple[type[BaseException], ...] = (),
    clock: Callable[[], float] = time.monotonic,
) -> T: ...
async def until(
    condition: Callable[[], Any],
    what: str,
    timeout: float = TIMEOUT,
    *,
    step: float = STEP,
    check: Callable[[], None] | None = None,
    detail: Callable[[], str] | None = None,
    ignoring: tuple[type[BaseException], ...] = (),
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """Poll ``condition`` (sync or async) every ``step`` seconds, yielding to the event loop, until it
    returns something truthy, and return that. Raises AssertionError after ``timeout`` seconds of
    ``clock``, and whatever ``check()`` raises between polls. Exceptions of the ``ignoring`` types
    from ``condition`` count as "not yet" (a server not answering yet)."""
    poll = _Poll(what, timeout, clock, detail)
    while True:
        try:
            result = condition()
            if inspect.isawaitable(result):
                result = await result
        except ignoring as exc:
            poll.last = exc
        else:
            if result:
                return result
            poll.last = result
        if check is not None:
            check()
        if poll.expired():
            raise poll.failure()
        await asyncio.sleep(step)


def until_sync(
    condition: Callable[[], T | None],
    what: str,
    timeout: float = TIMEOUT,
    *,
    step: float = STEP,
    check: Callable[[], None] | None = None,
    detail: Callable[[], str] | None = None,
    ignoring: tuple[type[BaseException], ...] = (),
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``until`` for code without an event loop: the same polls and failures, blocking the thread
    between them."""
    poll = _Poll(what, timeout, clock, detail)
    while True:
        try:
            result = condition()
        except ignoring as exc:
            poll.last = exc
        else:
            if result:
                return result
            poll.last = result
        if check is not None:
            check()
        if poll.expired():
            raise poll.failure()
        time.sleep(step)
