"""``redis-server`` as a test server on a free loopback port, without persistence.

``start_redis()`` returns a running ``RedisServer``; ``restart()`` stops it (``SHUTDOWN NOSAVE``:
every key is gone, as after a crash of a Redis without persistence) and starts it again on the
same port; ``stop()`` ends it for good. The binary is ``$LEASEBOARD_REDIS_SERVER`` or
``redis-server`` on ``$PATH`` (``.ci/system-deps.sh`` installs it). The server runs in the
foreground as our child, so there is exactly one process id to stop.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.servers import ServerError, start_on_a_free_port, wait_until_ready


def redis_binary(name: str = "redis-server") -> str:
    """Where ``redis-server`` (or ``redis-cli``) is; ServerError saying how to install it."""
    configured = os.environ.get("LEASEBOARD_REDIS_SERVER")
    if configured:
        candidate = Path(configured).with_name(name) if name != "redis-server" else Path(configured)
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise ServerError(f"{name} not found: apt-get install redis-server (or run .ci/system-deps.sh)")


def _answers(host: str, port: int) -> bool:
    """True when something on ``port`` answers PING with PONG (or asks for a password)."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
    except OSError:
        return False
    return reply.startswith((b"+PONG", b"-NOAUTH"))


@dataclass
class RedisServer:
    """One redis-server process on a fixed port."""

    port: int
    directory: Path
    password: str | None = None
    host: str = "127.0.0.1"
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.directory / "redis.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 15.0) -> None:
        """Start the server (again) on its port; return once it answers PING."""
        if self.running:
            return
        command = [
            redis_binary(), "--port", str(self.port), "--bind", self.host, "--save", "", "--appendonly", "no",
            "--dir", str(self.directory), "--daemonize", "no",
        ]  # fmt: skip
        if self.password:
            command += ["--requirepass", self.password]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed by _reap)
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        wait_until_ready(
            self.process, lambda: _answers(self.host, self.port), timeout, f"redis-server on port {self.port}",
            self.log_path, lambda: self._reap(kill=True),
        )  # fmt: skip

    def shutdown(self) -> None:
        """``SHUTDOWN NOSAVE``: the process ends and every key is lost (nothing is persisted)."""
        if not self.running:
            return
        command = [redis_binary("redis-cli"), "-h", self.host, "-p", str(self.port)]
        env = {**os.environ, "REDISCLI_AUTH": self.password} if self.password else None
        subprocess.run([*command, "shutdown", "nosave"], capture_output=True, timeout=10, env=env, check=False)
        self._reap(kill=False)

    def restart(self) -> None:
        """Stop (losing every key) and start again on the same port."""
        self.shutdown()
        self.start()

    def stop(self) -> None:
        """End the server and delete its directory (idempotent)."""
        self.shutdown()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _reap(self, kill: bool) -> None:
        if self.process is not None:
            try:
                if kill:
                    self.process.kill()
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None


def start_redis(password: str | None = None, attempts: int = 3) -> RedisServer:
    """A running redis-server on a free loopback port, no persistence, in a fresh directory."""
    directory = Path(tempfile.mkdtemp(prefix="leaseboard-redis-"))
    return start_on_a_free_port(
        lambda port: RedisServer(port, directory, password), "Address already in use",
        lambda: shutil.rmtree(directory, ignore_errors=True), attempts,
    )  # fmt: skip
