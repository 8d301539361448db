"""With ``LIVETEST_EARLY=1``, Microsoft's suite starts as soon as the session has collected, on a
thread, when its test is among the collected: its five minutes (mostly Microsoft's own sleeps)
then overlap the tests that run before it, and its test only collects the outcome. ``make test``
turns it on; a bare ``pytest`` does not, since the overlap adds its load (about two minutes of CPU)
to whatever runs beside it."""

from __future__ import annotations

import os

import pytest

from tests.livetest import suite
from tests.livetest.test_microsoft_suite import (
    WORKERS,
    sdist_cache,
    test_microsofts_livetest_suite_passes_against_runhub,
)

TEST = test_microsofts_livetest_suite_passes_against_runhub.__name__


def pytest_collection_finish(session: pytest.Session) -> None:
    if not suite.Early.wanted() or session.config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # under xdist every worker collects the test, and only one will run it: no early start
    if any(item.name == TEST for item in session.items) and not suite.EARLY.started:
        suite.EARLY.start(sdist_cache(session.config), WORKERS)


def pytest_sessionfinish(session: pytest.Session) -> None:
    suite.EARLY.stop()
