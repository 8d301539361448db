"""``redis-server`` as a test server on a free loopback port, without persistence.

``start_redis()`` returns a running ``RedisServer``; ``restart()`` stops it (every key is gone, as
after a crash of a Redis without persistence) and starts it again on the same port; ``stop()`` ends
it for good. The binary is ``$LEASEBOARD_REDIS_SERVER`` or ``redis-server`` on ``$PATH``
(``.ci/system-deps.sh`` installs it).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

from tests.support import reaper
from tests.support.servers import HOST, ServerError, ServerProcess, start_on_a_free_port


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


def answers(host: str, port: int) -> bool:
    """True when something on ``port`` answers PING with PONG (or asks for a password)."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
    except OSError:
        return False
    return reply.startswith((b"+PONG", b"-NOAUTH"))


class RedisServer(ServerProcess):
    """One redis-server on a fixed port, its files in ``directory``. ``shutdown()`` (SIGTERM) saves
    nothing: there are no save points, so every key is lost."""

    name = "redis-server"

    def __init__(self, port: int, directory: Path, password: str | None = None, host: str = HOST) -> None:
        super().__init__(port, directory, host)
        self.password = password

    @property
    def directory(self) -> Path:
        return self.home

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.home / "redis.log"

    def command(self) -> list[str]:
        command = [
            redis_binary(),
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.home),
            "--daemonize",
            "no",
        ]
        return [*command, "--requirepass", self.password] if self.password else command

    def ready(self) -> bool:
        return super().ready() and answers(self.host, self.port)

    def restart(self) -> None:
        """Stop (losing every key) and start again on the same port."""
        self.shutdown()
        self.start()


def start_redis(password: str | None = None, attempts: int = 3) -> RedisServer:
    """A running redis-server on a free loopback port, no persistence, in a fresh directory."""
    directory = Path(tempfile.mkdtemp(prefix="leaseboard-redis-"))
    reaper.remove_on_exit(directory)  # if this process is killed before it stops the server
    return start_on_a_free_port(lambda port: RedisServer(port, directory, password), attempts)
