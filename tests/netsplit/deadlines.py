"""Every await of the partition suite with a deadline, and a failure that says what it waited for.

A run once hung until pytest-timeout (900 s) on Redis under load: its main coroutine waited on
something without a deadline while the sampler kept the event loop ticking, and nothing said what.
``within`` bounds one await; past its deadline it fails naming what was awaited, with the stack of
every task of the loop and of every thread (where the awaited thing is stuck: a socket read, a
full executor, a lock).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import traceback
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


def stacks() -> str:
    """The stack of every task of the running loop and of every thread, innermost frame last."""
    out = []
    try:
        tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    except RuntimeError:  # no running loop
        tasks = []
    for task in tasks:
        frames = task.get_stack(limit=12)
        where = "".join(traceback.format_list(traceback.extract_stack(frames[-1]) if frames else []))
        out.append(f"--- task {task.get_name()} ({task.get_coro()!r}):\n{where or '    (no frame)'}")
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        out.append(f"--- thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame, limit=12))}")
    return "\n".join(out)


async def within(seconds: float, what: str, awaitable: Awaitable[T]) -> T:
    """``await awaitable``, cancelled after ``seconds``: then AssertionError naming ``what`` with the
    stacks of every task and thread (taken before the cancellation, where things were stuck)."""
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if task in done:
        return task.result()
    where = stacks()
    task.cancel()
    await asyncio.wait({task}, timeout=5.0)  # a task that ignores its cancellation is left behind
    raise AssertionError(f"netsplit: gave up after {seconds:g}s waiting for {what}; where everything was:\n{where}")
