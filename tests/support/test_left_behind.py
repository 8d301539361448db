"""Nothing left behind: a test run or a bench that is killed (``timeout``'s SIGTERM, Ctrl-C's SIGINT,
SIGKILL of pytest or of a pytest-xdist worker) or fails half way leaves no process running.

Each case runs a real pytest (or bench) as a subprocess, marked by an environment variable of its
own and a temporary directory of its own (``TMPDIR``) that every process it starts inherits or
names, waits until its servers run, ends it, and then looks through ``/proc`` for any process so
marked (``tests.support.reaper``'s keepers included) until none is left or ``GONE`` seconds pass.

The throwaway test file holds what the real fixtures hold: a Redis (``ServerProcess``, a session of
its own), a PostgreSQL (its backends and background processes in sessions of their own), an
Azurite (node), one Redis started from a thread that has ended since (which PR_SET_PDEATHSIG would
have killed then), and a plain child in pytest's own process group (as ``runworkers``, ``runhub`` or
``serve`` are started); a conftest imports ``tests.support`` as ``tests/conftest.py`` does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.waiting import until_sync

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
GONE = 30.0  # seconds after the end within which nothing may be left (the keeper's grace is 5 s)
EXIT = 120.0  # seconds a run may take to exit after its signal (a graceful teardown, on a busy machine)
UP = 120.0  # seconds the run may take to have its servers running (two busy cores)

# Plugins the throwaway test does not use: loading them takes seconds of CPU per process (3 to 9 s
# of a run with two workers on two busy cores), their setting up nothing of what is looked at here.
UNUSED_PLUGINS = [
    f"-pno:{name}"
    for name in (
        "cacheprovider",
        "asyncio",
        "anyio",
        "django",
        "hypothesispytest",
        "schemathesis",
        "pytest_postgresql",
        "pytest_redis",
        "timeout",
    )
]

# The command is started as from a terminal, with Ctrl-C's SIGINT (and SIGQUIT) at their defaults. A
# command that a shell without job control started in the background (``make test &``, CI runners,
# ``ci-under-load`` run that way) ignores both, and so does everything it starts: a pytest that
# inherits the ignored SIGINT never sees Ctrl-C (Python installs its KeyboardInterrupt handler only
# where SIGINT is not ignored). This test once waited 30 s for such a run to exit on Ctrl-C.
AS_FROM_A_TERMINAL = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "signal.signal(signal.SIGQUIT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
]

CONFTEST = """
import tests.support  # as tests/conftest.py does: every process of the run installs the reaper
"""

HOLDING = """
import json, os, subprocess, sys, threading, time
from pathlib import Path

from tests.support.azurite import start_azurite
from tests.support.postgres import start_postgres
from tests.support.redis_server import start_redis

PIDS = Path(os.environ["LEFT_BEHIND_PIDS"])


def test_holds_servers():
    redis, postgres, azurite = start_redis(), start_postgres(), start_azurite()
    from_thread = []
    thread = threading.Thread(target=lambda: from_thread.append(start_redis()))
    thread.start()
    thread.join()  # the thread that started it has ended: the server must live on, until we end
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pids = {
        "pytest": os.getpid(), "redis": redis.process.pid, "postgres": postgres.process.pid,
        "azurite": azurite.process.pid, "redis-from-thread": from_thread[0].process.pid, "child": child.pid,
    }
    PIDS.with_suffix(".tmp").write_text(json.dumps(pids))
    PIDS.with_suffix(".tmp").rename(PIDS)
    time.sleep(600)  # until the test ends it
