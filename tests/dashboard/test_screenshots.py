"""The manual's pictures of the console (``docs/images/<page>.png``, embedded by ``docs/console.md``),
taken in Debian Chromium against a real Daphne, and each page checked on the way: it answers 200,
shows what it is for, and logs no console error and no Content-Security-Policy refusal.

One console for all the pages, as ``make demo`` runs it: a hub of eight partitions with a producer
writing to it, two ``runworkers`` processes landing its events (w1 with two workers, then w2 with one,
whose arrival moves partitions by handoff), the Spark pipeline counting them, and three events the
handler cannot read, which it sets aside as dead letters.
Every page but the login page is taken as staff, so the action buttons show. Each picture is the
whole page at a 1440 x 900 viewport.

The suite writes them to ``test-artifacts/screenshots/`` (a run leaves the checkout clean);
``make screenshots`` (``LEASEBOARD_SCREENSHOTS=docs``) writes them into ``docs/images/``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, StorageState, ViewportSize, expect

from tests.dashboard import test_browser
from tests.dashboard.test_browser import ARTIFACTS, ROOT, Site
from tests.support.processes import kill, start_logged
from tests.support.waiting import until_sync
from workers.hub.embedded import EmbeddedHub

browser = test_browser.browser  # one Chromium for the module

pytestmark = pytest.mark.slow

# Where the pictures go: the manual's own with LEASEBOARD_SCREENSHOTS=docs (`make screenshots`).
IMAGES = ROOT / "docs" / "images" if os.environ.get("LEASEBOARD_SCREENSHOTS") == "docs" else ARTIFACTS / "screenshots"
VIEWPORT: ViewportSize = {"width": 1440, "height": 900}
PASSWORD = "screenshots-password-1"
HUB = "sensors"
PARTITIONS = 8
WORKERS = {"w1-0", "w1-1", "w2-0"}


@dataclass
class Console:
    site: Site
    processes: list[subprocess.Popen[bytes]]

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.site.url}/api/state", timeout=5) as response:
            state: dict[str, Any] = json.loads(response.read())
        return state

    def logs(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}" for log in sorted(self.site.var.glob("*.log"))
        )


def _manage(site: Site, *command: str) -> None:
    subprocess.run(
        [sys.executable, "manage.py", *command], cwd=ROOT, env=site.env, check=True, timeout=120, capture_output=True
    )


def _all_owned(console: Console) -> bool:
    return all(p.get("owner") for p in console.state()["partitions"])


def _owners(console: Console) -> dict[str, int]:
    """Worker -> partitions owned, once every partition is owned by a live worker of the three."""
    state = console.state()
    owners = [p.get("owner") for p in state["partitions"]]
    counts = {w: owners.count(w) for w in WORKERS}
    return counts if None not in owners and all(counts.values()) and set(owners) <= WORKERS else {}


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    site = Site(tmp_path_factory.mktemp("screenshots"), LEASEBOARD_ADMIN_PASSWORD=PASSWORD)
    site.env.update(LEASEBOARD_PARTITIONS=str(PARTITIONS), LEASEBOARD_LAG_SAMPLE_SECONDS="1")
    site.migrate()
    _manage(site, "ensureadmin")
    with EmbeddedHub(site.var / "hub", HUB, partitions=PARTITIONS) as hub:
        hub.send_batch([b'{"door": "open"}', b"plain text", b"\x00\x01\x02"], partition_id="1")
    workers = ["runworkers", "--interval", "0.5", "--expiry", "5", "--handler", "workers.landing.LandingHandler"]
    made = Console(site, [])

    def spawn(name: str, *command: str) -> None:
        # Each in a session of its own, so that stopping it stops what it started (the pipeline's JVM).
        command_line = [sys.executable, "manage.py", *command]
        made.processes.append(start_logged(site.var / f"{name}.log", command_line, site.env, start_new_session=True))

    try:
        spawn("producer", "produce", "--rate", "20", "--seed", "1")
        spawn("w1", *workers, "--count", "2", "--owner-prefix", "w1")
        site.start()
        until_sync(lambda: _all_owned(made), "w1's two workers to own every partition", 60, detail=made.logs)
        spawn("w2", *workers, "--count", "1", "--owner-prefix", "w2")  # handoffs, for the events pages
        spawn("pipeline", "runpipeline", "--master", "local[2]", "--trigger-seconds", "2")
        until_sync(lambda: _owners(made), "the three workers to share the partitions", 60, detail=made.logs)
        yield made
    finally:
        for process in reversed(made.processes):
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(made.processes):
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                kill(process, group=True)
        site.stop()


@pytest.fixture(scope="module")
def staff(browser: Browser, console: Console) -> StorageState:
    """A staff login's cookies, for every page but the login page."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.goto(console.site.url + "/login/?next=/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", PASSWORD)
    page.click("form button[type=submit]")
    page.wait_for_url(console.site.url + "/")
    state = context.storage_state()
    context.close()
    return state


