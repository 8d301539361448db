"""Nothing a test run or a bench starts outlives it, however it ends: a normal exit, a failure half
way, SIGTERM (``timeout``), Ctrl-C, or SIGKILL of pytest, of a pytest-xdist worker or of a bench.

Every process this interpreter starts through ``subprocess.Popen`` or ``os.fork`` (``install()``
wraps them; so ``subprocess.run``, asyncio's subprocesses, execnet's xdist workers,
``ServerProcess``, ``Processes.spawn``, multiprocessing's processes, a ``ProcessPoolExecutor``'s
workers) is told, pid and start time, to a *keeper*: a small process of its own session (no
terminal's Ctrl-C, no ``timeout``'s group signal reaches it), started with the first child, reading
a pipe whose only writer is this interpreter. When that pipe closes, i.e. when the owner has
ended, by whatever means, the keeper ends what is left of the owner's children:

- each child still running (the same pid *and* start time: pids are reused, ``pid_max`` is 32768
  here), its process group when it leads one (``start_new_session``: the servers), and every
  descendant of either (PostgreSQL's backends, which run in sessions of their own; Spark's
  executors; a ``runworkers``' workers), found through ``/proc`` at the time of the sweep;
- all stopped first (SIGSTOP, until nothing new appears: nothing forks unseen meanwhile), then
  each given the signal that stops it cleanly (``watch(stop=...)``: a server's ``stop_signal``,
  SIGINT for PostgreSQL; else SIGTERM) and resumed; SIGKILL to whatever is left after ``GRACE``
  seconds;
- then deletes the directories given to ``remove_on_exit()`` (a server's ``mkdtemp`` home).

Why not PR_SET_PDEATHSIG: it fires when the *thread* that forked the child ends (fixtures start
servers from pool threads that end right after), it reaches only the direct child (not a
PostgreSQL backend or a Spark executor), and not a process that re-forks. Why not only signal
handlers and ``atexit``: SIGKILL runs neither. The keeper covers all three. Its gaps: a child
started and not yet told when its owner is SIGKILLed (a few microseconds); a child started by
other means (``os.posix_spawn``, multiprocessing's "spawn" and "forkserver"); a descendant that
daemonizes (forks twice, leaves its session) before the sweep, none of which the suite does.

The keeper is this file run as a script (standard library only). ``tests.support`` installs the
wrapper on import, so every pytest process (``tests/conftest.py`` imports it) and every bench
(``tests/benchmarks/__init__.py``) has it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

GRACE = 5.0  # seconds a clean stop may take before SIGKILL
STEP = 0.02  # seconds between two looks at what is left

# -- the owner's side ----------------------------------------------------------------------------

_lock = threading.RLock()
_pipe: int | None = None  # the write end; the keeper reads the other
_keeper: subprocess.Popen[bytes] | None = None
_starting: int | None = None  # the thread starting the keeper
_original_init: Any = None


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def _tell(message: dict[str, Any]) -> None:
    """Send one line to the keeper, starting it first if need be. Never raises: a keeper that cannot
    be told must not fail the test that started a process."""
    global _pipe, _keeper, _starting
    line = (json.dumps(message) + "\n").encode()
    with _lock:
        if _starting == threading.get_ident():  # the keeper's own Popen: nothing watches the watcher
            return
        if _pipe is None:
            _starting = threading.get_ident()
            try:
                read, write = os.pipe()  # neither end is inherited by other children (PEP 446)
                try:
                    _keeper = subprocess.Popen(
                        [sys.executable, "-I", "-S", __file__, str(os.getpid())],
                        stdin=read,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        cwd="/",
                        start_new_session=True,
                    )
                except OSError:
                    os.close(write)
                    return
                finally:
                    os.close(read)
                _pipe = write
            finally:
                _starting = None
        with contextlib.suppress(OSError):  # a keeper gone (killed by hand): nothing more to do
            os.write(_pipe, line)


def watch(pid: int, *, stop: signal.Signals = signal.SIGTERM, group: bool | None = None) -> None:
    """Have ``pid`` (a child of ours, just started) and its descendants ended when this process
    ends: ``stop`` first, SIGKILL after ``GRACE`` s. ``group``: also its process group (None: when
    it leads one). Telling it again replaces what was told."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return  # gone already: nothing to watch
    fields = stat[stat.rindex(b")") + 2 :].split()
    leads = int(fields[2]) == pid  # exec has happened (Popen returns after it): setsid too
    _tell({"pid": pid, "start": int(fields[19]), "stop": int(stop), "group": leads if group is None else group})


def remove_on_exit(path: Path) -> None:
    """Have the directory ``path`` deleted once the sweep at this process's end is over."""
    _tell({"remove": str(path)})


def keeper_pid() -> int | None:
    """The keeper's pid once a child was started, else None."""
    return _keeper.pid if _keeper is not None else None


def _after_fork_in_child() -> None:
    # A forked child (multiprocessing's "fork") must not hold the pipe open: the keeper would wait
    # for it too. It starts a keeper of its own if it starts processes; the lock is new, as another
    # thread of the parent may have held it at the fork.
    global _pipe, _keeper, _starting, _lock
    if _pipe is not None:
        with contextlib.suppress(OSError):
            os.close(_pipe)
    _pipe, _keeper, _starting, _lock = None, None, None, threading.RLock()


