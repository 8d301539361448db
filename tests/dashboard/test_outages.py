"""The console degrades instead of failing: a real Daphne while its database or its ownership store
(PostgreSQL, Redis, Azurite) is stopped and started again.

During the outage every page and API answers: a 503 with the reason where it cannot, the last known
state marked ``stale`` where it can, and ``/metrics`` 200 with ``leaseboard_store_up 0``; never a 500
or Django's debug page. The log gets one line when the backend breaks and one when it heals, not a
traceback per request. Once the server is back, the first request of each kind succeeds, also when
the connections the dashboard kept were broken by the restart without any request in between.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.dashboard.api_document import conforms
from tests.dashboard.console_process import Answer, Console, environment, migrate
from tests.support.azurite import Azurite, start_azurite
from tests.support.postgres import Postgres
from tests.support.redis_server import RedisServer, start_redis
from tests.support.waiting import until_sync
from workers.hub.embedded import EmbeddedHub

pytestmark = pytest.mark.slow

# Endpoints that need the database: a 503 with the reason while it is down.
DATABASE_APIS = ("/api/events", "/api/pipeline", "/api/history", "/api/audit", "/api/partitions/0")
PAGES = ("/", "/events/", "/history/", "/partitions/0/", "/pipeline/")
BROKE, HEALED = "console degraded:", "console recovered:"


def _hub(var: Path) -> None:
    with EmbeddedHub(var / "hub", "sensors", partitions=4) as hub:
        hub.send_batch([b'{"sensor": "door"}'] * 5, partition_id="0")


@pytest.fixture
def var(tmp_path: Path) -> Path:
    _hub(tmp_path)
    return tmp_path


def _console(var: Path, **env: str) -> Iterator[Console]:
    settings = environment(var, **env)
    migrate(settings)
    console = Console(var, settings)
    console.start_daphne()
    try:
        yield console
    finally:
        console.stop()


def _healthy(console: Console) -> None:
    """Every endpoint answers 200 with fresh data (the state is then known to the console)."""
    state = console.get("/api/state")
    assert state.status == 200 and state.json()["stale"] is False, state
    assert len(state.json()["partitions"]) == 4, state
    assert console.metric("leaseboard_store_up") == 1.0
    for path in (*DATABASE_APIS, *PAGES):
        answer = console.get(path)
        assert answer.status == 200, f"{path}: {answer}"


def _down(console: Console) -> bool:
    return console.metric("leaseboard_store_up") == 0.0


def _no_server_errors(path: str, answer: Answer) -> None:
    assert answer.status < 500 or answer.status == 503, f"{path} answered {answer}"
    assert "Traceback" not in answer.text and "technical_500" not in answer.text, f"{path}: a debug page: {answer}"
    if path.startswith(("/api/", "/metrics")):  # the 503s and the stale state are in the API's document too
        conforms("GET", path, answer.status, answer.content_type, answer.body)


def _degraded(console: Console, *, database_down: bool, backend: str) -> None:
    """One sweep over every endpoint during an outage of ``backend``."""
    state = console.get("/api/state")
    _no_server_errors("/api/state", state)
    assert state.status == 200, state  # it was read before the outage: the last known state, marked stale
    body = state.json()
    assert body["stale"] is True and "unavailable" in body["error"], body
    assert len(body["partitions"]) == 4

    metrics = console.get("/metrics")
    _no_server_errors("/metrics", metrics)
    assert metrics.status == 200, metrics
    assert "\nleaseboard_store_up 0.0\n" in metrics.text, metrics
    assert f"\nleaseboard_database_up {0.0 if database_down else 1.0}\n" in metrics.text, metrics

    for path in DATABASE_APIS:
        answer = console.get(path)
        _no_server_errors(path, answer)
        if database_down:
            assert answer.status == 503 and answer.content_type == "application/json", f"{path}: {answer}"
            assert "database unavailable" in answer.json()["error"], f"{path}: {answer}"
        else:
            assert answer.status == 200, f"{path}: {answer}"
    for path in PAGES:  # anonymous: pages are shells that need neither backend
        answer = console.get(path)
        _no_server_errors(path, answer)
        assert answer.status == 200, f"{path}: {answer}"
    # With a session cookie the page must read the session from the database.
    answer = console.get("/history/", headers={"Cookie": "sessionid=0123456789abcdefghijklmnopqrstuv"})
    _no_server_errors("/history/ with a session", answer)
    if database_down:
        assert answer.status == 503 and "text/html" in answer.content_type, answer
        assert "cannot show this page" in answer.text and "database unavailable" in answer.text, answer
    else:
        assert answer.status == 200, answer
    assert backend in body["error"], body


def _outage(
    console: Console, stop: Callable[[], None], start: Callable[[], None], *, database_down: bool, backend: str
) -> None:
    _healthy(console)
    since = console.log_size()
    stop()
    until_sync(lambda: _down(console), "/metrics to say leaseboard_store_up 0", 30, step=0.2)
    for _ in range(3):  # requests and monitor rounds keep failing: the log must not grow with them
        _degraded(console, database_down=database_down, backend=backend)
    start()
    # The first request of each kind after the server is back succeeds.
    state = console.get("/api/state")
    assert state.status == 200 and state.json()["stale"] is False, state
    assert console.metric("leaseboard_store_up") == 1.0
    for path in DATABASE_APIS:
        answer = console.get(path)
        assert answer.status == 200, f"{path} right after the {backend} came back: {answer}"
    _healthy(console)

    log = console.output(since)
    lines = [line for line in log.splitlines() if BROKE in line or HEALED in line]
    assert [BROKE in line for line in lines] == [True, False], f"one line when it broke, one when it healed:\n{log}"
    assert f"the {backend} stopped answering" in lines[0] and f"the {backend} answers again" in lines[1], lines
    for noise in ("Traceback", "Internal Server Error", "Service Unavailable"):
        assert noise not in log, f"{noise!r} in the log during the outage:\n{log[-4000:]}"


def _restart_unnoticed(console: Console, stop: Callable[[], None], start: Callable[[], None]) -> None:
    """The server restarts between two requests: the connections kept from before are broken, and
    the next request still succeeds."""
    _healthy(console)
    stop()
    start()
    state = console.get("/api/state")
    assert state.status == 200 and state.json()["stale"] is False, state
    for path in DATABASE_APIS:
        answer = console.get(path)
        assert answer.status == 200, f"{path} right after a restart: {answer}"
    assert console.metric("leaseboard_store_up") == 1.0


# --- PostgreSQL: the database and the SQL store ----------------------------------------------------


@pytest.fixture
def on_postgres(var: Path, postgres: Postgres) -> Iterator[Console]:
    yield from _console(var, DATABASE_URL=postgres.url, LEASEBOARD_STORE="sql")


def test_postgresql_stopped_immediately_degrades_the_console_and_it_heals_on_the_first_request(
    on_postgres: Console, postgres: Postgres
) -> None:
    # kill(): SIGQUIT to the postmaster, what `pg_ctl stop -m immediate` sends.
    _outage(on_postgres, postgres.kill, postgres.start, database_down=True, backend="database")


def test_a_postgresql_restart_between_two_requests_costs_no_failed_request(
    on_postgres: Console, postgres: Postgres
) -> None:
    _restart_unnoticed(on_postgres, postgres.kill, postgres.start)


# --- Redis as the ownership store (the database stays up) --------------------------------------


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = start_redis()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def on_redis(var: Path, redis: RedisServer) -> Iterator[Console]:
    yield from _console(var, REDIS_URL=redis.url, LEASEBOARD_STORE="redis")


def test_redis_stopped_degrades_the_console_and_it_heals_on_the_first_request(
    on_redis: Console, redis: RedisServer
) -> None:
    _outage(on_redis, redis.kill, redis.start, database_down=False, backend="store")


# --- Azurite as the ownership store -------------------------------------------------------------


@pytest.fixture
def azurite() -> Iterator[Azurite]:
    server = start_azurite()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def on_azurite(var: Path, azurite: Azurite) -> Iterator[Console]:
    yield from _console(
        var,
        AZURE_STORAGE_CONNECTION_STRING=azurite.connection_string,
        LEASEBOARD_STORE="blob",
        LEASEBOARD_BLOB_CONTAINER="outages",
    )


def test_azurite_stopped_degrades_the_console_and_it_heals_on_the_first_request(
    on_azurite: Console, azurite: Azurite
) -> None:
    _outage(on_azurite, azurite.kill, azurite.start, database_down=False, backend="store")


def test_an_azurite_restart_between_two_requests_costs_no_failed_request(on_azurite: Console, azurite: Azurite) -> None:
    _restart_unnoticed(on_azurite, azurite.kill, azurite.start)
