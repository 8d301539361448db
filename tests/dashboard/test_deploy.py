"""Prometheus and Grafana as deployed: every metric the alert rules and the Grafana dashboard use exists
in what the dashboard's /metrics and a real ``runworkers --metrics-port`` expose; several runworkers
processes are summed in multi-process mode; docker-compose provisions the files."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import LazySettings
from django.test import AsyncClient
from prometheus_client.parser import text_string_to_metric_families

from balancer.model import HubRef, Member
from dashboard.models import EventLog, LagSample
from tests.support.servers import free_port
from tests.support.waiting import until, until_sync
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "dashboard" / "deploy"
METRIC = re.compile(r"\bleaseboard_[a-z0-9_]+\b")
NOT_OURS = {"up"}  # Prometheus's own series of each scrape


def alert_expressions() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def grafana_dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DEPLOY / "grafana" / "dashboards" / "leaseboard.json").read_text())
    return loaded


def dashboard_expressions() -> list[str]:
    return [t["expr"] for p in grafana_dashboard()["panels"] for t in p.get("targets", [])]


def names(text: str) -> set[str]:
    """Every family and sample name in Prometheus exposition ``text``."""
    found: set[str] = set()
    for family in text_string_to_metric_families(text):
        found.add(family.name)
        found.update(sample.name for sample in family.samples)
    return found


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
    return body.decode()


def environment(settings: LazySettings, ref: HubRef, metrics_dir: Path) -> dict[str, str]:
    ours = ("DJANGO_", "LEASEBOARD_", "DATABASE_URL", "REDIS_URL")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    environ.update(
        DJANGO_SETTINGS_MODULE="dashboard.settings",
        DATABASE_URL=f"sqlite:///{settings.DATABASES['default']['NAME']}",
        LEASEBOARD_STORE="sql",
        LEASEBOARD_SOURCE="embedded",
        LEASEBOARD_HUB_DIR=str(settings.LEASEBOARD_HUB_DIR),
        LEASEBOARD_NAMESPACE=ref.namespace,
        LEASEBOARD_HUB=ref.hub,
        LEASEBOARD_CONSUMER_GROUP=ref.consumer_group,
        LEASEBOARD_LOG_LEVEL="WARNING",
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
    )
    return environ


class Workers:
    """``runworkers`` processes sharing one multi-process metrics directory; the first serves them."""

    def __init__(self, environ: dict[str, str], processes: int, port: int) -> None:
        self.port = port
        self.processes: list[subprocess.Popen[bytes]] = []
        for i in range(processes):
            extra = ["--metrics-port", str(port)] if i == 0 else []
            self.processes.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "manage.py",
                        "runworkers",
                        "--count",
                        "1",
                        "--interval",
                        "0.3",
                        "--expiry",
                        "5",
                        "--owner-prefix",
                        f"metrics{i}",
                        *extra,
                    ],
                    cwd=ROOT,
                    env=environ,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
            )

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        out = {}
        for family in text_string_to_metric_families(scrape(f"http://127.0.0.1:{self.port}/metrics")):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


@pytest.fixture
def workers(settings: LazySettings, stores: Stores, hub: EmbeddedHub, ref: HubRef, tmp_path: Path) -> Iterator[Workers]:
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    running = Workers(environment(settings, ref, metrics_dir), processes=2, port=free_port())
    try:
        yield running
    finally:
        running.stop()


async def test_every_metric_of_the_alerts_and_the_grafana_dashboard_is_exposed(
    async_client: AsyncClient, workers: Workers, stores: Stores, ref: HubRef
) -> None:
    await stores.controls.heartbeat(Member(ref, "w-dashboard", 0.0))
    statuses = [
        LagSample(**LagSample.scope(ref), partition_id=p, at=time.time(), lag=0, lag_seconds=0.0, status="OK")
        for p in "0123"
    ]
    from channels.db import database_sync_to_async

    await database_sync_to_async(LagSample.objects.bulk_create)(statuses)

    async def dashboard_names() -> set[str]:
        response = await async_client.get("/metrics")
        assert response.status_code == 200
        return names(response.content.decode())

    async def with_state() -> set[str]:  # once the monitor has a state
        exposed = await dashboard_names()
        return exposed if "leaseboard_worker_checkpointed_events_per_second" in exposed else set()

    exposed = await until(with_state, "the dashboard's monitor to serve its state to /metrics", 20)
    used = {name for expr in alert_expressions() + dashboard_expressions() for name in METRIC.findall(expr)}
    assert len(used) >= 20

    # A labelled series appears with its first sample (a store request's histogram, say): wait for
    # the worker's first cycles rather than taking its first answer.
    def worker_names() -> set[str]:
        found = names(scrape(f"http://127.0.0.1:{workers.port}/metrics"))
        return found if used <= exposed | found else set()

    with contextlib.suppress(AssertionError):
        exposed |= until_sync(worker_names, "runworkers metrics", 30, step=0.1, ignoring=(OSError,))
    exposed |= names(scrape(f"http://127.0.0.1:{workers.port}/metrics"))
    assert sorted(used - exposed) == []


def test_alert_rules_are_well_formed_and_cover_every_lag_status() -> None:
    rules = [rule for group in yaml.safe_load((DEPLOY / "alerts.yml").read_text())["groups"] for rule in group["rules"]]

    for rule in rules:
        assert set(rule) >= {"alert", "expr", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["annotations"]["summary"]
    assert len({r["alert"] for r in rules}) == len(rules)
    for status in ("WARN", "STALL", "STOP", "REWIND"):
        assert any(f'status="{status}"' in r["expr"] for r in rules), status
    selectors = {name for r in rules for name in re.findall(r"\b([a-z_]+)\{", r["expr"])}
    others = {name for name in selectors if not name.startswith("leaseboard_")}
    assert others <= NOT_OURS


def test_grafana_uses_the_provisioned_datasource_and_compose_mounts_everything() -> None:
    dashboard = grafana_dashboard()
    provisioning = DEPLOY / "grafana" / "provisioning"
    datasource = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())["datasources"][0]
    provider = yaml.safe_load((provisioning / "dashboards/leaseboard.yml").read_text())["providers"][0]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())

    uids = {p["datasource"]["uid"] for p in dashboard["panels"] if "datasource" in p}
    assert uids == {datasource["uid"]} and datasource["url"] == "http://prometheus:9090"
    mounts = dict(m.split(":")[:2] for m in compose["grafana"]["volumes"])
    assert mounts["./dashboard/deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts["./dashboard/deploy/grafana/dashboards"] == provider["options"]["path"]
    for source in mounts:
        assert (ROOT / source).exists(), source
    prometheus_mounts = dict(m.split(":")[:2] for m in compose["prometheus"]["volumes"])
    # Rule files are named relative to the configuration, as Prometheus resolves them (promtool too).
    rules = {f"/etc/prometheus/{name}" for name in prometheus["rule_files"]}
    assert set(prometheus_mounts.values()) >= {"/etc/prometheus/prometheus.yml", *rules}
    worker_port = next(c for c in prometheus["scrape_configs"] if c["job_name"] == "leaseboard-workers")
    command = compose["workers"]["command"]
    assert command[command.index("--metrics-port") + 1] == str(worker_port["dns_sd_configs"][0]["port"])
    assert "PROMETHEUS_MULTIPROC_DIR" in compose["workers"]["environment"]


def test_several_runworkers_processes_are_summed_in_multi_process_mode(workers: Workers) -> None:
    def claims_by_both() -> dict[str, int] | None:
        rows = EventLog.objects.filter(kind="claim").values_list("reporter", flat=True)
        by = {r: list(rows).count(r) for r in set(rows)}
        return by if set(by) == {"metrics0-0", "metrics1-0"} else None

    def scraped_claims() -> float:
        return workers.samples().get(("leaseboard_ownership_changes_total", (("kind", "claim"),)), 0.0)

    # The port is served by the first process only: its figure equals every claim either process made
    # (as their event log rows say) only if the second process's counters are added in.
    until_sync(claims_by_both, "claims by both processes", 40, step=0.1, ignoring=(OSError,))
    until_sync(
        lambda: scraped_claims() == EventLog.objects.filter(kind="claim").count(),
        "every claim on the port",
        10,
        step=0.1,
        ignoring=(OSError,),
    )
    samples = workers.samples()
    assert samples[("leaseboard_store_requests_total", (("operation", "claim_ownership"), ("outcome", "ok")))] > 0
    assert samples[("leaseboard_cycle_duration_seconds_count", ())] >= 2
    for process in workers.processes:
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
