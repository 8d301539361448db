"""``runserver`` is Daphne's (ASGI: websockets in development), yet a process that does not serve
HTTP (a worker, the hub, the pipeline) starts without importing Daphne or Twisted, nor the console's
own code: refused logins are counted (``control/logins.py``) from receivers whose code is imported
at the first refusal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.processes import ROOT

PROBE = """
import django, sys
django.setup()
started = sorted(m for m in sys.modules if m.split(".")[0] in ("daphne", "twisted", "autobahn"))
from django.core.management import get_commands, load_command_class
from daphne.management.commands.runserver import Command as Daphne
app = get_commands()["runserver"]
print(started, app, issubclass(type(load_command_class(app, "runserver")), Daphne))
"""


def test_runserver_is_daphnes_and_nothing_imports_daphne_or_twisted_before_it_runs() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"DJANGO_SETTINGS_MODULE": "dashboard.settings", "PATH": "/usr/bin:/bin"},
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["[]", "dashboard.devserver", "True"]


WORKER_PROBE = """
import django, sys
django.setup()
from django.core.management import load_command_class
load_command_class("workers", "runworkers")
from django.contrib.auth.signals import user_login_failed
console = sorted(m for m in sys.modules if m.startswith(("dashboard.control", "dashboard.live", "dashboard.web")))
print(console, any(r[0][0] == "leaseboard.wrong_password" for r in user_login_failed.receivers))
"""


def test_a_worker_starts_without_the_console_s_code_yet_refused_logins_have_their_receiver(tmp_path: Path) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", WORKER_PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "DJANGO_SETTINGS_MODULE": "dashboard.settings",
            "LEASEBOARD_VAR_DIR": str(tmp_path),
            "PATH": "/usr/bin:/bin",
        },
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["[]", "True"]


CONSOLE_PROBE = """
import django, sys
django.setup()
from dashboard.asgi import application
import dashboard.web.pipeline, dashboard.web.pipeline_tail
print(sorted(m for m in sys.modules if m.split(".")[0] in ("pyarrow", "numpy", "pyspark")))
"""


def test_the_console_starts_without_pyarrow_numpy_or_spark(tmp_path: Path) -> None:
    """The pipeline page reads the landing's markers (``workers.landing_files``), not its Parquet: a
    console process that imported pyarrow for them took 0.3 CPU seconds more to start and 150 MB
    instead of 87 (measured with Daphne on SQLite)."""
    probe = subprocess.run(
        [sys.executable, "-c", CONSOLE_PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "DJANGO_SETTINGS_MODULE": "dashboard.settings",
            "LEASEBOARD_VAR_DIR": str(tmp_path),
            "PATH": "/usr/bin:/bin",
        },
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["[]"]
