"""A blocking call into a hub's client that hangs holds no process at its end (``balancer.aio.off_loop``).

Seen on a starved machine: three workers of the Blob netsplit suite logged their whole stop within
0.6 s of SIGTERM and then took 16.8-19.4 s to exit. The wedge watch asked the hub for a partition's
properties on a ``ThreadPoolExecutor`` thread, which the interpreter joins at exit, and the hub watch's
probe and the partition list ran in ``asyncio.to_thread``, whose threads ``asyncio.run`` joins: a call
the hub left unanswered held the exit until the client gave up. They run on daemon threads now.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from balancer.aio import off_loop
from tests.support.clock import FakeClock
from tests.support.waiting import until
from workers.runtime.wedged import WedgeWatch
from workers.sources.base import PartitionProperties

from .test_wedged_readers import StillPump

PROGRAM = """
import asyncio, time
from balancer.aio import off_loop

async def main():
    try:
        await asyncio.wait_for({call}(time.sleep, {hang}), 0.2)
    except TimeoutError:
        print("gave up", flush=True)

asyncio.run(main())
"""


def exit_time(call: str, hang: float) -> float:
    """Seconds a process takes from its start to its exit, having given up on ``call(time.sleep, hang)``."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROGRAM.format(call=call, hang=hang))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "gave up" in done.stdout, done.stderr
    return time.monotonic() - started


def test_a_call_given_up_on_holds_neither_the_loop_end_nor_the_exit() -> None:
    assert exit_time("off_loop", 60) < 15  # a fresh interpreter's start and exit, and nothing more
    # What it replaced: asyncio.run joins to_thread's thread, so the process waits for the call.
    assert exit_time("asyncio.to_thread", 3) >= 3


async def test_off_loop_gives_the_result_or_the_error_and_runs_on_a_daemon_thread() -> None:
    def where() -> tuple[str, bool]:
        thread = threading.current_thread()
        return thread.name, thread.daemon

    assert await off_loop(where, name="probe") == ("probe", True)

    def fails() -> None:
        raise ValueError("no answer")

    with pytest.raises(ValueError, match="no answer"):
        await off_loop(fails)


async def test_the_wedge_watch_asks_the_hub_on_a_daemon_thread_and_gives_up_on_a_hung_answer() -> None:
    release = threading.Event()
    threads: list[threading.Thread] = []

    def properties(pid: str) -> PartitionProperties:
        threads.append(threading.current_thread())
        release.wait(30)
        return PartitionProperties(pid, 0, 100, None, None, False)

    pumps = {"0": StillPump()}
    clock = FakeClock()
    watch = WedgeWatch(0.05, properties, clock, lambda pid, since: None, answer_within=0.1)
    try:
        watch.look(pumps)
        clock.advance(0.1)
        watch.look(pumps)  # handed nothing over for the bound: the hub is asked
        await until(lambda: bool(threads), what="the question to reach the hub")
        await until(lambda: not watch._asking, what="the question to be given up after answer_within")
        assert threads[0].daemon and threads[0].is_alive()
        assert not watch._asking  # given up on, the thread left behind
    finally:
        release.set()
        watch.cancel()
