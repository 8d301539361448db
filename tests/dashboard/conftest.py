"""Fixtures for the dashboard: the SQL store and a real embedded hub behind the configured settings."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import LazySettings

from balancer.lease import Coordinator
from balancer.model import BalancerEvent, EventKind, HubRef
from balancer.strategies import get_strategy
from dashboard.control import logins, refusals
from dashboard.live import state
from dashboard.live.host import Host, host
from tests.support.postgres import Postgres, start_postgres
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores, hub_ref

PARTITIONS = 4


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep the call phase's report on the item, so a fixture can tell whether its test failed."""
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    """A throwaway PostgreSQL cluster of the test's own (the process suites stop and restart it)."""
    server = start_postgres()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def ref(settings: LazySettings) -> HubRef:
    settings.LEASEBOARD_NAMESPACE = "dash.example"
    settings.LEASEBOARD_HUB = "sensors"
    settings.LEASEBOARD_CONSUMER_GROUP = "$Default"
    return hub_ref()


@pytest.fixture
def hub(settings: LazySettings, tmp_path: Path, ref: HubRef) -> Iterator[EmbeddedHub]:
    """The configured hub, a real embedded one with PARTITIONS empty partitions."""
    settings.LEASEBOARD_SOURCE = "embedded"
    settings.LEASEBOARD_HUB_DIR = tmp_path / "hub"
    with EmbeddedHub(tmp_path / "hub", ref.hub, partitions=PARTITIONS) as opened:
        yield opened


@pytest.fixture
async def stores(settings: LazySettings, transactional_db: None, ref: HubRef) -> AsyncIterator[Stores]:
    """The SQL store the dashboard reads (its own threads and connections, hence transactional_db)."""
    settings.LEASEBOARD_STORE = "sql"
    settings.LEASEBOARD_EXPIRY = 30.0
    await state.forget_stores()
    try:
        yield state.configured_stores()
    finally:
        # The monitors read the database: stopped before the test database is flushed.
        await asyncio.to_thread(host.stop)
        await state.forget_stores()


def _in_a_transaction(item: pytest.Item) -> bool:
    """Whether pytest-django runs ``item`` inside a transaction (``django_db`` without ``transaction=True``)."""
    marker = item.get_closest_marker("django_db")
    fixtures = getattr(item, "fixturenames", ())
    if "transactional_db" in fixtures or "live_server" in fixtures:
        return False
    return marker is not None and not marker.kwargs.get("transaction", False)


@pytest.fixture(autouse=True)
def _fresh_login_counts() -> None:
    """Each test starts with no login attempts and no refusal logged in this process (both are per
    minute: a test's logins would count against the next one's)."""
    logins._RATE.seen.clear()
    refusals._logged.clear()


@pytest.fixture(autouse=True)
def _no_monitor_left(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A monitor a test started (a page, a socket, /metrics) stops with the test.

    A test inside a transaction may not start one: on SQLite the transaction holds the write lock
    until after this teardown, so the monitor's first sample write would wait for it while
    ``host.stop()`` waits for that write (see ``dashboard/live/host.py``).
    """
    if _in_a_transaction(request.node):

        def refuse(self: Host, ref: HubRef) -> None:
            raise AssertionError(
                f"{request.node.name} would start a monitor inside a test transaction, whose write lock its "
                "samples would wait for (dashboard/live/host.py): mark it django_db(transaction=True)"
            )

        monkeypatch.setattr(Host, "monitor", refuse)
    yield
    host.stop()


def coordinator(stores: Stores, ref: HubRef, owner_id: str, partitions: int = PARTITIONS, **kw: Any) -> Coordinator:
    """A real coordinator (balanced strategy: one claim per cycle) on the dashboard's stores."""

    async def ids() -> tuple[str, ...]:
        return tuple(str(i) for i in range(partitions))

    return Coordinator(
        ref=ref,
        owner_id=owner_id,
        store=stores.ownership,
        partitions=ids,
        strategy=get_strategy("balanced"),
        expiry=30.0,
        controls=stores.controls,
        rng=random.Random(3),
        **kw,
    )


def event(
    ref: HubRef, partition_id: str = "0", kind: EventKind = EventKind.CLAIM, owner: str | None = "w1"
) -> BalancerEvent:
    return BalancerEvent(kind, ref, partition_id, owner, None, owner or "w0", "never owned", time.time())


def timed_events(settings: LazySettings, ref: HubRef, pid: str, times: list[float]) -> None:
    """Events on partition ``pid`` of the configured embedded hub, enqueued at ``times`` (sequence numbers from 0)."""
    clock = iter(times)
    with EmbeddedHub(settings.LEASEBOARD_HUB_DIR, ref.hub, clock=lambda: next(clock)) as timed:
        for _ in times:
            timed.send(b"{}", partition_id=pid)
