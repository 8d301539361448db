"""The pipeline page in Debian Chromium against a real Daphne: an alert raised by another process
after the page loaded appears in the alerts table without a reload, carried by ``/ws/pipeline/``,
once; the live latency figures show. No console error, the Content-Security-Policy intact."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, WebSocket, expect

from tests.dashboard import test_browser
from tests.dashboard.test_browser import ROOT, Site
from workers.hub.embedded import EmbeddedHub

browser = test_browser.browser  # the browser suite's fixtures: one Chromium per module, a page per test
page = test_browser.page

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    served = Site(tmp_path_factory.mktemp("pipeline-feed"))
    served.migrate()
    with EmbeddedHub(served.var / "hub", "sensors", partitions=4) as hub:
        hub.send_batch([b'{"sensor": "door"}'] * 4, partition_id="0")
    served.start()
    try:
        yield served
    finally:
        served.stop()


def raise_alert(site: Site, partition: str, sequence: int, latency: float) -> str:
    """An alert raised in the console's database by another process (``raise_alert``); its home."""
    command = [sys.executable, "-m", "tests.dashboard.raise_alert", "sensors", partition, str(sequence), str(latency)]
    done = subprocess.run(command, cwd=ROOT, env=site.env, check=True, timeout=120, capture_output=True, text=True)
    return done.stdout.strip()


def test_an_alert_raised_after_the_page_loaded_shows_at_once_with_the_latency(site: Site, page: Page) -> None:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    carried: list[tuple[str, int]] = []  # the alerts /ws/pipeline/ sent

    def listen(socket: WebSocket) -> None:
        if "/ws/pipeline/" in socket.url:
            socket.on("framereceived", lambda payload: carried.extend(alerts_in(payload)))

    page.on("websocket", listen)
    response = page.goto(site.url + "/pipeline/?hub=sensors")
    assert response is not None and response.status == 200
    assert "unsafe-inline" not in response.headers["content-security-policy"]
    expect(page.locator("#alerts-feed")).to_have_attribute("data-state", "live", timeout=15_000)
    expect(page.locator("#no-alerts")).to_be_visible()
    expect(page.locator("#alert-latency")).to_have_text("\N{EN DASH}")

    home = raise_alert(site, "2", 41, 0.35)

    added = page.locator('#alerts tbody tr[data-partition="2"][data-sequence="41"]')
    expect(added).to_have_count(1, timeout=10_000)
    expect(added).to_contain_text(home)
    expect(added.locator(".kind")).to_have_text("glass break")
    assert ("2", 41) in carried, "the alert came with the poll, not the websocket"
    expect(page.locator("#alert-latency")).to_have_text("350 ms / 350 ms", timeout=10_000)
    expect(page.locator("#aggregate-latency")).to_have_text("3.0 s / 3.9 s", timeout=10_000)

    # The poll lists it too: still one row once the page has polled again.
    generated = page.locator("#generated").inner_text()
    expect(page.locator("#generated")).not_to_have_text(generated, timeout=10_000)
    expect(page.locator("#alerts tbody tr")).to_have_count(1)
    assert carried.count(("2", 41)) == 1
    expect(page.locator("#pipeline-connection")).to_have_attribute("data-state", "live")
    assert errors == [], errors


def alerts_in(payload: str | bytes) -> list[tuple[str, int]]:
    message = json.loads(payload)
    if message.get("type") != "alerts":
        return []
    return [(a["partition_id"], a["sequence_number"]) for a in message["alerts"]]
