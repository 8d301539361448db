"""The reaper's sweep (``tests.support.reaper``): what it ends, what it leaves alone, in what order.
The runs and benches killed for real are ``test_left_behind``'s."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import reaper
from tests.support.waiting import until_sync

ROOT = Path(__file__).resolve().parents[2]


def running(pid: int) -> bool:
    start = reaper.start_time(pid)
    return start is not None and reaper._running(pid, start)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; killed with their groups afterwards, whatever the sweep did."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        for end in (os.killpg, os.kill):
            with contextlib.suppress(OSError):
                end(process.pid, signal.SIGKILL)
        process.wait(10)


def entry(process: subprocess.Popen[str], **changes: Any) -> dict[str, Any]:
    start = reaper.start_time(process.pid)
    return {"pid": process.pid, "start": start, "stop": int(signal.SIGTERM), "group": None, **changes}


def spawn(started: list[subprocess.Popen[str]], script: str, **popen: Any) -> tuple[subprocess.Popen[str], list[int]]:
    """``python -c script`` whose first line of output is the pids it names, space separated."""
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE, text=True, **popen
    )
    started.append(process)
    assert process.stdout is not None
    return process, [int(pid) for pid in process.stdout.readline().split()]


def test_a_pid_reused_since_it_was_told_is_left_alone(started: list[subprocess.Popen[str]]) -> None:
    process, _ = spawn(started, "import time; print(flush=True); time.sleep(60)", start_new_session=True)
    reaper.sweep({process.pid: entry(process, start=entry(process)["start"] - 1, group=True)}, grace=0.1)
    assert running(process.pid)


def test_descendants_are_ended_even_in_sessions_of_their_own(started: list[subprocess.Popen[str]]) -> None:
    # As PostgreSQL's backends: children of the server, each in a session of its own.
    process, (grandchild,) = spawn(
        started,
        """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        print(child.pid, flush=True)
        time.sleep(60)
    """,
    )
    assert running(grandchild)
    reaper.sweep({process.pid: entry(process)}, grace=0.1)
    until_sync(lambda: not running(grandchild), "the grandchild to end", 10)
    assert process.wait(10) == -signal.SIGTERM


def test_the_group_is_ended_once_its_leader_is_gone(started: list[subprocess.Popen[str]]) -> None:
    process, (member,) = spawn(
        started,
        """
        import os, subprocess, sys
        member = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # same group
        print(member.pid, flush=True)
        sys.stdin.readline()
    """,
        start_new_session=True,
        stdin=subprocess.PIPE,
    )
    told = entry(process, group=True)
    assert process.stdin is not None
    process.stdin.close()  # the leader exits: its member is reparented, out of the leader's tree
    process.wait(10)
    reaper.sweep({process.pid: told}, grace=0.1)
    until_sync(lambda: not running(member), "the group's member to end", 10)


def test_the_stop_signal_comes_first_and_sigkill_after_the_grace(
    started: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    stopped = tmp_path / "stopped"
    process, _ = spawn(
        started,
        f"""
        import pathlib, signal, time
        signal.signal(signal.SIGINT, lambda *_: pathlib.Path({str(stopped)!r}).write_text("clean"))
        print(flush=True)
        while True:
            time.sleep(0.01)  # asked to stop, it does not: SIGKILL after the grace
    """,
    )
    reaper.sweep({process.pid: entry(process, stop=int(signal.SIGINT))}, grace=0.5)
    assert process.wait(10) == -signal.SIGKILL
    assert stopped.read_text() == "clean"


def test_an_owner_that_exits_leaving_a_process_and_a_directory_leaves_neither(tmp_path: Path) -> None:
    # A test or bench that failed half way, without stopping what it started.
    home = tmp_path / "home"
    owner = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import pathlib, subprocess, sys
            from tests.support import reaper
            pathlib.Path({str(home)!r}).mkdir()
            reaper.remove_on_exit(pathlib.Path({str(home)!r}))
            left = subprocess.Popen(["sleep", "60"], start_new_session=True)
            print(left.pid, reaper.keeper_pid())
        """),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    left, keeper = (int(pid) for pid in owner.stdout.split())
    until_sync(lambda: not running(left) and not running(keeper), "the process and the keeper to end", 20)
    assert not home.exists()


def _report(queue: Any) -> None:
    queue.put(reaper._pipe)


# The fork is the point of the test; Python 3.12 and later warn about any fork of a process with
# threads (the keeper's, pytest's), which is what the reaper's fork hook is for.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_a_forked_child_does_not_hold_the_keepers_pipe() -> None:
    subprocess.run(["true"], check=True)  # a child: the keeper runs, the pipe is open
    assert reaper._pipe is not None
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_report, args=(queue,))
    child.start()
    assert queue.get(timeout=30) is None
    child.join(30)


def test_an_owner_killed_leaves_no_worker_of_its_process_pool() -> None:
    # A ProcessPoolExecutor's workers are forked; killed, their owner leaves them blocked forever.
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            import os, time
            from concurrent.futures import ProcessPoolExecutor
            import tests.support
            with ProcessPoolExecutor(2) as pool:
                pool.submit(time.sleep, 60)
                print(*pool._processes, flush=True)
                time.sleep(60)
        """),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    workers = [int(pid) for pid in owner.stdout.readline().split()]
    assert workers and all(running(pid) for pid in workers)
    owner.kill()
    owner.wait(10)
    until_sync(lambda: not any(running(pid) for pid in workers), "the pool's workers to end", 20)


def test_a_child_forked_as_its_parent_is_signalled_does_not_escape(started: list[subprocess.Popen[str]]) -> None:
    # The shell forks its sleep at any time around the sweep's first look: stopped first, the shell
    # cannot fork it unseen, then end, orphaning it out of the sweep's sight.
    for _ in range(5):
        shell = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], stdout=subprocess.PIPE, text=True)
        started.append(shell)
        reaper.sweep({shell.pid: entry(shell)}, grace=0.2)
        assert shell.wait(10) == -signal.SIGTERM
        assert shell.stdout is not None
        assert shell.stdout.read() == ""  # EOF: no sleep holds the pipe any more
