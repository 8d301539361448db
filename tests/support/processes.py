"""Real ``manage.py`` processes for end-to-end tests: their environment, a migrated SQLite file, and
starting, reading, waiting on and killing them.

``Processes`` keeps the processes a test started by name, each writing to ``<root>/<name>.log``;
its ``until`` is ``tests.support.waiting.until`` failing early, with the logs, when a process exits
unexpectedly. A suite subclasses it with its own commands and what it reads back; ``SqlSite`` is
one for processes on a SQLite file (the SQL store) and an embedded hub.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

import pytest

from balancer.model import HubRef
from dashboard.sql.store import SqlStore
from tests.support import migrated, waiting
from tests.support.databases import add_django_database, remove_django_database
from tests.workers.recording import read_records
from workers.hub.embedded import EmbeddedHub

ROOT = Path(__file__).resolve().parents[2]
_aliases = itertools.count()


def worker_env(root: Path, **extra: str) -> dict[str, str]:
    """This process's environment with what a worker process of a test needs: its var, hub and
    record directories under ``root``, INFO logs, unbuffered output; then ``extra``."""
    return {
        **os.environ,
        "LEASEBOARD_VAR_DIR": str(root / "var"),
        "LEASEBOARD_HUB_DIR": str(root / "hub"),
        "LEASEBOARD_RECORD_DIR": str(root / "records"),
        "LEASEBOARD_LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def manage(*args: str) -> list[str]:
    """The command line of ``manage.py args`` (run it in ``ROOT``)."""
    return [sys.executable, "manage.py", *args]


def migrate(env: dict[str, str]) -> None:
    """``manage.py migrate`` the database ``env`` names (a new SQLite file: a copy, ``tests/support/migrated.py``)."""
    migrated.migrate(env)


@contextmanager
def migrated_sqlite(root: Path, django_db_blocker: Any, *, partitions: int) -> Iterator[tuple[dict[str, str], str]]:
    """A migrated SQLite file ``root/db.sqlite3`` for the processes, the environment pointing them at
    it (``worker_env``), and a Django alias through which the test reads the same file; database
    access is unblocked while the context is open."""
    url = f"sqlite:///{root / 'db.sqlite3'}"
    env = worker_env(root, DATABASE_URL=url, LEASEBOARD_PARTITIONS=str(partitions))
    migrate(env)
    alias = f"processes_{next(_aliases)}"
    add_django_database(alias, url, timeout=20)
    try:
        with django_db_blocker.unblock():
            yield env, alias
    finally:
        remove_django_database(alias)


def start_logged(
    log: Path, command: list[str], env: dict[str, str], *, pipe_stdout: bool = False, **popen: Any
) -> subprocess.Popen[bytes]:
    """Start ``command`` in the repository, its output appended to ``log`` (with ``pipe_stdout``,
    standard error only: standard output is the caller's to read)."""
    with log.open("ab") as out:
        stdout, stderr = (subprocess.PIPE, out) if pipe_stdout else (out, subprocess.STDOUT)
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=stdout, stderr=stderr, **popen)


def kill(process: subprocess.Popen[bytes], *, group: bool = False) -> None:
    """Kill ``process`` (with ``group``, its whole process group: a Spark driver and its JVM) if it
    still runs, and reap it."""
    if process.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL) if group else process.kill()
        process.wait(10)


def last_enqueued(hub: EmbeddedHub) -> dict[str, int]:
    """Partition -> the sequence number of the last event on ``hub``."""
    return {p: hub.properties(p).last_enqueued_sequence_number for p in hub.partition_ids()}


