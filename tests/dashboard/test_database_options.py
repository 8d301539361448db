"""A PostgreSQL database cut off by the network fails in seconds: TCP timeouts from LEASEBOARD_DB_TCP_TIMEOUT."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.processes import ROOT

SHOW = (
    "import django, json; django.setup(); from django.conf import settings; "
    "print(json.dumps(settings.DATABASES['default'].get('OPTIONS', {})))"
)


def options(**env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "DJANGO_SETTINGS_MODULE": "dashboard.settings", **env}
    command = [sys.executable, "-c", SHOW]
    return subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)


def test_postgresql_connections_give_up_on_a_silent_network_in_seconds() -> None:
    shown = options(DATABASE_URL="postgres://u@db.example:5432/x", LEASEBOARD_DB_TCP_TIMEOUT="6")
    assert json.loads(shown.stdout) == {
        "connect_timeout": 6,
        "keepalives": 1,
        "keepalives_idle": 3,
        "keepalives_interval": 2,
        "keepalives_count": 2,
        "tcp_user_timeout": 6000,
        "options": "-c idle_in_transaction_session_timeout=6000",
    }
    default = json.loads(options(DATABASE_URL="postgres://u@db.example:5432/x").stdout)
    assert default["tcp_user_timeout"] == 10_000


def test_a_wrong_tcp_timeout_is_refused_at_start() -> None:
    refused = options(DATABASE_URL="postgres://u@db.example:5432/x", LEASEBOARD_DB_TCP_TIMEOUT="0")
    assert refused.returncode != 0 and "LEASEBOARD_DB_TCP_TIMEOUT must be between 0 and 3600 seconds" in refused.stderr
    sqlite = json.loads(options(DATABASE_URL="sqlite:///tmp/x.sqlite3").stdout)
    assert "tcp_user_timeout" not in sqlite
