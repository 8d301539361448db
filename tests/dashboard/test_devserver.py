"""``runserver`` is Daphne's (ASGI: websockets in development), yet a process that does not serve
HTTP (a worker, the hub, the pipeline) starts without importing Daphne or Twisted."""

from __future__ import annotations

import subprocess
import sys

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
