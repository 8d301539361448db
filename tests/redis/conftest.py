"""Fixtures for the Redis tests: a redis-server per test (they restart, flush and stop it), and a
migrated SQLite file for ``runworkers`` processes (their event log), made once per session."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import migrated
from tests.support.redis_server import RedisServer, start_redis


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file to copy: ``manage.py migrate`` once, not once per test (nor at all
    when this process has migrated one already: ``tests/support/migrated.py``)."""
    path = tmp_path_factory.mktemp("redis-template") / "db.sqlite3"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{path}"}
    env.pop("REDIS_URL", None)
    migrated.migrate(env)
    return path


@pytest.fixture
def sqlite_copy(migrated_sqlite: Path, tmp_path: Path) -> Path:
    path = tmp_path / "db.sqlite3"
    shutil.copy(migrated_sqlite, path)
    return path