def _live(page: Page, pill: str = "#connection") -> None:
    expect(page.locator(pill)).to_have_attribute("data-state", "live", timeout=15_000)


def _fleet(page: Page) -> None:
    _live(page)
    expect(page.locator("#partitions [data-owner]")).to_have_count(PARTITIONS, timeout=15_000)
    expect(page.locator("#workers-summary")).to_have_text("3 workers alive", timeout=15_000)


def _partition(page: Page) -> None:
    _live(page)
    expect(page.locator("#p-owner")).not_to_have_text("\u2013", timeout=15_000)  # an en dash: none yet
    expect(page.locator("#timeline tbody tr").first).to_be_visible(timeout=15_000)
    expect(page.locator("#no-samples")).to_be_hidden(timeout=15_000)


def _events(page: Page) -> None:
    _live(page)
    expect(page.locator("#events tbody tr").first).to_be_visible(timeout=15_000)


def _history(page: Page) -> None:
    _live(page)
    expect(page.locator("#episodes tbody tr").first).to_be_visible(timeout=15_000)


def _groups(page: Page) -> None:
    _live(page, "#groups-connection")
    expect(page.locator("#groups tbody tr").first).to_be_visible(timeout=15_000)


def _deadletters(page: Page) -> None:
    _live(page, "#deadletters-connection")
    expect(page.locator("#deadletters tbody tr")).to_have_count(3, timeout=15_000)


def _pipeline(page: Page) -> None:
    _live(page)
    _live(page, "#pipeline-connection")
    # The pipeline's JVM starts while the other pages are taken; on a busy machine that is slow.
    expect(page.locator("#no-batches")).to_be_hidden(timeout=180_000)
    expect(page.locator("#no-executors")).to_be_hidden(timeout=15_000)
    expect(page.locator("#no-chart")).to_be_hidden(timeout=15_000)


def _login(page: Page) -> None:
    expect(page.locator("form button[type=submit]")).to_be_visible()


# name (the picture's), path, what shows the page is drawn, taken as staff
PAGES: list[tuple[str, str, Callable[[Page], None], bool]] = [
    ("fleet", "/", _fleet, True),
    ("partition", "/partitions/0/", _partition, True),
    ("events", "/events/", _events, True),
    ("history", "/history/", _history, True),
    ("groups", "/groups/", _groups, True),
    ("deadletters", "/deadletters/?hub=sensors&partition=1", _deadletters, True),
    ("pipeline", "/pipeline/", _pipeline, True),
    ("login", "/login/", _login, False),
]


@pytest.mark.parametrize(("name", "path", "drawn", "as_staff"), PAGES, ids=[p[0] for p in PAGES])
def test_the_page_is_pictured_for_the_manual(
    console: Console,
    browser: Browser,
    staff: StorageState,
    name: str,
    path: str,
    drawn: Callable[[Page], None],
    as_staff: bool,
) -> None:
    context = browser.new_context(viewport=VIEWPORT, storage_state=staff if as_staff else None)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        response = page.goto(console.site.url + path)
        assert response is not None and response.status == 200, path
        drawn(page)
        page.evaluate("document.fonts.ready")
        assert errors == [], errors
        IMAGES.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(IMAGES / f"{name}.png"), full_page=True)
    except BaseException:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"test_screenshots-{name}.png"), full_page=True)
        raise
    finally:
        context.close()


def test_every_picture_the_manual_embeds_is_taken_here() -> None:
    embedded = {Path(line.split("](images/")[1].split(")")[0]).stem for line in _image_lines()}
    assert embedded == {name for name, *_ in PAGES}


def _image_lines() -> list[str]:
    docs = ROOT / "docs"
    return [line for page in docs.glob("*.md") for line in page.read_text().splitlines() if "](images/" in line]
