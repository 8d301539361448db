"""Real servers for tests, each on a free loopback port: ``start_x() -> Server``, then ``stop()``.

PostgreSQL here; Redis and Azurite belong here too, in the same shape. pytest-postgresql's
executor is not used: it runs ``pg_ctl`` as the current user, and PostgreSQL refuses to run as
root, which is how CI runs; this drops to the ``postgres`` user when started as root.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar


class ServerError(RuntimeError):
    """A test server could not be started; the message carries the end of its log."""


@dataclass
class Server:
    """A running server: where to reach it, and how to stop it (idempotent)."""

    name: str
    url: str
    port: int
    host: str = "127.0.0.1"
    _stop: Callable[[], None] = field(default=lambda: None, repr=False)
    _stopped: bool = field(default=False, repr=False)

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._stop()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (another process could still take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_until_ready(
    process: subprocess.Popen[bytes], ready: Callable[[], bool], timeout: float, what: str, log: Path,
    give_up: Callable[[], None],
) -> None:  # fmt: skip
    """Poll ``ready()`` until it is true. If ``process`` exits or ``timeout`` seconds pass first,
    ``give_up()`` (stop it) and raise ServerError saying ``what`` did not start, with the log's end."""
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            give_up()
            raise ServerError(f"{what} did not start:\n{_tail(log, 15)}")
        time.sleep(0.01)


class Startable(Protocol):
    @property
    def log_path(self) -> Path: ...

    def start(self) -> None: ...


S = TypeVar("S", bound=Startable)


def start_on_a_free_port(make: Callable[[int], S], in_use: str, clean_up: Callable[[], None], attempts: int = 3) -> S:
    """``make(port).start()`` on a free port, trying another when the chosen one was taken between
    choosing and binding it (the log says ``in_use``); ``clean_up()`` before any other failure."""
    for attempt in range(attempts):
        server = make(free_port())
        try:
            server.start()
            return server
        except ServerError:
            if attempt == attempts - 1 or in_use not in _tail(server.log_path, 10_000):
                clean_up()
                raise
    raise AssertionError("unreachable")


# PostgreSQL ----------------------------------------------------------------------------------


def postgres_bin_dir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` are: ``$LEASEBOARD_PG_BIN``, the newest Debian cluster
    version, or ``$PATH``. Raises ServerError naming what to install."""
    if configured := os.environ.get("LEASEBOARD_PG_BIN"):
        return Path(configured)
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True)
    for candidate in versions:
        if (candidate / "initdb").exists():
            return candidate
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise ServerError("PostgreSQL server binaries not found: apt-get install postgresql (or set LEASEBOARD_PG_BIN)")


def start_postgres(options: dict[str, str] | None = None) -> Server:
    """A throwaway PostgreSQL cluster on a free loopback port, trust auth, user ``postgres``.

    Durability is off (``fsync``, ``synchronous_commit``, ``full_page_writes``): the data lives
    only as long as the test session. ``url`` points at the ``postgres`` database. ``stop()``
    stops the server and deletes the cluster.
    """
    bin_dir = postgres_bin_dir()
    base = Path(tempfile.mkdtemp(prefix="leaseboard-pg-"))
    data, log = base / "data", base / "server.log"
    uid = gid = None
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(base, ignore_errors=True)
            raise ServerError(
                "running as root, PostgreSQL needs a 'postgres' user: apt-get install postgresql"
            ) from None
        uid, gid = account.pw_uid, account.pw_gid
        os.chown(base, uid, gid)

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args,
            cwd=base,
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
            env={**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"},
            user=uid,
            group=gid,
        )

    def remove() -> None:
        shutil.rmtree(base, ignore_errors=True)

    try:
        run(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "-N")
    except subprocess.CalledProcessError as exc:
        remove()
        raise ServerError(f"initdb failed: {exc.stderr.strip() or exc.stdout.strip()}") from exc

    settings = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", **(options or {})}
    for attempt in range(3):  # the free port may be taken between choosing it and binding it
        port = free_port()
        server_options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 " + " ".join(
            f"-c {k}={v}" for k, v in settings.items()
        )
        pg_ctl = (str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", server_options)
        started = run(*pg_ctl, "-w", "-t", "30", "start", check=False)
        if started.returncode == 0:
            break
        if attempt == 2 or "could not bind" not in _tail(log):
            remove()
            raise ServerError(f"PostgreSQL did not start: {started.stderr.strip()}\n{_tail(log)}")

    def stop() -> None:
        try:
            run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "30", "stop", check=False)
        finally:
            remove()

    return Server("postgresql", f"postgres://postgres@127.0.0.1:{port}/postgres", port, _stop=stop)


# Django --------------------------------------------------------------------------------------


def add_django_database(alias: str, url: str, **options: object) -> None:
    """Make ``alias`` a database of ``django.db.connections`` for the rest of the process, as if
    ``settings.DATABASES`` had named it from the start (Django's defaults are filled in)."""
    import dj_database_url
    from django.conf import settings
    from django.db import connections

    config = dj_database_url.parse(url, conn_max_age=0)
    config["OPTIONS"] = {**config.get("OPTIONS", {}), **options}
    # Independent of "default": its test database can be created when "default"'s is not needed.
    config["TEST"] = {"DEPENDENCIES": []}
    settings.DATABASES[alias] = config
    # connections.settings is settings.DATABASES itself (its defaults are filled in place), unless
    # a test replaced it; configure_settings() only adds what is missing.
    if connections.settings is not settings.DATABASES:
        connections.settings[alias] = config
    connections.configure_settings(connections.settings)


def remove_django_database(alias: str) -> None:
    """Undo ``add_django_database``: close this thread's connection and forget the alias."""
    from django.conf import settings
    from django.db import connections

    if alias in connections:
        connections[alias].close()
        del connections[alias]
    connections.settings.pop(alias, None)
    settings.DATABASES.pop(alias, None)