def install() -> None:
    """Tell the keeper of every child ``subprocess.Popen`` or ``os.fork`` (multiprocessing's
    processes, a ``ProcessPoolExecutor``'s workers) starts from now on (idempotent)."""
    global _original_init
    with _lock:
        if _original_init is not None:
            return
        _original_init = subprocess.Popen.__init__
        original_fork = os.fork

        def __init__(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
            _original_init(self, *args, **kwargs)
            watch(self.pid)

        def fork() -> int:
            pid = original_fork()
            if pid:
                watch(pid)
            return pid

        setattr(subprocess.Popen, "__init__", __init__)  # noqa: B010 (mypy: no assignment to a method)
        os.fork = fork
        os.register_at_fork(after_in_child=_after_fork_in_child)


# -- the keeper's side ---------------------------------------------------------------------------

Table = dict[int, tuple[int, int, int]]  # pid -> (parent, process group, start time)


def _table() -> Table:
    """Every process now running (zombies left out)."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()  # state, ppid, pgrp, ..., starttime (19)
        if fields[0] not in (b"Z", b"X"):
            table[int(entry.name)] = (int(fields[1]), int(fields[2]), int(fields[19]))
    return table


def _roots(watched: dict[int, dict[str, Any]], table: Table) -> dict[int, tuple[int, int]]:
    """What the owner started that still runs: pid -> (start time, stop signal), for each watched
    process still running and each member of the process group one led (a group's id is not
    reused while a member lives, so its members are ours even once the leader is gone)."""
    found: dict[int, tuple[int, int]] = {}
    for pid, entry in watched.items():
        now = table.get(pid)
        if now is not None and now[2] != entry["start"]:
            continue  # the pid was reused: ours ended, and with it its group (else no reuse)
        if now is not None:
            found[pid] = (now[2], entry["stop"])
        if entry["group"]:
            found.update({member: (row[2], entry["stop"]) for member, row in table.items() if row[1] == pid})
    return found


def _is_keeper(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[3:4] == [__file__.encode()]
    except OSError:
        return False


def _left(watched: dict[int, dict[str, Any]], known: dict[int, int]) -> dict[int, int]:
    """pid -> start time of what is left: the roots, those of ``known`` still running, and every
    descendant of either but the keepers of those (an xdist worker's: it ends on its own, once it
    has swept what its owner started and deleted its directories)."""
    table = _table()
    found = {pid: start for pid, (start, _) in _roots(watched, table).items()}
    found.update({pid: start for pid, start in known.items() if pid in table and table[pid][2] == start})
    children: dict[int, list[int]] = {}
    for pid, row in table.items():
        children.setdefault(row[0], []).append(pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and not _is_keeper(child):
                found[child] = table[child][2]
                todo.append(child)
    return found


def _signal(pid: int, start: int, signum: int) -> None:
    if start_time(pid) == start:  # still the same process, checked just before
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def _running(pid: int, start: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    fields = stat[stat.rindex(b")") + 2 :].split()
    return fields[0] not in (b"Z", b"X") and int(fields[19]) == start


def _freeze(watched: dict[int, dict[str, Any]]) -> dict[int, int]:
    """SIGSTOP what is left, again until nothing new appears: a stopped process forks no more (a
    fork that a signal interrupts is undone), so nothing it starts escapes the sweep, not even a
    child forked as its parent was being signalled and orphaned when that parent ended."""
    frozen: dict[int, int] = {}
    for _ in range(50):
        left = _left(watched, frozen)
        new = {pid: start for pid, start in left.items() if pid not in frozen}
        if not new:
            return left
        for pid, start in new.items():
            _signal(pid, start, signal.SIGSTOP)
        frozen.update(new)
    return _left(watched, frozen)


def sweep(watched: dict[int, dict[str, Any]], grace: float = GRACE) -> None:
    """End what is left of ``watched``: all stopped first (``_freeze``), then each root its stop
    signal (their descendants are theirs to stop) and all resumed to act on it; SIGKILL to
    everything left after ``grace`` seconds, again while anything forks."""
    left = _freeze(watched)
    for pid, (start, stop) in _roots(watched, _table()).items():
        _signal(pid, start, stop)
    for pid, start in left.items():
        _signal(pid, start, signal.SIGCONT)
    deadline = time.monotonic() + grace
    while left and time.monotonic() < deadline:
        time.sleep(STEP)
        left = {pid: start for pid, start in left.items() if _running(pid, start)}
    for _ in range(50):
        left = _left(watched, left)
        if not left:
            return
        for pid, start in left.items():
            _signal(pid, start, signal.SIGKILL)
        time.sleep(STEP)


def keep(lines: Iterable[bytes]) -> None:
    """The keeper: record what ``lines`` tell until they end (the owner ended), then sweep and
    delete the directories."""
    watched: dict[int, dict[str, Any]] = {}
    remove: list[str] = []
    for line in lines:
        with contextlib.suppress(ValueError, KeyError):
            message = json.loads(line)
            if "remove" in message:
                remove.append(message["remove"])
            else:
                watched[int(message["pid"])] = message
    sweep(watched)
    for path in remove:
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    # SIGTERM too: ``pkill -f <checkout>`` reaches a keeper (its command line names this file) but not
    # a server the keeper must sweep (``postgres -D <home>``); a keeper ends when its owner has.
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    keep(sys.stdin.buffer)
