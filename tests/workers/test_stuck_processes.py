"""A real ``runworkers`` whose handler never returns (issue 35, the handler's part): it gives up on
each call after ``--handler-timeout``, and after ``LEASEBOARD_HANDLER_ABANDON_MAX`` abandoned threads
it releases its partitions and exits non-zero, saying why, for its supervisor to restart it."""

from __future__ import annotations

import subprocess
import sys
from typing import ClassVar

import pytest

from balancer.model import HubRef
from tests.support.processes import ROOT, SqlSite, manage, sql_site_fixtures

pytestmark = pytest.mark.slow

PARTITIONS = 2
REF = HubRef("localhost", "stuck", "$Default")


class Site(SqlSite):
    expected_exits: ClassVar[tuple[int, ...]] = (0, 1)


environment, site = sql_site_fixtures(Site, REF, partitions=PARTITIONS)


async def test_a_worker_whose_handler_never_returns_gives_up_releases_and_exits_non_zero(site: Site) -> None:
    for pid in site.hub.partition_ids():
        site.hub.send_batch([b"{}"] * 3, partition_id=pid)
    command = manage(
        "runworkers",
        "--owner-prefix",
        "S",
        "--store",
        "sql",
        "--source",
        "embedded",
        "--hub",
        REF.hub,
        "--interval",
        "0.5",
        "--expiry",
        "3",
        "--handler",
        "tests.workers.hanging_handler.hang",
        "--handler-timeout",
        "1",
        "--shutdown-timeout",
        "1",
    )
    worker = site.spawn("S", command, {**site.env, "LEASEBOARD_HANDLER_ABANDON_MAX": "2"})
    await site.until(lambda: worker.poll() is not None, 60, "the worker to give up and exit")
    log = site.log("S")
    assert worker.returncode == 1, log[-3000:]
    assert log.count("stuck: handler running") >= 2, log[-3000:]
    assert "were abandoned (LEASEBOARD_HANDLER_ABANDON_MAX 2); stopping, for its supervisor to restart" in log
    assert set((await site.owners()).values()) <= {""}, "a partition is still held after the exit"
    assert await site.checkpoints() == {}  # no call finished: nothing checkpointed past it


def test_runworkers_help_names_the_stuck_bounds_and_their_settings() -> None:
    shown = subprocess.run(
        [sys.executable, "manage.py", "runworkers", "--help"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    flat = " ".join(shown.split())
    assert "--handler-timeout" in flat and "LEASEBOARD_HANDLER_TIMEOUT, 300" in flat
    assert "LEASEBOARD_HANDLER_ABANDON_MAX (3)" in flat
    assert "--reader-stuck" in flat and "LEASEBOARD_READER_STUCK, 30" in flat
    assert "LEASEBOARD_READER_WEDGED seconds (15; 0: never)" in flat
