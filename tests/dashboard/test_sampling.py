"""Lag is sampled while the dashboard runs, whether or not a page is open.

Under Daphne the configured hub's monitor starts with the first connection of any kind (here an
``/api/events`` poll, which reads no state), under ``manage.py serve`` at start, before any request;
the samples are read from the database file itself, not through the server. ``/api/state`` and
``/metrics`` then carry a status for every partition. A monitor round reads the store once for all
partitions, however many there are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from balancer.model import HubRef
from dashboard.dbthread import DatabaseThread
from dashboard.live.monitor import Monitor
from tests.dashboard.console_process import Console, environment, lag_samples, migrate
from tests.support.waiting import until_sync
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

from .conftest import PARTITIONS

STATUSES = {"OK", "WARN", "STALL", "STOP", "REWIND"}
FAST_SAMPLES = {"LEASEBOARD_LAG_SAMPLE_SECONDS": "0.5", "LEASEBOARD_LAG_STOP_SECONDS": "2"}


def _sampled(database: Path) -> set[str]:
    """The partitions that have a sample with a status in the database file (empty: none yet)."""
    return {pid for pid, status in lag_samples(database) if status in STATUSES}


@pytest.fixture
def var(tmp_path: Path) -> Path:
    with EmbeddedHub(tmp_path / "hub", "sensors", partitions=4) as hub:
        for pid in ("0", "1", "2", "3"):  # lag everywhere: nobody checkpoints
            hub.send_batch([b'{"sensor": "motion"}'] * 3, partition_id=pid)
    return tmp_path


@pytest.fixture
def console(var: Path) -> Iterator[Console]:
    env = environment(var, **FAST_SAMPLES)
    migrate(env)
    served = Console(var, env)
    try:
        yield served
    finally:
        served.stop()


@pytest.mark.slow
def test_under_daphne_any_request_starts_sampling_and_api_state_alone_gets_statuses(
    console: Console, var: Path
) -> None:
    console.start_daphne()  # waits with a static file: no state, page or scrape asked for
    events = console.get("/api/events")
    assert events.status == 200, events

    sampled = until_sync(
        lambda: _sampled(var / "db.sqlite3") >= {"0", "1", "2", "3"} and _sampled(var / "db.sqlite3"),
        "lag samples with a status for every partition in the database",
        30,
        step=0.2,
    )
    assert sampled == {"0", "1", "2", "3"}

    def statuses() -> dict[str, Any]:
        answer = console.get("/api/state")
        assert answer.status == 200, answer
        found = {p["id"]: p["lag_status"] for p in answer.json()["partitions"]}
        return found if None not in found.values() else {}

    found = until_sync(statuses, "/api/state to give every partition a lag status", 30, step=0.2)
    assert set(found.values()) <= STATUSES and len(found) == 4, found

    scrape = console.get("/metrics").text
    for pid in "0123":
        assert f'leaseboard_partition_status{{partition="{pid}",status=' in scrape, scrape[-3000:]


@pytest.mark.slow
def test_serve_samples_from_the_start_without_any_request(console: Console, var: Path) -> None:
    console.start_serve("--workers", "1", "--produce", "0", "--no-pipeline")

    sampled = until_sync(
        lambda: _sampled(var / "db.sqlite3") >= {"0", "1", "2", "3"} and _sampled(var / "db.sqlite3"),
        "lag samples with a status for every partition, with no request made",
        60,
        step=0.2,
        check=console.alive,
    )
    assert sampled == {"0", "1", "2", "3"}


# --- one store read per round ------------------------------------------------------------------


class Counting:
    """A store that counts the calls made to it by name, and passes them on."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if not callable(found):
            return found

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            answer: Callable[..., Awaitable[Any]] = found
            return await answer(*args, **kwargs)

        return call


@pytest.mark.django_db(transaction=True)
async def test_a_round_reads_the_store_once_for_all_partitions(
    stores: Stores, hub: EmbeddedHub, ref: HubRef, settings: Any
) -> None:
    settings.LEASEBOARD_LAG_SAMPLE_SECONDS = 0.001  # a sample every round
    for pid in map(str, range(PARTITIONS)):
        hub.send_batch([b"{}"] * 2, partition_id=pid)
    counting = Counting(stores.ownership)
    counted = Stores(ownership=counting, checkpoints=counting, controls=counting)
    db = DatabaseThread("test-sampling")
    watched = Monitor(ref, db)
    try:
        for _ in range(3):
            await watched.round(counted)
    finally:
        await db.aclose()

    assert watched.error is None
    assert counting.calls == {
        "now": 3,
        "list_ownership": 3,
        "list_checkpoints": 3,
        "list_members": 3,
        "list_controls": 3,
    }, counting.calls
    assert watched.state is not None
    assert {p.id: p.lag_status is not None for p in watched.state.partitions} == dict.fromkeys(
        map(str, range(PARTITIONS)), True
    )
