"""``dashboard.production``: ``check --deploy`` is clean, and a missing secret key stops it at once."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

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
