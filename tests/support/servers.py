"""The one way tests start a real server: a child process on a free loopback port, ready before
``start()`` returns, on another port when the chosen one was taken, and ended with its process group.

A kind of server is a ``ServerProcess`` subclass saying its command, when it is ready and what its
log says when its port is taken: PostgreSQL (``tests.support.postgres``), Redis
(``tests.support.redis_server``) and Azurite (``tests.support.azurite``). Each runs in the
foreground as our child, in a session of its own; after its own signal, one SIGKILL to that process
group ends whatever is left of it, so nothing outlives a test that failed half-way. Nor a run that
was killed: ``tests.support.reaper`` ends the group (its stop signal first) once this process has
ended, however it ended.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from tests.support import reaper
from tests.support.waiting import until_sync

HOST = "127.0.0.1"


class ServerError(RuntimeError):
    """A test server could not be started; the message carries the end of its log."""


class PortTaken(ServerError):
    """Another process bound the port between our choosing it and the server binding it."""


def free_port(host: str = HOST) -> int:
    """A TCP port nobody listens on right now (another process could still take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def listens(pid: int, port: int) -> bool:
    """True when process ``pid`` holds a socket listening on TCP ``port`` (Linux: ``/proc``).

    Only this tells our server from another process that took the port first: that one answers
    a connection too, while ours is about to exit with "address in use"."""
    sockets = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()  # sl, local address:port (hex), remote, state (0A: LISTEN), ..., inode
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    sockets.add(f"socket:[{fields[9]}]")
    if not sockets:
        return False
    descriptors = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(OSError):
        for fd in descriptors.iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) in sockets:
                    return True
    return False


def tail(path: Path, lines: int = 20, since: int = 0) -> str:
    """The last ``lines`` lines of ``path`` from byte ``since`` on, or "(no log)"."""
    try:
        with path.open("rb") as log:
            log.seek(since)
            text = log.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class ServerProcess:
    """One server process on a fixed port, with its files under ``home``.

    ``start()`` (again after ``kill()`` or ``shutdown()``: same port, same data), ``shutdown()`` (a
    clean stop), ``kill()`` (a crash), ``stop()`` (shutdown and delete ``home``; idempotent). A kind
    of server overrides ``command()`` and, where listening is not yet serving, ``ready()``.
    """

    name: ClassVar[str] = "server"  # for messages
    in_use: ClassVar[str] = "Address already in use"  # what the log says when the port is taken
    stop_signal: ClassVar[signal.Signals] = signal.SIGTERM  # what asks it to shut down cleanly
    kill_signal: ClassVar[signal.Signals] = signal.SIGKILL  # what ends it at once, as a crash would

    def __init__(self, port: int, home: Path, host: str = HOST) -> None:
        self.port = port
        self.home = home
        self.host = host
        self.process: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"<{self.name} on {self.host}:{self.port}>"

    # what a kind of server says ----------------------------------------------------------------

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        """True once the server serves (by default: our process listens on its port)."""
        return self.process is not None and listens(self.process.pid, self.port)

    def popen_options(self) -> dict[str, Any]:
        """More ``subprocess.Popen`` arguments (``user``, ``env``, ``cwd``)."""
        return {}

    # running it ----------------------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        return self.home / "server.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 30.0) -> None:
        """Start the server (a no-op while it runs) and return once ``ready()``. Raises PortTaken when
        the port was taken, ServerError when it exits or is not ready within ``timeout`` seconds;
        either way the process is gone."""
        if self.running:
            return
        since = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:  # the child has its own descriptor once started
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                **self.popen_options(),
            )
        process = self.process
        reaper.watch(process.pid, stop=self.stop_signal, group=True)

        def alive() -> None:
            if process.poll() is not None:
                log = tail(self.log_path, 10_000, since)
                error = PortTaken if self.in_use in log else ServerError
                raise error(f"{self} exited with {process.returncode}:\n{tail(self.log_path, 15, since)}")

        try:
            until_sync(self.ready, f"{self} to be ready", timeout, step=0.01, check=alive)
        except AssertionError:
            self.kill()
            raise ServerError(f"{self} not ready after {timeout:g}s:\n{tail(self.log_path, 15, since)}") from None
        except ServerError:
            self.kill()
            raise

    def shutdown(self, timeout: float = 20.0) -> None:
        """Ask the server to stop (``stop_signal``); kill its process group if it has not within
        ``timeout`` seconds. Its data stays for ``start()``."""
        self._end(self.stop_signal, timeout)

    def kill(self) -> None:
        """End the server at once (``kill_signal``), as a crash would; the data stays for ``start()``."""
        self._end(self.kill_signal, 10.0)

    def stop(self) -> None:
        """Shut the server down and delete ``home`` (idempotent)."""
        self.shutdown()
        self.remove()

    def remove(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)

    def _end(self, signum: signal.Signals, timeout: float) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        # The group's id is the leader's pid. The leader is left a zombie (waited on with WNOWAIT)
        # until the group has been swept, so that id cannot meanwhile go to an unrelated process.
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signum)
            with contextlib.suppress(AssertionError):  # it did not exit in time: SIGKILL below
                until_sync(lambda: _exited(process.pid), f"{self} to exit on {signum.name}", timeout, step=0.01)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the leader if it still runs, and whatever it forked
        process.wait(10)


def _exited(pid: int) -> bool:
    """True once child ``pid`` has exited, without reaping it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # already reaped
        return True


S = TypeVar("S", bound=ServerProcess)


def start_on_a_free_port(make: Callable[[int], S], attempts: int = 3) -> S:
    """``make(port)`` on a free port, started. When the port was taken between choosing and binding
    it, tries another (``attempts`` ports in all); ServerError otherwise, with ``home`` deleted."""
    for attempt in range(attempts):
        server = make(free_port())
        try:
            server.start()
            return server
        except PortTaken:
            if attempt == attempts - 1:
                server.remove()
                raise
        except BaseException:
            server.remove()
            raise
    raise AssertionError("unreachable")
