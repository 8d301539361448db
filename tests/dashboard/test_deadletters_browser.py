"""The dead-letters page in Debian Chromium against a real Daphne: readers see the list without bodies;
staff tick dead letters, preview and replay them (read back from the embedded hub with the property
naming where each was), are refused a second replay unless they force it, and purge a partition;
a replay in place waits, marked pending, for the partition's owner.
No console error, the Content-Security-Policy intact."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from balancer.model import HubRef
from tests.dashboard import test_browser
from tests.dashboard.test_browser import ROOT, Site
from workers.deadletter.decode import properties_of
from workers.deadletter.replay import REPLAYED_FROM
from workers.hub.embedded import EmbeddedHub
from workers.runtime.deadletters import DeadLetters
from workers.sources.base import Position

browser = test_browser.browser  # the browser suite's fixtures: one Chromium per module, a page per test
page = test_browser.page

pytestmark = pytest.mark.slow

PASSWORD = "dead-letters-password-1"
REF = HubRef("localhost", "sensors", "$Default")
BODIES = [b'{"door": "open"}', b"plain text", b"\x00\x01\x02"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """A console whose hub ``sensors`` has three dead letters on partition 1 and one on partition 2."""
    served = Site(tmp_path_factory.mktemp("deadletters"), LEASEBOARD_ADMIN_PASSWORD=PASSWORD)
    served.migrate()
    served.ensure_admin()
    letters = DeadLetters(served.var / "deadletter")
    with EmbeddedHub(served.var / "hub", REF.hub, partitions=4) as hub:
        for partition, bodies in (("1", BODIES), ("2", [b"{}"])):
            for event in hub.send_batch(bodies, partition_id=partition):
                letters.add(REF, "w1", event, ValueError(f"cannot handle {event.sequence_number}"), 3)
    seed = [sys.executable, "-m", "tests.dashboard.seed_fleet", REF.hub]
    subprocess.run(seed, cwd=ROOT, env=served.env, check=True, timeout=120, capture_output=True)
    served.start()
    try:
        yield served
    finally:
        served.stop()


def watch_console(page: Page) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return errors


def replayed_from(site: Site) -> list[str]:
    """The replay property of every event of partition 1 after the three set aside."""
    with EmbeddedHub(site.var / "hub", REF.hub) as hub:
        reader = hub.reader("1", Position.after(len(BODIES) - 1))
        try:
            return [str(properties_of(e.amqp).get(REPLAYED_FROM)) for e in reader.receive(100)]
        finally:
            reader.close()


def test_a_reader_sees_the_dead_letters_without_their_bodies(site: Site, page: Page) -> None:
    errors = watch_console(page)
    response = page.goto(site.url + "/deadletters/?hub=sensors")

    assert response is not None and response.status == 200
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "style-src 'self'" in policy and "unsafe-inline" not in policy
    expect(page.locator("#deadletters-connection")).to_have_attribute("data-state", "live", timeout=15_000)
    rows = page.locator("#deadletters tbody tr")
    expect(rows).to_have_count(4)
    assert [(r.get_attribute("data-partition"), r.get_attribute("data-sequence")) for r in rows.all()] == [
        ("1", "0"),
        ("1", "1"),
        ("1", "2"),
        ("2", "0"),
    ]
    expect(rows.first.locator("td.body")).to_have_text("(staff only)")
    expect(rows.first.locator("td.err")).to_contain_text("the text is shown to staff only")
    assert page.locator("input.pick").count() == 0 and page.locator("#action-dialog").count() == 0
    expect(page.locator('nav.pages a[aria-current="page"]')).to_have_text("Dead letters")
    assert errors == [], errors


def log_in(site: Site, page: Page) -> None:
    page.goto(site.url + "/login/?next=/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", PASSWORD)
    page.click("form button[type=submit]")
    page.wait_for_url(site.url + "/")


def test_staff_replay_a_selection_are_refused_a_second_time_and_purge_a_partition(site: Site, page: Page) -> None:
    errors = watch_console(page)
    log_in(site, page)
    page.goto(site.url + "/deadletters/?hub=sensors&partition=1")
    rows = page.locator("#deadletters tbody tr")
    expect(rows).to_have_count(3)
    expect(page.locator('tr[data-sequence="0"]')).to_have_attribute("data-encoding", "json")
    expect(page.locator('tr[data-sequence="1"] td.body pre')).to_have_text("plain text")
    expect(page.locator('tr[data-sequence="2"] td.body pre')).to_have_text("000102")

    page.check('tr[data-sequence="0"] input.pick')
    page.check('tr[data-sequence="2"] input.pick')
    page.click("#replay-selected")
    expect(page.locator("#action-selection")).to_have_value("0,2")
    page.fill("#action-reason", "handler fixed")
    page.click("#action-preview-button")
    expect(page.locator("#preview-summary")).to_contain_text(
        "replay 2 dead letters of partition 1 (sequence numbers 0, 2)"
    )
    page.click("#action-confirm")
    expect(page.locator("#action-dialog")).not_to_be_visible()
    expect(page.locator('tr[data-sequence="0"]')).to_have_attribute("data-replayed", "true", timeout=10_000)
    expect(page.locator('tr[data-sequence="1"]')).to_have_attribute("data-replayed", "false")
    assert replayed_from(site) == ["1:0", "1:2"]

    page.check('tr[data-sequence="0"] input.pick')
    page.click("#replay-selected")
    page.fill("#action-reason", "once more")
    page.click("#action-preview-button")
    expect(page.locator("#action-error")).to_contain_text("1:0 already replayed at")
    expect(page.locator("#action-confirm")).to_be_disabled()
    page.check("#action-force")
    page.click("#action-preview-button")
    expect(page.locator("#preview-notes")).to_contain_text("forced: 1:0 already replayed at")
    page.click("#action-cancel")
    assert replayed_from(site) == ["1:0", "1:2"]  # only previewed

    page.click("#purge-all")
    page.fill("#action-reason", "done with them")
    page.click("#action-preview-button")
    expect(page.locator("#preview-summary")).to_contain_text("purge 3 dead letters of partition 1")
    page.click("#action-confirm")
    expect(page.locator("#no-deadletters")).to_be_visible(timeout=10_000)
    expect(rows).to_have_count(0)
    refused = "Failed to load resource: the server responded with a status of 409 (Conflict)"
    assert errors == [refused], errors  # Chromium logs the refused second replay; nothing else


def test_staff_replay_a_partition_in_place_and_it_waits_for_its_owner(site: Site, page: Page) -> None:
    """No worker runs here (the fleet is seeded): the request stays pending, and says so."""
    errors = watch_console(page)
    log_in(site, page)
    page.goto(site.url + "/deadletters/?hub=sensors&partition=2")
    expect(page.locator("#deadletters tbody tr")).to_have_count(1)

    page.click("#replay-all-in-place")
    page.fill("#action-reason", "handler fixed")
    page.click("#action-preview-button")
    expect(page.locator("#preview-summary")).to_contain_text(
        "replay 1 dead letter of partition 2 (sequence number 0) in place: each is handed to the handler of"
    )
    expect(page.locator("#preview-notes")).to_contain_text("the checkpoint does not move")
    page.click("#action-confirm")
    expect(page.locator("#action-dialog")).not_to_be_visible()
    row = page.locator('tr[data-sequence="0"]')
    expect(row).to_have_attribute("data-replayed", "true", timeout=10_000)
    expect(row.locator("td.replayed")).to_contain_text("by admin as in place (pending)")
    assert errors == [], errors
