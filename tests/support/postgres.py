"""PostgreSQL as a test server: a throwaway cluster on a free loopback port, user ``postgres``,
trust authentication.

pytest-postgresql's executor is not used: it runs ``pg_ctl`` as the current user, and PostgreSQL
refuses to run as root, which is how CI runs; this drops to the ``postgres`` user when started as
root. The server runs in the foreground as our child (``postgres -D``, not ``pg_ctl``), so it is
started, waited for and ended like every other ``ServerProcess``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.support import reaper
from tests.support.servers import ServerError, ServerProcess, start_on_a_free_port

# Durability off: the data lives only as long as the test session, and the machine does not crash.
FAST = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def postgres_bin_dir() -> Path:
    """Where ``initdb`` and ``postgres`` are: ``$LEASEBOARD_PG_BIN``, the newest Debian cluster
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


def _run_as() -> tuple[int, int] | None:
    """The ``postgres`` user's (uid, gid) when we are root (initdb and postgres refuse to run as
    root), else None; ServerError when there is no such user."""
    if os.geteuid() != 0:
        return None
    try:
        account = pwd.getpwnam("postgres")
    except KeyError:
        raise ServerError("running as root, PostgreSQL needs a 'postgres' user: apt-get install postgresql") from None
    return account.pw_uid, account.pw_gid


class Postgres(ServerProcess):
    """One cluster under ``home`` (``data/``, the socket and ``server.log``), served on ``port``.

    ``kill()`` is a crash (the next ``start()`` recovers from the WAL: only commits made with
    ``synchronous_commit=on`` are sure to survive it); ``shutdown()`` is a fast shutdown;
    ``stop()`` also deletes the cluster.
    """

    name = "postgresql"
    stop_signal = signal.SIGINT  # "fast" shutdown: roll back open transactions, then exit
    # "Immediate" shutdown: every process quits at once and the next start recovers, as after a
    # crash. Not SIGKILL: the postmaster's children each run in a session of their own, so a
    # SIGKILL to its group leaves them attached to the shared memory the next start must reuse.
    kill_signal = signal.SIGQUIT

    def __init__(self, port: int, home: Path, settings: dict[str, str], user: tuple[int, int] | None) -> None:
        super().__init__(port, home)
        self.settings = settings
        self.user = user

    @classmethod
    def initdb(cls, home: Path) -> tuple[int, int] | None:
        """A new cluster in ``home/data``; returns the user the server must run as."""
        user = _run_as()
        if user is not None:
            os.chown(home, *user)
        _run(user, home, "initdb", "-D", str(home / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8", "-N")
        return user

    @property
    def url(self) -> str:
        return self.database_url("postgres")

    def database_url(self, database: str) -> str:
        return f"postgres://postgres@{self.host}:{self.port}/{database}"

    def create_database(self, name: str) -> None:
        _run(self.user, self.home, "createdb", "-h", self.host, "-p", str(self.port), "-U", "postgres", name)

    def command(self) -> list[str]:
        options = [f"--{key}={value}" for key, value in self.settings.items()]
        return [
            str(postgres_bin_dir() / "postgres"),
            "-D",
            str(self.home / "data"),
            "-p",
            str(self.port),
            "-k",
            str(self.home),
            "-c",
            f"listen_addresses={self.host}",
            *options,
        ]

    def ready(self) -> bool:
        # What ``pg_ctl -w`` reads: the postmaster writes "ready" into its pid file once it accepts
        # connections (a stale file from a crash names another pid).
        try:
            lines = (self.home / "data" / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return (
            len(lines) >= 8
            and self.process is not None
            and lines[0] == str(self.process.pid)
            and lines[7].strip() == "ready"
        )

    def popen_options(self) -> dict[str, Any]:
        uid, gid = self.user if self.user else (None, None)
        return {"cwd": self.home, "env": _env(), "user": uid, "group": gid}


def _env() -> dict[str, str]:
    return {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}


def _run(user: tuple[int, int] | None, cwd: Path, tool: str, *args: str) -> None:
    uid, gid = user if user else (None, None)
    result = subprocess.run(
        [str(postgres_bin_dir() / tool), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        user=uid,
        group=gid,
        check=False,
    )
    if result.returncode != 0:
        raise ServerError(f"{tool} failed: {result.stderr.strip() or result.stdout.strip()}")


def start_postgres(settings: dict[str, str] | None = None, attempts: int = 3) -> Postgres:
    """A new cluster, running on a free loopback port with ``FAST`` settings and then ``settings``
    (server options: ``{"max_connections": "200"}``). ``url`` names the ``postgres`` database."""
    home = Path(tempfile.mkdtemp(prefix="leaseboard-pg-"))
    reaper.remove_on_exit(home)  # if this process is killed before it stops the server
    try:
        user = Postgres.initdb(home)
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        raise
    merged = {**FAST, **(settings or {})}
    return start_on_a_free_port(lambda port: Postgres(port, home, merged, user), attempts)
