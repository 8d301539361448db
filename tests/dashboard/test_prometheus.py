"""A real Prometheus on a real fleet: the shipped configuration, alert rules and Grafana panels evaluated
against a dashboard (daphne) and two ``runworkers`` processes in multi-process mode on PostgreSQL.

The configuration is generated from ``dashboard/deploy/prometheus.yml`` (``tests.support.prometheus``):
its jobs keep their names, their targets become the test's ports, scrapes and evaluations run every
second, and the rules are a copy of ``alerts.yml`` with every ``for:`` cut to ``FOR``. Every expression
of every Grafana panel and every alert rule is asked of ``/api/v1/query``: none may fail, and each must
have data on a healthy fleet unless ``MAY_BE_EMPTY`` says why not. Then the ownership store is stopped
(the store-down alert must fire) and brought back, and a worker is killed with SIGKILL (the worker-down
alert must fire for it, and for no other worker).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.support.postgres import Postgres
from tests.support.processes import Processes, manage, migrate
from tests.support.prometheus import (
    DEPLOY,
    SHIPPED_RULES,
    Prometheus,
    configuration,
    shortened_rules,
    start_prometheus,
)
from tests.support.servers import free_port
from tests.support.waiting import until_sync
from workers.hub.embedded import EmbeddedHub

pytestmark = pytest.mark.slow
T = TypeVar("T")

HUB = "observed"
PARTITIONS = 4
WORKERS = ("alpha", "beta")
FOR = "2s"  # every rule's `for:` in the generated copy
FIRING = ("pending", "firing")

# Expressions (a panel's, or an alert's without its final comparison) that a healthy fleet may leave
# without a single series, and why. Any other expression with no data fails the test.
HEALTHY_PARTITIONS = "every partition is OK on a healthy fleet, and a status series exists only for the current status"
MAY_BE_EMPTY = {
    'leaseboard_partition_status{status!="OK"} == 1': HEALTHY_PARTITIONS,
    'leaseboard_partition_status{status="STOP"}': HEALTHY_PARTITIONS,
    'leaseboard_partition_status{status="STALL"}': HEALTHY_PARTITIONS,
    'leaseboard_partition_status{status="WARN"}': HEALTHY_PARTITIONS,
    'leaseboard_partition_status{status="REWIND"}': HEALTHY_PARTITIONS,
    "sum(increase(leaseboard_admin_actions_total[24h]))": (
        "no operator action was taken: the counter has a series per action and outcome from the first one"
    ),
    'sum by (operation) (rate(leaseboard_store_requests_total{outcome=~"unavailable|error"}[5m]))': (
        "no store call failed: a series per operation and outcome appears with its first call"
    ),
}
COMPARISON = re.compile(r"^(?P<operand>.+?)\s*(?:==|!=|>=|<=|>|<)\s*-?[0-9.]+$", re.DOTALL)


def panel_expressions() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "leaseboard.json").read_text())

    def walk(panels: list[dict[str, Any]]) -> Iterator[str]:
        for panel in panels:
            yield from (target["expr"] for target in panel.get("targets", []) if target.get("expr"))
            yield from walk(panel.get("panels", []))

    return list(walk(dashboard["panels"]))


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(SHIPPED_RULES.read_text())["groups"] for rule in group["rules"]]


def operand(expr: str) -> str:
    """An alert's expression without its final comparison with a number: the figure it watches."""
    found = COMPARISON.match(expr.strip())
    assert found, f"no final comparison with a number in {expr!r}"
    return found.group("operand").strip()


