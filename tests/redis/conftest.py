"""Fixtures for the Redis tests: a redis-server per test (they restart, flush and stop it), and a
migrated SQLite file for ``runworkers`` processes (their event log), made once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.redis_server import RedisServer, start_redis

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file to copy: ``manage.py migrate`` once, not once per test."""
    path = tmp_path_factory.mktemp("redis-template") / "db.sqlite3"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{path}"}
    env.pop("REDIS_URL", None)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=120
    )
    return path


@pytest.fixture
def sqlite_copy(migrated_sqlite: Path, tmp_path: Path) -> Path:
    path = tmp_path / "db.sqlite3"
    shutil.copy(migrated_sqlite, path)
    return path
