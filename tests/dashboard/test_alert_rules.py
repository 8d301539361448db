"""The alert rules under ``promtool`` (Debian's ``prometheus`` package; ``.ci/system-deps.sh`` installs it).

``dashboard/deploy/alerts_test.yml`` holds promtool unit tests of every rule of ``alerts.yml``: input
series, when the alert must fire (with its labels and annotations) and when it must stay quiet. The
tests here run them, check that they cover every rule both ways, and that they catch broken rules (a
rule that never fires, one that fires before its ``for:`` is up, a store alert that waits too long);
``promtool check rules`` and ``promtool check config`` pass on the shipped files.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "dashboard" / "deploy"
RULES = DEPLOY / "alerts.yml"
TESTS = DEPLOY / "alerts_test.yml"
FAILED_ALERT = re.compile(r"alertname: (\w+), time:")


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: run .ci/system-deps.sh (it installs Debian's prometheus package)")
    return found


def run_promtool(*args: str, cwd: Path = DEPLOY) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def run_rule_tests(folder: Path) -> subprocess.CompletedProcess[str]:
    return run_promtool("test", "rules", TESTS.name, cwd=folder)


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def rule_tests() -> list[dict[str, Any]]:
    """Every ``alert_rule_test`` entry of alerts_test.yml."""
    tests = yaml.safe_load(TESTS.read_text())["tests"]
    return [check for test in tests for check in test.get("alert_rule_test", [])]


def with_rules_edited(tmp_path: Path, edit: Any) -> Path:
    """A folder holding alerts_test.yml and a copy of alerts.yml whose every rule went through ``edit``."""
    document = yaml.safe_load(RULES.read_text())
    for group in document["groups"]:
        group["rules"] = [edit(dict(rule)) for rule in group["rules"]]
    (tmp_path / RULES.name).write_text(yaml.safe_dump(document, sort_keys=False))
    shutil.copy(TESTS, tmp_path / TESTS.name)
    return tmp_path


def failed_alerts(result: subprocess.CompletedProcess[str]) -> set[str]:
    return set(FAILED_ALERT.findall(result.stdout + result.stderr))


def test_every_alert_rule_passes_its_promtool_unit_tests() -> None:
    result = run_rule_tests(DEPLOY)

    assert result.returncode == 0, f"promtool test rules failed:\n{result.stdout}\n{result.stderr}"
    assert "SUCCESS" in result.stdout


def test_every_rule_has_a_test_where_it_fires_with_labels_and_annotations_and_one_where_it_stays_quiet() -> None:
    names = [rule["alert"] for rule in rules()]
    checks = rule_tests()

    assert len(names) == 20
    fires = {c["alertname"] for c in checks if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in checks if not c.get("exp_alerts")}
    assert sorted(set(names) - fires) == [], "rules without a test where they fire"
    assert sorted(set(names) - quiet) == [], "rules without a test where they stay quiet"
    assert sorted({c["alertname"] for c in checks} - set(names)) == [], "tests of rules that do not exist"
    by_name = {rule["alert"]: rule for rule in rules()}
    for check in checks:
        for expected in check.get("exp_alerts") or []:
            rule = by_name[check["alertname"]]
            assert set(rule["labels"].items()) <= set(expected["exp_labels"].items()), check
            assert set(expected["exp_annotations"]) == set(rule["annotations"]), check


def test_the_tests_catch_a_rule_that_never_fires(tmp_path: Path) -> None:
    """Every rule's expression replaced by one that is never true: promtool fails the test of each."""

    def never(rule: dict[str, Any]) -> dict[str, Any]:
        return {**rule, "expr": "vector(1) == 0"}

    result = run_rule_tests(with_rules_edited(tmp_path, never))

    assert result.returncode != 0, result.stdout
    assert failed_alerts(result) == {rule["alert"] for rule in rules()}


def test_the_tests_catch_a_rule_that_fires_before_its_for_is_up(tmp_path: Path) -> None:
    """Every ``for:`` removed: promtool fails the test of each rule that had one (it fires while it
    must still be pending)."""

    def at_once(rule: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in rule.items() if key != "for"}

    result = run_rule_tests(with_rules_edited(tmp_path, at_once))

    waiting = {rule["alert"] for rule in rules() if "for" in rule}
    assert len(waiting) >= 10
    assert result.returncode != 0, result.stdout
    assert failed_alerts(result) == waiting


def test_the_rule_tests_catch_an_alert_that_waits_too_long(tmp_path: Path) -> None:
    """The same tests against a copy of the rules whose store alert waits 5 minutes: promtool fails."""
    text = RULES.read_text()
    slower, found = re.subn(r"(alert: LeaseboardStoreDown\n\s+expr: [^\n]+\n\s+for: )1m", r"\g<1>5m", text)
    assert found == 1, "LeaseboardStoreDown with `for: 1m` not found in alerts.yml"
    (tmp_path / RULES.name).write_text(slower)
    shutil.copy(TESTS, tmp_path / TESTS.name)

    result = run_rule_tests(tmp_path)

    assert result.returncode != 0, result.stdout
    assert failed_alerts(result) == {"LeaseboardStoreDown"}


def test_promtool_checks_the_shipped_rules_and_configuration() -> None:
    checked_rules = run_promtool("check", "rules", RULES.name)
    assert checked_rules.returncode == 0, checked_rules.stdout + checked_rules.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked_rules.stdout

    # From another folder: the configuration finds alerts.yml beside itself, as in the container.
    checked_config = run_promtool("check", "config", str(DEPLOY / "prometheus.yml"), cwd=Path("/"))
    output = checked_config.stdout + checked_config.stderr
    assert checked_config.returncode == 0, output
    assert "SUCCESS: 1 rule files found" in output
    assert f"SUCCESS: {len(rules())} rules found" in output
