"""LEASEBOARD_LOG_LEVELS: single loggers told more (or less) than the root's level, a wrong pair refused."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from dashboard.env import envlevels


def test_pairs_become_loggers_of_the_logging_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASEBOARD_LOG_LEVELS", " workers.runtime.cycles=debug , azure=INFO,")
    assert envlevels("LEASEBOARD_LOG_LEVELS") == {
        "workers.runtime.cycles": {"level": "DEBUG"},
        "azure": {"level": "INFO"},
    }
    monkeypatch.delenv("LEASEBOARD_LOG_LEVELS")
    assert envlevels("LEASEBOARD_LOG_LEVELS") == {}


@pytest.mark.parametrize("wrong", ["workers.runtime.cycles", "=DEBUG", "azure=LOUD"])
def test_a_wrong_pair_is_refused_saying_what_is_expected(monkeypatch: pytest.MonkeyPatch, wrong: str) -> None:
    monkeypatch.setenv("LEASEBOARD_LOG_LEVELS", f"django=INFO,{wrong}")
    with pytest.raises(ImproperlyConfigured, match=r"LEASEBOARD_LOG_LEVELS must be logger=LEVEL pairs.*got '"):
        envlevels("LEASEBOARD_LOG_LEVELS")