def base_env(root: Path, database_url: str) -> dict[str, str]:
    """The processes' environment: nothing of ours inherited from the test's shell, then the fleet's."""
    ours = ("DJANGO_", "LEASEBOARD_", "DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    env.update(
        DJANGO_SETTINGS_MODULE="dashboard.settings",
        DATABASE_URL=database_url,
        PYTHONUNBUFFERED="1",
        LEASEBOARD_VAR_DIR=str(root / "var"),
        LEASEBOARD_HUB_DIR=str(root / "hub"),
        LEASEBOARD_DEADLETTER_DIR=str(root / "deadletter"),
        LEASEBOARD_LANDING_DIR=str(root / "landing"),
        LEASEBOARD_STORE="sql",
        LEASEBOARD_SOURCE="embedded",
        LEASEBOARD_HUB=HUB,
        LEASEBOARD_PARTITIONS=str(PARTITIONS),
        LEASEBOARD_LOG_LEVEL="WARNING",
        LEASEBOARD_INTERVAL="0.5",
        LEASEBOARD_EXPIRY="3",
    )
    return env


@dataclass
class Fleet(Processes):
    """PostgreSQL, a producer, a dashboard (daphne) and two workers, each worker in multi-process mode
    with a metrics directory and port of its own (as two containers would be)."""

    postgres: Postgres
    env: dict[str, str]
    dashboard_port: int
    worker_ports: dict[str, int]

    def start(self) -> None:
        self.spawn("producer", manage("produce", "--hub", HUB, "--rate", "200"), self.env)
        until_sync(
            lambda: EmbeddedHub.exists(self.env["LEASEBOARD_HUB_DIR"], HUB),
            "the producer to create the hub",
            30,
            step=0.05,
            check=self.check_exits,
            detail=self.logs,
        )
        daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.dashboard_port)]
        self.spawn("dashboard", [*daphne, "dashboard.asgi:application"], self.env)
        for name, port in self.worker_ports.items():
            metrics = self.root / f"metrics-{name}"
            metrics.mkdir()
            command = manage(
                "runworkers",
                "--count",
                "1",
                "--owner-prefix",
                name,
                "--hub",
                HUB,
                "--interval",
                "0.5",
                "--expiry",
                "3",
                "--checkpoint-seconds",
                "0.5",
                "--shutdown-timeout",
                "2",
                "--metrics-port",
                str(port),
            )
            self.spawn(name, command, {**self.env, "PROMETHEUS_MULTIPROC_DIR": str(metrics)})

    def targets(self) -> dict[str, list[str]]:
        return {
            "leaseboard-dashboard": [f"127.0.0.1:{self.dashboard_port}"],
            "leaseboard-workers": [f"127.0.0.1:{port}" for port in self.worker_ports.values()],
        }

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{self.log(name)[-2000:]}" for name in self.processes)

    def kill_worker(self, name: str) -> None:
        process = self.processes[name]
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def wait(self, condition: Callable[[], T], timeout: float, what: str, detail: Callable[[], str] | None = None) -> T:
        """``until_sync`` every 0.25 s, failing at once if a process exits unexpectedly, with the logs."""

        def details() -> str:
            return (detail() + "\n" if detail else "") + self.logs()

        return until_sync(condition, what, timeout, step=0.25, check=self.check_exits, detail=details)


@pytest.fixture
def fleet(tmp_path: Path, postgres: Postgres) -> Iterator[Fleet]:
    postgres.create_database("leaseboard")
    env = base_env(tmp_path, postgres.database_url("leaseboard"))
    migrate(env)
    ports = {name: free_port() for name in WORKERS}
    running = Fleet(tmp_path, postgres=postgres, env=env, dashboard_port=free_port(), worker_ports=ports)
    try:
        running.start()
        yield running
    finally:
        running.kill_all()


@pytest.fixture
def prometheus(fleet: Fleet, tmp_path: Path) -> Iterator[Prometheus]:
    rules = tmp_path / "alerts.yml"
    shortened = shortened_rules(SHIPPED_RULES, rules, FOR)
    assert len(shortened) == len(alert_rules()) and all(r.get("for") in (None, FOR) for r in shortened)
    server = start_prometheus(configuration(fleet.targets(), rules))
    try:
        yield server
    finally:
        server.stop()


def alerts_named(prometheus: Prometheus, name: str, states: tuple[str, ...] = FIRING) -> list[dict[str, Any]]:
    return [a for a in prometheus.alerts() if a["labels"]["alertname"] == name and a["state"] in states]


