"""A real Prometheus (Debian's ``prometheus`` package) as a test server, on the shipped configuration.

``configuration()`` turns ``dashboard/deploy/prometheus.yml`` into one for a test: every job of the
shipped file kept by name with its targets replaced by the test's (a job the test names no targets
for is an error, so a job added to the shipped file is not silently left out), short scrape and
evaluation intervals, and a copy of the alert rules (``rules()``: every ``for:`` shortened) in place
of the shipped rule files. ``start_prometheus()`` runs it on a free loopback port with its own
storage directory; ``query()``, ``alerts()`` and ``rules()`` read its HTTP API.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.support import reaper
from tests.support.servers import ServerError, ServerProcess, start_on_a_free_port

DEPLOY = Path(__file__).resolve().parents[2] / "dashboard" / "deploy"
SHIPPED_CONFIG = DEPLOY / "prometheus.yml"
SHIPPED_RULES = DEPLOY / "alerts.yml"


def prometheus_binary() -> str:
    """``$LEASEBOARD_PROMETHEUS`` or ``prometheus`` on ``$PATH``; ServerError saying how to install it."""
    found = os.environ.get("LEASEBOARD_PROMETHEUS") or shutil.which("prometheus")
    if not found:
        raise ServerError("prometheus not found: apt-get install prometheus (or run .ci/system-deps.sh)")
    return found


def shortened_rules(source: Path, destination: Path, wait: str) -> list[dict[str, Any]]:
    """Write ``source``'s rule groups to ``destination`` with every ``for:`` set to ``wait``; returns the rules."""
    document = yaml.safe_load(source.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = wait
    destination.write_text(yaml.safe_dump(document, sort_keys=False))
    return [rule for group in document["groups"] for rule in group["rules"]]


def configuration(
    targets: Mapping[str, Sequence[str]], rule_file: Path, *, interval: str = "1s", source: Path = SHIPPED_CONFIG
) -> dict[str, Any]:
    """The shipped configuration with each job's targets replaced by ``targets[job]`` (static), the
    global intervals set to ``interval`` and ``rule_file`` as the only rule file."""
    config: dict[str, Any] = yaml.safe_load(source.read_text())
    jobs = [job["job_name"] for job in config["scrape_configs"]]
    if sorted(jobs) != sorted(targets):
        raise ValueError(
            f"the shipped configuration's jobs are {sorted(jobs)}, the test has targets for {sorted(targets)}"
        )
    config["global"] = {**config.get("global", {}), "scrape_interval": interval, "evaluation_interval": interval}
    config["rule_files"] = [str(rule_file)]
    for job in config["scrape_configs"]:
        for key in [k for k in job if k.endswith("_sd_configs") or k == "static_configs"]:
            del job[key]
        job["static_configs"] = [{"targets": list(targets[job["job_name"]])}]
        job["scrape_interval"] = job["scrape_timeout"] = interval
    return config


class QueryError(AssertionError):
    """Prometheus answered a query with an error."""


class Prometheus(ServerProcess):
    """``prometheus`` on ``config``, its TSDB under ``home/data``."""

    name = "prometheus"
    in_use = "address already in use"

    def __init__(self, port: int, home: Path, config: Path) -> None:
        super().__init__(port, home)
        self.config = config

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            prometheus_binary(),
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.home / 'data'}",
            f"--web.listen-address={self.host}:{self.port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ]

    def ready(self) -> bool:
        if not super().ready():
            return False
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return int(response.status) == 200
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of ``GET /api/v1/<path>?params``; QueryError when Prometheus answers an error."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as error:  # 400 (bad query), 422 (cannot execute), 503 (timeout)
            text = error.read().decode(errors="replace")
            try:
                answer = json.loads(text)
            except ValueError:
                raise QueryError(f"{path} {params}: HTTP {error.code}: {text[:300]}") from None
            raise QueryError(f"{path} {params}: {answer.get('errorType')}: {answer.get('error')}") from None
        if body.get("status") != "success":
            raise QueryError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one result) ``expr`` evaluates to now."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """The pending and firing alerts (``labels``, ``annotations``, ``state``, ``value``)."""
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule with its ``health`` and ``lastError`` (from its last evaluation)."""
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets (``labels``, ``health``: up, down or unknown, ``lastError``)."""
        active: list[dict[str, Any]] = self.api("targets", state="active")["activeTargets"]
        return active


def start_prometheus(config: dict[str, Any], attempts: int = 3) -> Prometheus:
    """Prometheus running ``config`` (written to a new temporary folder, with its storage) on a free
    loopback port. ``stop()`` ends it and deletes the folder."""
    home = Path(tempfile.mkdtemp(prefix="leaseboard-prometheus-"))
    reaper.remove_on_exit(home)  # if this process is killed before it stops the server
    path = home / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    try:
        return start_on_a_free_port(lambda port: Prometheus(port, home, path), attempts)
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        raise