@dataclass
class Processes:
    """The processes a test started under ``root``, by name, each logging to ``<root>/<name>.log``."""

    root: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, kw_only=True)
    groups: set[str] = field(default_factory=set, kw_only=True)  # started in a session of their own
    expected_exits: ClassVar[tuple[int, ...]] = (0, -signal.SIGKILL)  # any other fails ``until``
    poll: ClassVar[float] = 0.05  # seconds between two polls of ``until``

    def spawn(self, name: str, command: list[str], env: dict[str, str], **popen: Any) -> subprocess.Popen[bytes]:
        """``start_logged`` to ``<root>/<name>.log``; the process is ``processes[name]``."""
        process = start_logged(self.root / f"{name}.log", command, env, **popen)
        self.processes[name] = process
        if popen.get("start_new_session"):
            self.groups.add(name)
        return process

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def records(self) -> list[tuple[str, int, str]]:
        """What ``tests.workers.recording.RecordingHandler`` recorded under ``<root>/records``."""
        return read_records(self.root / "records")

    def kill_all(self) -> None:
        """Kill whatever still runs (test teardown)."""
        for name, process in self.processes.items():
            kill(process, group=name in self.groups)

    def check_exits(self) -> None:
        """Fail, with its log, if a process exited with a code not in ``expected_exits``."""
        for name, process in self.processes.items():
            if process.poll() is not None and process.returncode not in self.expected_exits:
                raise AssertionError(f"{name} exited with {process.returncode}:\n{self.log(name)[-4000:]}")

    async def until(self, condition: Callable[[], Any], timeout: float, what: str) -> Any:
        """``tests.support.waiting.until`` polling every ``poll`` seconds, failing as soon as a process
        exits unexpectedly, and with the logs."""

        def logs() -> str:
            return "\n".join(f"--- {name}\n{self.log(name)[-3000:]}" for name in self.processes)

        started = time.monotonic()
        found = await waiting.until(condition, what, timeout, step=self.poll, check=self.check_exits, detail=logs)
        # Each wait's length, in the test's captured output: a run cut short by pytest-timeout says which
        # phase took the time (the Spark cluster test was cut at 300 s once in CI with no other clue).
        print(f"{time.strftime('%H:%M:%S')} waited {time.monotonic() - started:.1f} s for {what}", flush=True)
        return found


@dataclass
class SqlSite(Processes):
    """Processes on one migrated SQLite file and one embedded hub; the test reads the store through
    ``store`` (a ``SqlStore`` on the Django alias ``alias``, the same file)."""

    env: dict[str, str]
    ref: HubRef
    hub: EmbeddedHub
    store: SqlStore
    alias: str

    @classmethod
    @asynccontextmanager
    async def open(
        cls, root: Path, environment: tuple[dict[str, str], str], ref: HubRef, *, partitions: int
    ) -> AsyncIterator[Self]:
        """A site under ``root`` on ``environment`` (what ``migrated_sqlite`` gives: it is entered in a
        sync fixture, as a Django alias must be removed outside the event loop) and the hub
        ``ref.hub``; on the way out, whatever still runs is killed and the hub and the store closed."""
        env, alias = environment
        hub = EmbeddedHub(root / "hub", ref.hub, partitions=partitions)
        site = cls(root, env, ref, hub, SqlStore(alias), alias)
        try:
            yield site
        finally:
            site.kill_all()
            hub.close()
            await site.store.aclose()

    async def owners(self) -> dict[str, str]:
        return {r.partition_id: r.owner_id for r in await self.store.list_ownership(self.ref)}

    async def checkpoints(self) -> dict[str, int]:
        return {c.partition_id: c.sequence_number for c in await self.store.list_checkpoints(self.ref)}

    def last(self) -> dict[str, int]:
        return last_enqueued(self.hub)


def sql_site_fixtures(site: type[SqlSite], ref: HubRef, *, partitions: int) -> tuple[Any, Any]:
    """The ``environment`` (``migrated_sqlite``) and ``site`` (``site.open``) fixtures of a module whose
    tests run processes on a SQLite file and an embedded hub: ``environment, site = sql_site_fixtures(...)``."""

    @pytest.fixture(name="environment")
    def environment(tmp_path: Path, django_db_blocker: Any) -> Iterator[tuple[dict[str, str], str]]:
        with migrated_sqlite(tmp_path, django_db_blocker, partitions=partitions) as environment:
            yield environment

    @pytest.fixture(name="site")
    async def opened(tmp_path: Path, environment: tuple[dict[str, str], str]) -> AsyncIterator[SqlSite]:
        async with site.open(tmp_path, environment, ref, partitions=partitions) as opened:
            yield opened

    return environment, opened
