"""A real dashboard process for the outage and sampling tests: Daphne serving ``dashboard.asgi`` (or
``manage.py serve``) on a free port, its log in a file, and plain HTTP requests that never raise on
an error status."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import migrated
from tests.support.servers import free_port, listens
from tests.support.waiting import until_sync

ROOT = Path(__file__).resolve().parents[2]
APPLICATION = "dashboard.asgi:application"


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def __repr__(self) -> str:
        return f"<{self.status} {self.content_type}: {self.text[:300]!r}>"


def environment(var: Path, **extra: str) -> dict[str, str]:
    """This environment without our settings, then a dashboard on ``var`` (SQLite, SQL store,
    embedded hub of 4 partitions) and ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "LEASEBOARD_", "DATABASE_URL", "REDIS_URL", "AZURE_"))
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "dashboard.settings",
            "LEASEBOARD_VAR_DIR": str(var),
            "DATABASE_URL": f"sqlite:///{var / 'db.sqlite3'}",
            "LEASEBOARD_STORE": "sql",
            "LEASEBOARD_SOURCE": "embedded",
            "LEASEBOARD_PARTITIONS": "4",
            "LEASEBOARD_EXPIRY": "30",
            "LEASEBOARD_LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
            **extra,
        }
    )
    return env


def migrate(env: dict[str, str]) -> None:
    """``manage.py migrate`` (a new SQLite file: a copy, ``tests/support/migrated.py``)."""
    migrated.migrate(env, timeout=180)


class Console:
    """One dashboard process; ``log`` holds its standard output and error."""

    def __init__(self, var: Path, env: dict[str, str]) -> None:
        self.var = var
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = var / "console.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start_daphne(self, attempts: int = 3) -> None:
        """Daphne on a free port, returning once it (not another process that took the port first) answers."""
        for _ in range(attempts):
            self._spawn([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), APPLICATION])
            try:
                until_sync(self.ours, f"daphne to answer at {self.url}", 30, step=0.1, check=self.alive)
                return
            except AssertionError:
                if "Address already in use" not in self.output():
                    raise
                self.port = free_port()
                self.url = f"http://127.0.0.1:{self.port}"
        raise AssertionError(f"daphne found no free port in {attempts} attempts")

    def ours(self) -> bool:
        assert self.process is not None
        return listens(self.process.pid, self.port) and self.answers()

    def start_serve(self, *options: str) -> None:
        """``manage.py serve`` on the port; returns once it says it serves (no request is made)."""
        self._spawn([sys.executable, "manage.py", "serve", "--port", str(self.port), *options])
        until_sync(lambda: "Leaseboard is serving" in self.output(), "serve to start", 60, step=0.1, check=self.alive)

    def _spawn(self, command: list[str]) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def alive(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the dashboard exited with {self.process.returncode}:\n{self.output()[-4000:]}")

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/static/dashboard/favicon.svg", timeout=2):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def output(self, since: int = 0) -> str:
        try:
            with self.log.open("rb") as f:
                f.seek(since)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def get(self, path: str, headers: dict[str, str] | None = None, timeout: float = 30.0) -> Answer:
        """GET ``path``: its status, body and content type, whatever the status."""
        return self.request("GET", path, None, headers, timeout)

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None, timeout: float = 30.0) -> Answer:
        """POST ``body`` to ``path``: the answer's status, body and content type, whatever the status."""
        return self.request("POST", path, body, headers, timeout)

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str] | None, timeout: float
    ) -> Answer:
        request = urllib.request.Request(f"{self.url}{path}", body, headers or {}, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return Answer(response.status, response.read(), response.headers.get("Content-Type", ""))
        except urllib.error.HTTPError as error:
            return Answer(error.code, error.read(), error.headers.get("Content-Type", ""))

    def metric(self, name: str) -> float | None:
        """The value of the unlabelled series ``name`` at a scrape of /metrics (None if absent)."""
        answer = self.get("/metrics")
        assert answer.status == 200, answer
        for line in answer.text.splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
        return None


def lag_samples(database: Path) -> list[tuple[str, str]]:
    """(partition, status) of every LagSample row in the SQLite file, read without the dashboard."""
    with sqlite3.connect(database, timeout=20) as db:
        return [(str(p), str(s)) for p, s in db.execute("SELECT partition_id, status FROM dashboard_lagsample")]