"""


def started_by(marker: str, places: tuple[Path, ...]) -> dict[int, str]:
    """Every running process (not a zombie) with ``marker`` in its environment, or one of
    ``places`` in its command line, its working directory or a file it has open (Redis writes its
    title over its environment): pid -> command line."""
    found = {}
    names = tuple(str(place) for place in places)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_bytes()
            if stat[stat.rindex(b")") + 2 :].split()[0] in (b"Z", b"X"):
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().split(b"\0")
            paths = [os.readlink(entry / "cwd")]
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    paths.append(os.readlink(fd))
        except OSError:
            continue
        texts = (command, *paths)
        if marker.encode() in environ or any(
            text == name or f"{name}/" in text or f"{name} " in text for name in names for text in texts
        ):  # not a bare "in": pytest's test_x1 is a prefix of its test_x10
            found[int(entry.name)] = command
    return found


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] not in (b"Z", b"X")


@dataclass
class Run:
    """A command run as the test's subprocess, in a session of its own (as from a terminal: a
    signal to its process group reaches pytest, its xdist workers and the children in its group)."""

    process: subprocess.Popen[bytes]
    marker: str
    tmp: Path
    cwd: Path
    log: Path

    def left(self) -> dict[int, str]:
        return started_by(self.marker, (self.tmp, self.cwd))

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-5000:]

    def nothing_left(self, what: str) -> None:
        """Wait until the run has exited and nothing it started runs; fail naming what is left."""
        try:  # Ctrl-C tears the run down gracefully: on a busy machine that took over 30 s
            until_sync(lambda: self.process.poll() is not None, f"{what}: the run to exit", EXIT, step=0.05)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- output\n{self.output()}") from None
        try:
            until_sync(lambda: not self.left(), f"{what}: nothing left", GONE, step=0.05)
        except AssertionError:
            raise AssertionError(f"{what}: left behind: {self.left()}\n--- output\n{self.output()}") from None


@contextlib.contextmanager
def run(tmp_path: Path, command: list[str], env: dict[str, str] | None = None) -> Iterator[Run]:
    """Start ``command`` in ``tmp_path`` as ``Run``; on the way out, whatever is still marked is
    SIGKILLed (a failed test leaves nothing behind either)."""
    marker = f"LEFT_BEHIND_RUN={uuid.uuid4().hex}"
    # Not under tmp_path: pytest's folders are the user's alone, PostgreSQL runs as ``postgres``.
    tmp = Path(tempfile.mkdtemp(prefix="leaseboard-left-behind-"))
    tmp.chmod(0o755)
    log = tmp_path / "output.log"
    environment = {
        **os.environ,
        **(env or {}),
        "TMPDIR": str(tmp),
        "PYTHONPATH": str(ROOT),
        marker.split("=")[0]: marker.split("=")[1],
        "LEFT_BEHIND_PIDS": str(tmp_path / "pids.json"),
    }
    environment.pop("PYTEST_XDIST_WORKER", None)  # a run of its own, not one of our workers
    environment.pop("PYTEST_ADDOPTS", None)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*AS_FROM_A_TERMINAL, *command],
            cwd=tmp_path,
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    the_run = Run(process, marker, tmp, tmp_path, log)
    try:
        yield the_run
    finally:
        with contextlib.suppress(OSError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait(10)

        def killed() -> bool:  # keepers too, so again until none is left: killed, one may not sweep
            left = the_run.left()
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            return not left

        until_sync(killed, "nothing left after the test", GONE, step=0.05)
        shutil.rmtree(tmp, ignore_errors=True)


def pytest_run(tmp_path: Path, *options: str) -> contextlib.AbstractContextManager[Run]:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_holding.py").write_text(textwrap.dedent(HOLDING))
    command = [sys.executable, "-m", "pytest", "-q", "test_holding.py", *UNUSED_PLUGINS, *options]
    return run(tmp_path, command)


def holding(tmp_path: Path, the_run: Run) -> dict[str, int]:
    """The pids the throwaway test wrote once its servers ran, each checked running now."""
    pids_file = tmp_path / "pids.json"

    def written() -> bool:
        if the_run.process.poll() is not None:
            raise AssertionError(f"the run exited with {the_run.process.returncode}:\n{the_run.output()}")
        return pids_file.exists()

    until_sync(written, "the throwaway test's servers to run", UP, step=0.05)
    pids: dict[str, int] = json.loads(pids_file.read_text())
    assert all(running(pid) for pid in pids.values()), pids
    marked = the_run.left()
    assert set(pids.values()) <= set(marked), (pids, marked)  # what is looked for afterwards is seen
    return pids


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM to the group (timeout)", "SIGINT to the group (Ctrl-C)"]
)
def test_a_run_ended_by_a_signal_to_its_group_leaves_nothing(tmp_path: Path, signum: signal.Signals) -> None:
    with pytest_run(tmp_path, "-n", "2") as the_run:
        holding(tmp_path, the_run)
        started = time.monotonic()
        os.killpg(the_run.process.pid, signum)
        the_run.nothing_left(signum.name)
    print(f"{signum.name}: nothing left after {time.monotonic() - started:.1f} s")


@pytest.mark.parametrize("xdist", [False, True], ids=["alone", "with two xdist workers"])
def test_a_run_whose_pytest_is_sigkilled_leaves_nothing(tmp_path: Path, xdist: bool) -> None:
    with pytest_run(tmp_path, *(["-n", "2"] if xdist else ["-p", "no:xdist"])) as the_run:
        pids = holding(tmp_path, the_run)
        assert (pids["pytest"] == the_run.process.pid) != xdist
        started = time.monotonic()
        os.kill(the_run.process.pid, signal.SIGKILL)  # pytest alone: the rest of its group is not signalled
        the_run.nothing_left("SIGKILL of pytest")
    print(f"SIGKILL of pytest: nothing left after {time.monotonic() - started:.1f} s")


def test_a_sigkilled_xdist_worker_leaves_nothing_of_its_own(tmp_path: Path) -> None:
    with pytest_run(tmp_path, "-n", "2") as the_run:
        pids = holding(tmp_path, the_run)
        worker = pids.pop("pytest")
        assert worker != the_run.process.pid
        started = time.monotonic()
        os.kill(worker, signal.SIGKILL)
        until_sync(lambda: not any(running(pid) for pid in pids.values()), "the worker's servers to end", GONE)
        print(f"SIGKILL of a worker: its processes gone after {time.monotonic() - started:.1f} s")
        the_run.nothing_left("SIGKILL of an xdist worker, then the run's end")  # the run ends on its own


def test_bench_amqp_leaves_no_runhub_when_azurite_cannot_start(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tests.benchmarks.bench_amqp", "--events", "16", "--partitions", "2"]
    with run(tmp_path, command, {"LEASEBOARD_AZURITE": "/bin/false"}) as the_run:
        until_sync(lambda: the_run.process.poll() is not None, "the bench to fail", UP, step=0.05)
        assert the_run.process.returncode != 0 and "<azurite on" in the_run.output(), the_run.output()
        left = the_run.left()
        assert "runhub" not in " ".join(left.values()), left  # stopped by the bench itself, not only the keeper
        the_run.nothing_left("bench_amqp without Azurite")


def test_bench_amqp_sigkilled_with_its_servers_running_leaves_nothing(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tests.benchmarks.bench_amqp", "--events", "1000000", "--partitions", "2"]
    with run(tmp_path, command) as the_run:

        def serving() -> bool:
            if the_run.process.poll() is not None:
                raise AssertionError(f"the bench exited with {the_run.process.returncode}:\n{the_run.output()}")
            commands = " ".join(the_run.left().values())
            return "runhub" in commands and "azurite" in commands

        until_sync(serving, "runhub and Azurite to run", UP, step=0.05)
        os.kill(the_run.process.pid, signal.SIGKILL)
        the_run.nothing_left("SIGKILL of bench_amqp")


def test_a_sigterm_to_the_keepers_too_leaves_nothing(tmp_path: Path) -> None:
    """``pkill -f <checkout>`` signals every process whose command line names the checkout: the
    keepers (``tests/support/reaper.py``) but not PostgreSQL (``postgres -D <its home>``). A keeper
    ended by it swept nothing, and two clusters of a killed ci-under-load run stayed up for an hour:
    a keeper ignores SIGTERM, and ends only when its owner has (its pipe closes)."""
    with pytest_run(tmp_path, "-n", "2") as the_run:
        holding(tmp_path, the_run)
        keepers = [pid for pid, command in the_run.left().items() if "tests/support/reaper.py" in command]
        assert keepers, the_run.left()
        assert all(ignores(pid, signal.SIGTERM) for pid in keepers), "a keeper would end on SIGTERM"
        for pid in keepers:
            os.kill(pid, signal.SIGTERM)
        os.killpg(the_run.process.pid, signal.SIGKILL)  # then the run dies as it would: its keepers sweep
        the_run.nothing_left("SIGTERM to the keepers, then SIGKILL of the run")


def ignores(pid: int, signum: signal.Signals) -> bool:
    """Whether ``pid`` ignores ``signum`` (the ``SigIgn`` mask of ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False
