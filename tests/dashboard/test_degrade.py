"""In-process: outages answer 503 with the reason or the last state marked stale, never 500; the log
gets one line per break and one per heal (``dashboard/live/health.py``, ``dashboard/web/degrade.py``).

The real servers are stopped and started in ``test_outages.py``; here the outage is the in-memory
store marked down, or the database driver's OperationalError raised where the ORM is called.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import OperationalError
from django.test import AsyncClient, Client

from balancer.model import HubRef
from dashboard.live import state
from dashboard.live.health import DATABASE, STORE, Health, health, outage
from dashboard.live.state import configured_stores, forget_stores
from dashboard.web import api, pages
from dashboard.web import scrape as metrics_view
from tests.support.waiting import until

from .test_metrics import labelled, scrape

pytestmark = pytest.mark.django_db(transaction=True)

REFUSED = 'connection to server at "127.0.0.1", port 5432 failed: Connection refused'


@pytest.fixture(autouse=True)
def _healthy() -> Iterator[None]:
    health.reset()
    yield
    health.reset()


@pytest.fixture
async def memory(settings: Any, ref: HubRef) -> Any:
    settings.LEASEBOARD_STORE = "memory"
    await forget_stores()
    store = configured_stores().ownership
    yield store
    store.down = False  # type: ignore[attr-defined]
    await forget_stores()


def refused(*args: Any, **kwargs: Any) -> Any:
    raise OperationalError(REFUSED)


def health_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "leaseboard.health"]


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    tracker = Health()
    found = outage(OperationalError(REFUSED))
    assert found is not None and found.backend == DATABASE

    with caplog.at_level(logging.WARNING, "leaseboard.health"):
        for _ in range(50):
            tracker.failed(found)
        assert tracker.down() == {DATABASE: f"database unavailable: {REFUSED}"}
        tracker.ok(DATABASE, STORE)
        tracker.ok(DATABASE)

    lines = health_lines(caplog)
    assert len(lines) == 2, lines
    assert lines[0].startswith("console degraded: the database stopped answering") and REFUSED in lines[0]
    assert lines[1].startswith("console recovered: the database answers again after")
    assert tracker.down() == {}


def test_a_bug_is_not_an_outage() -> None:
    assert outage(ValueError("bad")) is None
    assert outage(KeyError("x")) is None


async def test_api_state_serves_the_last_known_state_marked_stale_while_the_store_is_down(
    async_client: AsyncClient, memory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fresh = await async_client.get("/api/state")
    assert fresh.status_code == 200 and fresh.json()["stale"] is False

    memory.down = True
    with caplog.at_level(logging.WARNING):
        answers = [await async_client.get("/api/state") for _ in range(5)]
        memory.down = False
        healed = await async_client.get("/api/state")

    for answer in answers:
        assert answer.status_code == 200
        body = answer.json()
        assert body["stale"] is True and body["error"].startswith("store unavailable"), body
        assert body["generated_at"] == fresh.json()["generated_at"]
    assert healed.status_code == 200 and healed.json()["stale"] is False
    lines = health_lines(caplog)
    assert len(lines) == 2 and "stopped answering" in lines[0] and "answers again" in lines[1], lines
    assert not [r for r in caplog.records if r.name == "django.request"], "a log line per request"


async def test_metrics_says_which_backend_is_down(
    async_client: AsyncClient, memory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples = await scrape(async_client)
    assert (samples[("leaseboard_store_up", ())], samples[("leaseboard_database_up", ())]) == (1.0, 1.0)

    monkeypatch.setattr(metrics_view, "_logged_by_kind", refused)
    samples = await scrape(async_client)
    assert (samples[("leaseboard_store_up", ())], samples[("leaseboard_database_up", ())]) == (1.0, 0.0)

    memory.down = True  # /metrics serves the monitor's state, which learns it at its next round (a second)

    async def store_down() -> dict[Any, float]:
        found = await scrape(async_client)
        return found if found[("leaseboard_store_up", ())] == 0.0 else {}

    samples = await until(store_down, "/metrics to say leaseboard_store_up 0", 10)
    assert samples[("leaseboard_database_up", ())] == 0.0
    assert not labelled(samples, "leaseboard_partitions_owned", "worker")


async def test_a_store_that_answers_nothing_is_down_after_the_read_deadline_not_after_its_clients_timeouts(
    async_client: AsyncClient, memory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store cut off by a silent network: every call hangs (the Blob client would wait 10 s and retry).
    fresh = await async_client.get("/api/state")
    assert fresh.status_code == 200
    monkeypatch.setattr(state, "STORE_READ_SECONDS", 0.2)
    cut = asyncio.Event()
    listed = memory.list_ownership

    async def hangs(*args: Any) -> Any:
        if cut.is_set():
            await asyncio.Event().wait()  # never answers
        return await listed(*args)

    monkeypatch.setattr(memory, "list_ownership", hangs)
    cut.set()
    started = time.monotonic()
    stale = await async_client.get("/api/state")
    assert time.monotonic() - started < 5
    body = stale.json()
    assert stale.status_code == 200 and body["stale"] is True, body
    assert body["error"] == "store unavailable: store did not answer within 0.2 s (cut off or overloaded)"

    async def store_down() -> dict[Any, float]:
        found = await scrape(async_client)
        return found if found[("leaseboard_store_up", ())] == 0.0 else {}

    await until(store_down, "/metrics to say leaseboard_store_up 0", 10)
    cut.clear()
    healed = await until(lambda: _fresh(async_client), "/api/state fresh again after the heal", 10)
    assert healed["stale"] is False


async def _fresh(client: AsyncClient) -> dict[str, Any] | None:
    answer = await client.get("/api/state")
    body: dict[str, Any] = answer.json()
    return body if answer.status_code == 200 and body["stale"] is False else None


def test_an_api_whose_database_is_down_answers_503_with_the_reason(
    client: Client, ref: HubRef, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(api, "_events", refused)

    with caplog.at_level(logging.WARNING):
        answers = [client.get("/api/events") for _ in range(3)]

    for answer in answers:
        assert answer.status_code == 503 and answer["Content-Type"] == "application/json"
        assert answer.json() == {"error": f"database unavailable: {REFUSED}"}
        assert answer["Retry-After"]
    assert len(health_lines(caplog)) == 1
    assert not [r for r in caplog.records if r.name == "django.request"], "a log line per request"


def test_a_page_whose_database_is_down_is_a_small_503_page_not_a_debug_page(
    client: Client, ref: HubRef, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "_page", refused)

    answer = client.get("/history/")

    assert answer.status_code == 503 and answer["Content-Type"].startswith("text/html")
    page = answer.content.decode()
    assert "cannot show this page" in page and "Connection refused" in page
    assert "Traceback" not in page


def test_a_bug_still_raises(client: Client, ref: HubRef, monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("a bug, not an outage")

    monkeypatch.setattr(api, "_events", bug)

    with pytest.raises(ZeroDivisionError):
        client.get("/api/events")


def test_a_failure_of_a_call_that_began_before_the_backend_answered_again_is_old_news(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracker = Health()
    found = outage(OperationalError(REFUSED))
    assert found is not None
    with caplog.at_level(logging.WARNING, "leaseboard.health"):
        tracker.failed(found)
        began = time.monotonic()  # a slow call starts during the outage...
        tracker.ok(DATABASE)  # ...another one finds the database back...
        tracker.failed(found, started=began)  # ...then the slow one fails
        assert tracker.down() == {}
        tracker.failed(found, started=time.monotonic())  # a call that began after: a new outage
        assert tracker.down() == {DATABASE: found.reason}

    assert len(health_lines(caplog)) == 3
