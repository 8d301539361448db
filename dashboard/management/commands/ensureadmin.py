"""``manage.py ensureadmin``: the demo's staff superuser, created or reset, with a known password.

The password comes from ``LEASEBOARD_ADMIN_PASSWORD``; otherwise the one saved in
``var/admin-password`` by an earlier run; otherwise a new random one, saved there (mode 0600) and
printed this once. The password is never logged; later runs print only where it is.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


def _write_secret(path: Path, secret: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its old mode through O_CREAT
        os.write(fd, (secret + "\n").encode())
    finally:
        os.close(fd)


class Command(BaseCommand):
    help = (
        "Create (or reset) the demo's staff superuser; password from LEASEBOARD_ADMIN_PASSWORD or var/admin-password."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--new-password", action="store_true", help="generate a new password even if one is saved")

    def handle(self, *args: Any, username: str, new_password: bool, **options: Any) -> None:
        saved = Path(settings.VAR_DIR) / "admin-password"
        from_env = os.environ.get("LEASEBOARD_ADMIN_PASSWORD", "")
        generated = False
        if from_env:
            password = from_env
        elif saved.exists() and not new_password and saved.read_text().strip():
            password = saved.read_text().strip()
        else:
            password = secrets.token_urlsafe(16)
            _write_secret(saved, password)
            generated = True

        user_model: Any = get_user_model()
        user, created = user_model._default_manager.get_or_create(**{user_model.USERNAME_FIELD: username})
        user.is_staff = True
        user.is_superuser = True
        user.is_active = True
        user.set_password(password)
        user.save()

        verb = "created" if created else "reset"
        if generated:
            self.stdout.write(f"admin login {verb}: {username} / {password}  (saved to {saved}, mode 0600)")
        elif from_env:
            self.stdout.write(f"admin login {verb}: {username}, password from LEASEBOARD_ADMIN_PASSWORD")
        else:
            self.stdout.write(f"admin login {verb}: {username}, password in {saved}")
