"""The partition page's event browser in Debian Chromium against a real Daphne: a reader sees the
newest events of the embedded hub without their bodies; staff see them decoded, page to older
events, and read from a sequence number oldest first. No console error, the Content-Security-Policy
intact."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from balancer.model import HubRef
from tests.dashboard import test_browser
from tests.dashboard.test_browser import ROOT, Site
from workers.hub.embedded import EmbeddedHub

from .dead import with_properties

browser = test_browser.browser  # the browser suite's fixtures: one Chromium per module, a page per test
page = test_browser.page

pytestmark = pytest.mark.slow

PASSWORD = "event-browser-password-1"
REF = HubRef("localhost", "sensors", "$Default")
EVENTS = 25  # on partition 1: {"n": 0} .. {"n": 24}, the last with an application property


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    served = Site(tmp_path_factory.mktemp("eventbrowser"), LEASEBOARD_ADMIN_PASSWORD=PASSWORD)
    served.migrate()
    served.ensure_admin()
    bodies = [f'{{"n": {i}}}'.encode() for i in range(EVENTS)]
    amqp = [b""] * (EVENTS - 1) + [with_properties(bodies[-1], {"Diagnostic-Id": "00-ab"})]
    with EmbeddedHub(served.var / "hub", REF.hub, partitions=4) as hub:
        hub.send_batch(bodies, partition_id="1", partition_key="home-7", amqp=amqp)
    seed = [sys.executable, "-m", "tests.dashboard.seed_fleet", REF.hub]
    subprocess.run(seed, cwd=ROOT, env=served.env, check=True, timeout=120, capture_output=True)
    served.start()
    try:
        yield served
    finally:
        served.stop()


def sequences(page: Page) -> list[str | None]:
    return [row.get_attribute("data-sequence") for row in page.locator("#browser tbody tr").all()]


def test_readers_browse_without_bodies_and_staff_page_through_the_events_decoded(site: Site, page: Page) -> None:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    response = page.goto(site.url + "/partitions/1/?hub=sensors")

    assert response is not None and response.status == 200
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "style-src 'self'" in policy and "unsafe-inline" not in policy
    expect(page.locator("#browser-connection")).to_have_attribute("data-state", "live", timeout=15_000)
    rows = page.locator("#browser tbody tr")
    expect(rows).to_have_count(20)
    assert sequences(page)[:2] == ["24", "23"]
    expect(rows.first.locator("td.body")).to_have_text("(staff only)")
    expect(rows.first.locator("td.props")).to_have_text('{"Diagnostic-Id":"00-ab"}')
    expect(page.locator("#browser-note")).to_contain_text("it holds 0..24")

    page.goto(site.url + "/login/?next=/partitions/1/%3Fhub%3Dsensors")
    page.fill("#id_username", "admin")
    page.fill("#id_password", PASSWORD)
    page.click("form button[type=submit]")
    expect(page.locator('#browser tr[data-sequence="24"]')).to_have_attribute("data-encoding", "json", timeout=15_000)
    expect(page.locator('#browser tr[data-sequence="24"] td.body pre')).to_contain_text('"n": 24')
    expect(page.locator("#browser-newer")).to_be_disabled()

    page.click("#browser-older")
    expect(rows).to_have_count(5)
    assert sequences(page) == ["4", "3", "2", "1", "0"]
    expect(page.locator("#browser-older")).to_be_disabled()

    page.select_option("#browser-from", "sequence")
    page.fill("#browser-value", "7")
    page.select_option("#browser-count", "10")
    page.select_option("#browser-order", "oldest")
    page.click("#browser-go")
    expect(page.locator("#browser tbody tr").first).to_have_attribute("data-sequence", "7")
    assert sequences(page) == [str(i) for i in range(7, 17)]
    expect(page.locator("#browser-alert")).to_be_hidden()
    assert errors == [], errors
