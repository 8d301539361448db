"""The console as a new user finds it, in Debian Chromium against a real Daphne: every page (the
pipeline's too) has the same header and navigation, a drained worker is counted as draining in the
header, and the fleet page shows desired workers beside KEDA's figure (also on ``/metrics``)."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from tests.dashboard import test_browser
from tests.dashboard.test_browser import ROOT, Site, Worker
from workers.hub.embedded import EmbeddedHub

browser = test_browser.browser  # the browser suite's fixtures: one Chromium per module, a page per test
page = test_browser.page

pytestmark = pytest.mark.slow

NAVIGATION = ["Fleet", "Events", "History", "Pipeline", "Groups", "Dead letters"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    served = Site(tmp_path_factory.mktemp("pages"))
    served.migrate()
    with EmbeddedHub(served.var / "hub", "sensors", partitions=4) as hub:
        hub.send_batch([b'{"sensor": "door"}'] * 100, partition_id="0")
    served.start()
    try:
        yield served
    finally:
        served.stop()


def header(page: Page) -> list[str]:
    return [a.inner_text() for a in page.locator("header.topbar nav.pages a").all()]


def test_the_pipeline_page_has_the_header_and_navigation_of_every_other_page(site: Site, page: Page) -> None:
    for path, current in (("/", "Fleet"), ("/events/", "Events"), ("/history/", "History")):
        page.goto(site.url + path)
        assert header(page) == NAVIGATION
        expect(page.locator('header.topbar nav.pages a[aria-current="page"]')).to_have_text(current)

    page.goto(site.url + "/pipeline/?hub=sensors")

    assert header(page) == NAVIGATION
    expect(page.locator('header.topbar nav.pages a[aria-current="page"]')).to_have_text("Pipeline")
    expect(page.locator("header.topbar .brand")).to_have_attribute("href", re.compile(r"^/\?hub=sensors&"))
    expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=10_000)  # the live header
    expect(page.locator("#owned-summary")).to_have_text("0 / 4 owned", timeout=10_000)
    expect(page.locator("#hub")).to_have_text("sensors")
    expect(page.locator("#namespace")).to_have_text("localhost", timeout=10_000)  # learnt from the state
    expect(page.locator("#consumer-group")).to_have_text("$Default")
    expect(page.locator("#pipeline-connection")).to_have_attribute("data-state", "live", timeout=10_000)
    expect(page.locator("#generated")).to_contain_text("as of")  # the pipeline's own figures still load
    assert page.locator("#alert").count() == 1 and page.locator("#connection").count() == 1


def test_a_drained_worker_shows_as_draining_in_the_header_count(site: Site, page: Page) -> None:
    workers = [Worker(site, "wa"), Worker(site, "wb")]
    try:
        for worker in workers:
            worker.command("cycle")
        page.goto(site.url + "/")
        expect(page.locator("#workers-summary")).to_have_text("2 workers alive", timeout=10_000)

        subprocess.run(
            [sys.executable, "manage.py", "drain", "wa", "--reason", "deploy", "--yes"],
            cwd=ROOT,
            env=site.env,
            check=True,
            timeout=60,
            capture_output=True,
        )

        expect(page.locator("#workers-summary")).to_have_text("2 workers alive, 1 draining", timeout=10_000)
        expect(page.locator("#worker-count")).to_have_text("(2 alive of 2, 1 draining)")
        page.goto(site.url + "/pipeline/")
        expect(page.locator("#workers-summary")).to_have_text("2 workers alive, 1 draining", timeout=10_000)
        state = urllib.request.urlopen(f"{site.url}/api/state", timeout=5).read().decode()
        assert '"workers_draining": 1' in state
    finally:
        subprocess.run(
            [sys.executable, "manage.py", "undrain", "wa", "--reason", "done", "--yes"],
            cwd=ROOT,
            env=site.env,
            timeout=60,
            capture_output=True,
        )
        for worker in workers:
            worker.command("release")
            worker.stop()


def test_the_fleet_page_shows_desired_workers_beside_kedas_figure(site: Site, page: Page) -> None:
    page.goto(site.url + "/")

    expect(page.locator("#capacity")).to_be_visible(timeout=10_000)
    expect(page.locator("#keda-workers")).to_have_text("2", timeout=10_000)  # 100 events waiting / 64
    expect(page.locator("#desired-workers")).to_have_text(re.compile(r"^\d+$"))
    expect(page.locator("#capacity-target")).not_to_have_text("\u2013")
    metrics = urllib.request.urlopen(f"{site.url}/metrics", timeout=10).read().decode()
    assert re.search(r"^leaseboard_desired_workers \d", metrics, re.M)
    assert re.search(r"^leaseboard_keda_desired_workers 2\.0$", metrics, re.M)
    assert re.search(r"^leaseboard_backlog_events 100\.0$", metrics, re.M)
