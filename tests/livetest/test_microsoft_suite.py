"""Microsoft's own azure-eventhub live tests pass against ``manage.py runhub`` (see suite.py).

Slow: it fetches the SDK's source distribution once (cached under pytest's cache), then runs about
two hundred of Microsoft's tests, real clients against a real ``runhub`` process, many at once.
The summary line (collected, not applicable, passed, failed) is printed with the test report.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.livetest import suite
from tests.livetest.not_applicable import NOT_APPLICABLE
from tests.livetest.schedule import LONG

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
# The tests mostly wait (on the hub, on Microsoft's own sleeps): many at once on two cores. Beside
# the five long ones (schedule.LONG, about 5 min), the other ~190 (about 50 min in all) need a dozen.
WORKERS = int(os.environ.get("LIVETEST_WORKERS", "14"))


def sdist_cache(config: pytest.Config, fallback: Path) -> Path:
    """Where the fetched sdist is kept between runs: pytest's cache, or ``fallback`` where the cache is
    off (``-p no:cacheprovider``)."""
    cache = getattr(config, "cache", None)
    return Path(cache.mkdir("azure-eventhub-sdist")) if cache is not None else fallback


def test_microsofts_livetest_suite_passes_against_runhub(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    pinned, outcome = suite.run_all(sdist_cache(request.config, tmp_path / "sdist"), tmp_path, WORKERS)
    line = outcome.summary(pinned)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"\n{line}\n{outcome.timing()}")
    request.node.user_properties.append(("summary", line))
    problems = "\n".join(f"  {nodeid}: {why}" for nodeid, why in {**outcome.failed, **outcome.skipped}.items())
    assert outcome.passed and not outcome.failed and not outcome.skipped, f"{line}\n{problems}"
    # Every entry of the list still names a test of this version: the list cannot silently go stale.
    stale = [
        key for key in NOT_APPLICABLE if not any(n == key or n.startswith(key + "[") for n in outcome.not_applicable)
    ]
    assert not stale, f"not_applicable.py names tests this version does not have: {stale}"
    ran = {nodeid.split("[", 1)[0] for nodeid in outcome.times}
    assert not (set(LONG) - ran), f"schedule.LONG names tests that did not run: {sorted(set(LONG) - ran)}"
