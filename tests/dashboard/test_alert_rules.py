"""The alert rules under ``promtool test rules`` (Debian's ``prometheus`` package; ``.ci/system-deps.sh``
installs it): ``LeaseboardStoreDown`` fires after a minute of ``leaseboard_store_up 0`` and not for a
shorter outage (``dashboard/deploy/alerts_test.yml``)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "dashboard" / "deploy"
TESTS = DEPLOY / "alerts_test.yml"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: run .ci/system-deps.sh (it installs Debian's prometheus package)")
    return found


def run_rule_tests(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), "test", "rules", TESTS.name], cwd=folder, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_store_down_alert_fires_after_a_minute_of_store_up_zero_and_not_before() -> None:
    result = run_rule_tests(DEPLOY)

    assert result.returncode == 0, f"promtool test rules failed:\n{result.stdout}\n{result.stderr}"
    assert "SUCCESS" in result.stdout


def test_the_rule_tests_catch_an_alert_that_waits_too_long(tmp_path: Path) -> None:
    """The same tests against a copy of the rules whose store alert waits 5 minutes: promtool fails."""
    rules = (DEPLOY / "alerts.yml").read_text()
    slower, found = re.subn(r"(alert: LeaseboardStoreDown\n\s+expr: [^\n]+\n\s+for: )1m", r"\g<1>5m", rules)
    assert found == 1, "LeaseboardStoreDown with `for: 1m` not found in alerts.yml"
    (tmp_path / "alerts.yml").write_text(slower)
    shutil.copy(TESTS, tmp_path / TESTS.name)

    result = run_rule_tests(tmp_path)

    assert result.returncode != 0, result.stdout
    assert "LeaseboardStoreDown" in result.stdout + result.stderr