def test_prometheus_evaluates_every_panel_and_rule_on_a_fleet_and_fires_the_store_and_worker_alerts(
    fleet: Fleet, prometheus: Prometheus
) -> None:
    # Every target of the generated configuration answers: the dashboard and both workers.
    def all_up() -> list[dict[str, Any]]:
        targets = prometheus.targets()
        return targets if len(targets) == 3 and all(t["health"] == "up" for t in targets) else []

    targets = fleet.wait(all_up, 60, "Prometheus to scrape the dashboard and both workers")
    assert {t["labels"]["job"] for t in targets} == {"leaseboard-dashboard", "leaseboard-workers"}

    # Every panel's and every alert's expression evaluates; each has data unless it may be empty.
    rules = alert_rules()
    queried = [*panel_expressions(), *(rule["expr"] for rule in rules)]  # none may fail, data or not
    must_have = set(panel_expressions()) | {operand(rule["expr"]) for rule in rules}
    assert len(panel_expressions()) >= 30 and len(rules) == 20
    assert set(MAY_BE_EMPTY) <= must_have, "an allow-listed expression is no longer used"
    must_have -= set(MAY_BE_EMPTY)

    missing: list[str] = []

    def every_expression_has_data() -> bool:
        for expr in queried:
            prometheus.query(expr)  # raises QueryError on an error
        missing[:] = sorted(expr for expr in must_have if not prometheus.query(expr))
        return not missing

    fleet.wait(every_expression_has_data, 60, "every expression to have data", lambda: f"without data: {missing}")
    for expr in MAY_BE_EMPTY:
        prometheus.query(expr)

    # Every rule was evaluated without an error, and the healthy fleet settles with no alert active.
    def evaluated() -> list[dict[str, Any]]:
        loaded = prometheus.rules()
        return loaded if all(r.get("health") != "unknown" for r in loaded) else []

    loaded = fleet.wait(evaluated, 10, "every rule to be evaluated")
    assert sorted(r["name"] for r in loaded) == sorted(r["alert"] for r in rules)
    assert [(r["name"], r.get("lastError")) for r in loaded if r["health"] != "ok"] == []
    fleet.wait(lambda: prometheus.alerts() == [], 30, "the healthy fleet to have no alert pending or firing")

    # The ownership store goes away: the dashboard says leaseboard_store_up 0 and the alert fires.
    fleet.postgres.kill()
    down = fleet.wait(
        lambda: alerts_named(prometheus, "LeaseboardStoreDown", ("firing",)), 30, "LeaseboardStoreDown to fire"
    )
    assert down[0]["labels"]["severity"] == "critical"
    assert down[0]["labels"]["job"] == "leaseboard-dashboard"
    assert down[0]["annotations"]["summary"] == "The dashboard cannot read the ownership store"

    fleet.postgres.start()
    fleet.wait(lambda: prometheus.query("leaseboard_store_up == 1"), 30, "the dashboard to read the store again")
    fleet.wait(lambda: not alerts_named(prometheus, "LeaseboardStoreDown"), 15, "LeaseboardStoreDown to resolve")

    # A worker is killed: no more heartbeats, so the dashboard reports it down and the alert fires for it.
    fleet.kill_worker("beta")
    worker_down = fleet.wait(
        lambda: alerts_named(prometheus, "LeaseboardWorkerDown", ("firing",)), 30, "LeaseboardWorkerDown to fire"
    )
    assert [a["labels"]["worker"] for a in worker_down] == ["beta-0"]
    assert worker_down[0]["annotations"]["summary"] == "Worker beta-0 stopped sending heartbeats"
    scrape_down = fleet.wait(
        lambda: alerts_named(prometheus, "LeaseboardScrapeDown"), 15, "LeaseboardScrapeDown for the killed worker"
    )
    assert [a["labels"]["instance"] for a in scrape_down] == [f"127.0.0.1:{fleet.worker_ports['beta']}"]
