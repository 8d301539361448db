"""``dashboard.production``: ``check --deploy`` is clean, a missing or weak secret key stops it at once,
and the SQLite file holding the sessions is its owner's only."""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dashboard.env import weak_secret

ROOT = Path(__file__).resolve().parents[2]


def manage(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "LEASEBOARD_"))}
    environ.update(DJANGO_SETTINGS_MODULE="dashboard.production", LEASEBOARD_VAR_DIR=str(tmp_path), **env)
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60
    )


def test_check_deploy_finds_no_issues_with_production_settings(tmp_path: Path) -> None:
    result = manage(tmp_path, "check", "--deploy", "--fail-level", "DEBUG", DJANGO_SECRET_KEY=secrets.token_urlsafe(50))

    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_production_refuses_to_start_without_a_secret_key(tmp_path: Path) -> None:
    result = manage(tmp_path, "check")

    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY" in result.stderr


def test_production_refuses_a_short_secret_key(tmp_path: Path) -> None:
    result = manage(tmp_path, "check", DJANGO_SECRET_KEY="too-short")

    assert result.returncode != 0
    assert "at least 50 random characters" in result.stderr


WEAK = {
    "a run": "a" * 60,
    "a pattern typed again": "abcdefghijklmnop" * 4,
    "a keyboard walk twice": "qwertyuiopasdfghjklzxcvbnm" * 2,
    "a phrase twice": "correct horse battery staple correct horse battery staple",
    "a development key": "dev-only-" + secrets.token_urlsafe(50),
}


@pytest.mark.parametrize("case", WEAK)
def test_a_weak_secret_key_is_refused_saying_why(case: str) -> None:
    assert weak_secret(WEAK[case]) is not None, case


def test_random_keys_of_every_usual_form_are_taken() -> None:
    for _ in range(500):
        for key in (secrets.token_urlsafe(50), secrets.token_hex(32), secrets.token_urlsafe(38)):
            assert weak_secret(key) is None, key


def test_production_names_what_is_weak_about_the_key(tmp_path: Path) -> None:
    result = manage(tmp_path, "check", DJANGO_SECRET_KEY="0123456789abcdef" * 4)

    assert result.returncode != 0
    assert "it repeats itself" in result.stderr and "0123456789abcdef" not in result.stderr


def test_the_sqlite_database_holding_the_sessions_is_created_for_its_owner_only(tmp_path: Path) -> None:
    database = tmp_path / "private" / "leaseboard.sqlite3"

    result = manage(
        tmp_path,
        "migrate",
        "--noinput",
        "-v",
        "0",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DATABASE_URL=f"sqlite:///{database}",
    )

    assert result.returncode == 0, result.stderr
    assert database.exists()
    for path in tmp_path.glob("private/leaseboard.sqlite3*"):  # -wal and -shm take the database's mode
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, (path.name, oct(path.stat().st_mode))
