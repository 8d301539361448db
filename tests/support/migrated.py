"""``manage.py migrate`` for the processes a test starts, a fresh SQLite file made by copying.

A ``migrate`` subprocess costs about 1.2 CPU seconds, and the suite migrated a new SQLite file
for most tests that start workers or a console. What ``migrate`` writes to a new SQLite file
depends on nothing but the migrations and the database's vendor (no setting, no environment): so
the first fresh SQLite file of a process (each pytest-xdist worker) is migrated into a template,
and that one and every later one are copies of it (schema, triggers, the content types and
permissions rows, WAL mode, 0600 like ``create_private`` makes it). Anything else (PostgreSQL, a
file that exists already, other settings such as ``dashboard.production``) runs ``migrate``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import dj_database_url

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = "dashboard.settings"


def migrate(env: dict[str, str], *, timeout: float = 120) -> None:
    """``manage.py migrate`` the database ``env`` names (in effect: see the module's docstring)."""
    path = _new_sqlite_file(env)
    if path is None:
        _run_migrate(env, timeout)
        return
    template = _template(env, timeout)
    path.parent.mkdir(parents=True, exist_ok=True)  # as create_private would
    shutil.copy(template, path)  # its mode too (0600)


def _new_sqlite_file(env: dict[str, str]) -> Path | None:
    """The SQLite file ``env`` names if it does not exist yet and the development settings read it."""
    url = env.get("DATABASE_URL", "")
    if env.get("DJANGO_SETTINGS_MODULE", SETTINGS) != SETTINGS or not url.startswith("sqlite:"):
        return None
    name = str(dj_database_url.parse(url)["NAME"] or "")
    if not name or name == ":memory:" or name.startswith("file:"):
        return None
    path = Path(name)
    return None if path.exists() else path


def _run_migrate(env: dict[str, str], timeout: float) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=timeout
    )


@functools.cache
def _template_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="leaseboard-migrated-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _template(env: dict[str, str], timeout: float) -> Path:
    """This process's migrated SQLite file, made by the first call (with ``env``'s environment)."""
    path = _template_folder() / "migrated.sqlite3"
    if not path.exists():
        made = path.with_name("making.sqlite3")
        _run_migrate({**env, "DATABASE_URL": f"sqlite:///{made}"}, timeout)
        # Whatever a last connection left in the write-ahead log goes into the file (none is expected:
        # SQLite does so itself when the last connection closes), so the file alone is the database.
        with contextlib.closing(sqlite3.connect(made)) as connection:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        made.rename(path)  # only a complete template is ever copied
    return path
