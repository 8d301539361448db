"""Desired workers on a real fleet: Daphne, one ``runworkers`` process whose handler takes 5 ms an
event (at most ~200 events a second) and ``manage.py produce``. While the producer writes 40 events
a second the worker keeps up and ``/metrics`` says one worker is enough; when the producer speeds up
to 1000 a second the backlog grows and ``leaseboard_desired_workers`` rises above 1."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from tests.dashboard.test_browser import ROOT, Site
from tests.support.waiting import until_sync
from workers.hub.embedded import EmbeddedHub

pytestmark = pytest.mark.slow

PARTITIONS = 4


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@pytest.fixture
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    served = Site(tmp_path_factory.mktemp("fleet"), LEASEBOARD_TARGET_CATCHUP_SECONDS="60")  # 4 partitions
    served.migrate()
    with EmbeddedHub(served.var / "hub", "sensors", partitions=PARTITIONS):
        pass
    served.start()
    try:
        yield served
    finally:
        served.stop()


def spawn(site: Site, *args: str) -> subprocess.Popen[bytes]:
    log = (site.var / f"{args[0]}.log").open("ab")
    return subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT, env=site.env, stdout=log, stderr=log)


def metrics(site: Site) -> dict[str, float]:
    text = urllib.request.urlopen(f"{site.url}/metrics", timeout=10).read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^(leaseboard_[a-z_]+) (\S+)$", text, re.M)}


def test_desired_workers_rise_above_one_when_the_producer_outpaces_one_slow_worker(site: Site) -> None:
    workers = spawn(
        site,
        "runworkers",
        "--count",
        "1",
        "--owner-prefix",
        "slow",
        "--interval",
        "0.5",
        "--expiry",
        "5",
        "--handler",
        "tests.dashboard.slow_handler.SlowHandler",
        "--checkpoint-seconds",
        "0.5",
    )
    producer = spawn(site, "produce", "--rate", "40")
    try:
        seen: list[dict[str, float]] = []

        def keeping_up() -> dict[str, float] | None:
            found = metrics(site)
            seen.append(found)
            working = found.get("leaseboard_processing_workers") == 1
            measured = found.get("leaseboard_enqueue_rate_events_per_second", 0) > 20  # most of the window produced
            rated = working and measured and found.get("leaseboard_processing_rate_events_per_second")
            # On a busy machine the worker may start behind the producer and rightly ask for a second
            # worker while it catches up: one is enough once it keeps up, within the deadline.
            return found if rated and found.get("leaseboard_desired_workers") == 1 else None

        until_sync(
            keeping_up,
            "the worker to keep up and one worker to be enough",
            timeout=60,
            step=0.5,
            detail=lambda: str(seen[-1] if seen else "no metrics yet"),
        )

        stop(producer)
        producer = spawn(site, "produce", "--rate", "1000")

        def outpaced() -> dict[str, float] | None:
            found = metrics(site)
            return found if found.get("leaseboard_desired_workers", 0) > 1 else None

        busy = until_sync(outpaced, "leaseboard_desired_workers above 1", timeout=90, step=0.5)
        assert busy["leaseboard_backlog_events"] > 0
        assert busy["leaseboard_enqueue_rate_events_per_second"] > busy["leaseboard_processing_rate_events_per_second"]
        assert busy["leaseboard_desired_workers"] <= PARTITIONS
        assert "leaseboard_keda_desired_workers" in busy
    finally:
        stop(producer)
        stop(workers)
