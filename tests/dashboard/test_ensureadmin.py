"""``manage.py ensureadmin``: the demo's superuser, with a password shown once and kept private."""

from __future__ import annotations

import io
import stat
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def ensureadmin(*args: str) -> str:
    out = io.StringIO()
    call_command("ensureadmin", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def var_dir(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    settings.VAR_DIR = tmp_path
    monkeypatch.delenv("LEASEBOARD_ADMIN_PASSWORD", raising=False)
    return tmp_path


def test_a_generated_password_is_saved_0600_and_printed_only_once(var_dir: Path) -> None:
    first = ensureadmin()
    saved = var_dir / "admin-password"
    password = saved.read_text().strip()

    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert password in first and len(password) >= 16
    user = get_user_model().objects.get(username="admin")
    assert user.is_staff and user.is_superuser and user.check_password(password)

    second = ensureadmin()
    assert password not in second and str(saved) in second
    assert get_user_model().objects.get(username="admin").check_password(password)


def test_the_password_from_the_environment_resets_the_user_and_is_not_printed(
    var_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensureadmin()
    monkeypatch.setenv("LEASEBOARD_ADMIN_PASSWORD", "correct-horse-battery-staple")

    output = ensureadmin()

    assert "correct-horse-battery-staple" not in output
    assert get_user_model().objects.get(username="admin").check_password("correct-horse-battery-staple")


def test_new_password_replaces_the_saved_one(var_dir: Path) -> None:
    ensureadmin()
    old = (var_dir / "admin-password").read_text().strip()

    ensureadmin("--new-password")

    new = (var_dir / "admin-password").read_text().strip()
    assert new != old
    assert get_user_model().objects.get(username="admin").check_password(new)
