"""``/ws/pipeline/`` through the real ASGI application (origin check, auth stack, read rule, routing):
alerts raised by either path arrive once, a wake-up beats the poll, the database may go away."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import LazySettings
from django.contrib.auth.models import User
from django.db import OperationalError, transaction

from dashboard.asgi import application
from dashboard.live.health import health
from dashboard.web import pipeline_feed, pipeline_tail
from workers import alerts
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = [(b"origin", b"http://127.0.0.1:8000")]
HUB = "sensors"  # the configured hub (the ``ref`` fixture)
Json = dict[str, Any]


@pytest.fixture(autouse=True)
def _console(stores: Stores, hub: EmbeddedHub) -> None:
    """The configured hub and store the ASGI application's monitor reads (``asgi.SampleConfiguredHub``)."""


def row(sequence: int, partition: str = "0", age: float = 0.3, kind: str = alerts.SMOKE) -> Json:
    """An alert of ``alerts.alert_rows``'s shape, its event enqueued ``age`` seconds ago."""
    enqueued = datetime.now(UTC) - timedelta(seconds=age)
    return {
        "partition_id": partition,
        "sequence_number": sequence,
        "home": f"home-{sequence:05d}",
        "kind": kind,
        "sensor": kind,
        "sensor_id": f"{kind}-1",
        "event": "detected",
        "event_time": enqueued,
        "enqueued_time": enqueued,
    }


def _insert(rows: list[Json], raised_by: str, raised_at: datetime | None) -> list[Json]:
    with transaction.atomic():
        return alerts.insert(
            HUB,
            rows,
            raised_by=raised_by,
            raised_at=raised_at or datetime.now(UTC),
            batch_id=None if raised_by == "landing" else 1,
        )


async def raise_alerts(rows: list[Json], raised_by: str = "landing", raised_at: datetime | None = None) -> list[Json]:
    """``workers.alerts.insert`` as the landing's writer or the pipeline calls it; the rows that were new."""
    fresh: list[Json] = await database_sync_to_async(_insert)(rows, raised_by, raised_at)
    return fresh


def keys(messages: list[Json]) -> list[tuple[str, int]]:
    """(partition, sequence number) of every alert the ``alerts`` messages carried, in order."""
    return [(a["partition_id"], a["sequence_number"]) for m in messages if m["type"] == "alerts" for a in m["alerts"]]


async def receive_until(
    ws: WebsocketCommunicator, done: Callable[[list[Json]], bool], timeout: float = 5.0
) -> list[Json]:
    """Messages received until ``done(all of them)``; fails after ``timeout`` seconds (a communicator
    that times out cancels the application: only for conditions a message brings about)."""
    received: list[Json] = []
    deadline = time.monotonic() + timeout
    while not done(received):
        try:
            received.append(await ws.receive_json_from(timeout=max(deadline - time.monotonic(), 0.01)))
        except TimeoutError:
            raise AssertionError(f"not done in {timeout}s: {[m['type'] for m in received]} {keys(received)}") from None
    return received


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait, polling, until ``condition()``; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {timeout}s"
        await asyncio.sleep(0.02)


def has(*wanted: tuple[str, int]) -> Callable[[list[Json]], bool]:
    return lambda messages: set(wanted) <= set(keys(messages))


def typed(kind: str, count: int = 1) -> Callable[[list[Json]], bool]:
    return lambda messages: sum(m["type"] == kind for m in messages) >= count


async def opened(query: str = "", user: Any = None) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, f"/ws/pipeline/{query}", headers=ORIGIN)
    if user is not None:
        communicator.scope["user"] = user
    connected, _ = await communicator.connect()
    assert connected
    return communicator


@pytest.fixture
async def ws() -> AsyncIterator[WebsocketCommunicator]:
    """A socket past its snapshot."""
    communicator = await opened()
    try:
        await receive_until(communicator, typed("snapshot"))
        yield communicator
    finally:
        await communicator.disconnect()
    assert pipeline_tail.running() == 0 and pipeline_feed.open_sockets() == 0


async def test_the_snapshot_holds_the_newest_alerts_by_event_time_and_the_latency() -> None:
    await raise_alerts([row(i, str(i % 4), age=100 - i) for i in range(25)])
    await raise_alerts([row(0, "0", age=1)], raised_by="pipeline")  # the same event again: no new alert
    communicator = await opened("?hub=sensors")
    try:
        snapshot = await communicator.receive_json_from(timeout=5)
    finally:
        await communicator.disconnect()

    assert snapshot["type"] == "snapshot" and snapshot["hub"] == HUB
    assert [a["sequence_number"] for a in snapshot["alerts"]] == list(range(24, 4, -1))
    assert {a["raised_by"] for a in snapshot["alerts"]} == {"landing"}
    figures = snapshot["latency"]
    assert figures["window_seconds"] == 60 and figures["alerts"]["count"] == 25
    assert 76 <= figures["alerts"]["p50"] <= 90 and figures["aggregates"]["p50"] is None


async def test_an_alert_is_sent_once_whichever_path_raises_it_and_however_often_it_is_read(
    ws: WebsocketCommunicator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline_tail, "LATENCY_EVERY", 0.3)  # a latency message per read or two
    [first] = await raise_alerts([row(1)])
    seen = await receive_until(ws, has(("0", 1)))
    assert first["raised_by"] == "landing"

    assert await raise_alerts([row(1)], raised_by="pipeline") == []  # the pipeline finds it raised
    await asyncio.to_thread(alerts.notify, HUB)
    # Each latency message comes after another read, and every read within SETTLE returns alert 1 again.
    seen += await receive_until(ws, typed("latency", 3))
    [other] = await raise_alerts([row(2, "3")], raised_by="pipeline")
    seen += await receive_until(ws, has(("3", 2)))

    assert keys(seen) == [("0", 1), ("3", 2)]
    assert other["raised_by"] == "pipeline"


async def test_a_read_takes_the_whole_rows_only_of_alerts_the_tail_has_not_handed_out(
    ws: WebsocketCommunicator, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[list[tuple[str, int]]] = []
    real = pipeline_tail.raised_since

    def counted(hub: str, since: float | None, limit: int = pipeline_tail.READ_LIMIT, known: Any = None) -> list[Json]:
        rows = real(hub, since, limit, known)
        handed.append([(r["partition_id"], r["sequence_number"]) for r in rows])
        return rows

    monkeypatch.setattr(pipeline_tail, "raised_since", counted)
    await raise_alerts([row(1), row(2)])
    await receive_until(ws, has(("0", 1)))
    await until(lambda: len(handed) >= 4, "three more reads")  # within SETTLE: each sees both keys again
    [one] = await raise_alerts([row(3)])
    await receive_until(ws, has(("0", 3)))
    whole = [key for read in handed for key in read]
    assert sorted(whole) == [("0", 1), ("0", 2), ("0", 3)], handed  # each alert's row read once
    assert one["sequence_number"] == 3


async def test_alerts_committed_late_are_sent_and_oldest_raised_come_first(ws: WebsocketCommunicator) -> None:
    now = datetime.now(UTC)
    await raise_alerts([row(1)], raised_at=now)
    seen = await receive_until(ws, has(("0", 1)))
    # Raised (by a writer's clock) before the alert already sent, committed after it: within SETTLE.
    await raise_alerts([row(7, "2"), row(8, "1")], raised_at=now - timedelta(seconds=3))
    await raise_alerts([row(9, "2")], raised_at=now - timedelta(seconds=1))
    seen += await receive_until(ws, has(("2", 7), ("1", 8), ("2", 9)))

    assert sorted(keys(seen)) == [("0", 1), ("1", 8), ("2", 7), ("2", 9)]
    late = [m["alerts"] for m in seen if m["type"] == "alerts" and len(m["alerts"]) > 1]
    for batch in late:
        assert [a["raised_at"] for a in batch] == sorted(a["raised_at"] for a in batch)


async def test_a_wake_up_sends_the_alert_before_the_poll_would(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline_tail, "POLL_EVERY", 60.0)  # only a wake-up can find it in time
    communicator = await opened()
    try:
        # The snapshot was read after the tail's first read (one database thread, in order): the
        # tail now waits for a wake-up.
        await receive_until(communicator, typed("snapshot"))
        await raise_alerts([row(5, "1", kind=alerts.GLASS_BREAK)])
        started = time.monotonic()
        # What the landing's writer sends after its insert (``alerts.notify``, through Redis across
        # processes: tests/redis/test_alert_wake.py), here through the in-process layer.
        assert not await asyncio.to_thread(alerts.notify, HUB), "the in-memory layer is not used from a thread"
        message = {"type": alerts.MESSAGE_TYPE, "hub": HUB}
        await get_channel_layer().group_send(alerts.group_name(HUB), message)
        messages = await receive_until(communicator, has(("1", 5)), timeout=5.0)
        [sent] = [a for m in messages if m["type"] == "alerts" for a in m["alerts"]]
        assert sent["kind"] == alerts.GLASS_BREAK and sent["raised_by"] == "landing"
        assert time.monotonic() - started < 5.0
    finally:
        await communicator.disconnect()


async def test_anonymous_readers_are_refused_when_anonymous_reading_is_off(settings: LazySettings) -> None:
    settings.LEASEBOARD_ANONYMOUS_READ = False
    communicator = await opened()
    message = await communicator.receive_json_from(timeout=5)
    closed = await communicator.receive_output(timeout=5)
    assert message["type"] == "error" and "log in" in message["error"]
    assert closed == {"type": "websocket.close", "code": 4401}

    user = await database_sync_to_async(User.objects.create_user)("reader", password="pw-reader-1")
    signed_in = await opened(user=user)
    try:
        assert (await signed_in.receive_json_from(timeout=5))["type"] == "snapshot"
    finally:
        await signed_in.disconnect()


async def test_a_bad_hub_name_is_refused() -> None:
    communicator = await opened("?hub=../etc")
    message = await communicator.receive_json_from(timeout=5)
    closed = await communicator.receive_output(timeout=5)
    assert message["type"] == "error" and "hub must be" in message["error"]
    assert closed == {"type": "websocket.close", "code": 4400}


async def test_the_socket_is_read_only(ws: WebsocketCommunicator) -> None:
    await ws.send_json_to({"action": "drain"})
    answer = await receive_until(ws, typed("error"))
    assert answer[-1]["code"] == "read_only"


async def test_a_database_that_is_down_is_said_once_and_the_feed_goes_on(
    ws: WebsocketCommunicator, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = pipeline_tail.raised_since
    failed = 0
    down = True

    def flaky(hub: str, since: float | None, limit: int = pipeline_tail.READ_LIMIT, known: Any = None) -> list[Json]:
        nonlocal failed
        if down:
            failed += 1
            raise OperationalError("connection refused")
        return real(hub, since, limit, known)

    monkeypatch.setattr(pipeline_tail, "raised_since", flaky)
    try:
        await until(lambda: failed >= 6, "six failed rounds")
        down = False
        await raise_alerts([row(3, "2")])
        seen = await receive_until(ws, has(("2", 3)), timeout=10.0)
    finally:
        health.reset()

    errors = [m for m in seen if m["type"] == "error"]
    assert len(errors) == 1 and "database unavailable" in errors[0]["error"], seen
    assert keys(seen) == [("2", 3)]


async def test_a_socket_opened_while_the_database_is_down_gets_its_snapshot_once_it_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = pipeline_tail.first_read
    failed = 0

    def refused(hub: str, count: int = pipeline_tail.SNAPSHOT) -> pipeline_tail.First:
        nonlocal failed
        failed += 1
        raise OperationalError("the database system is starting up")

    monkeypatch.setattr(pipeline_feed, "first_read", refused)
    monkeypatch.setattr(pipeline_feed, "RETRY_EVERY", 0.05)
    await raise_alerts([row(6, "1")])
    communicator = await opened()
    try:
        await until(lambda: failed >= 4, "four failed snapshots")
        monkeypatch.setattr(pipeline_feed, "first_read", real)
        seen = await receive_until(communicator, typed("snapshot"))
    finally:
        await communicator.disconnect()
        health.reset()

    assert [m["type"] for m in seen] == ["error", "snapshot"]
    assert "database unavailable" in seen[0]["error"]
    assert [a["sequence_number"] for a in seen[1]["alerts"]] == [6]


async def test_closing_stops_the_tail_and_a_later_socket_starts_it_again() -> None:
    first = await opened()
    second = await opened()
    await receive_until(first, typed("snapshot"))
    await receive_until(second, typed("snapshot"))
    assert pipeline_tail.running() == 1 and pipeline_feed.open_sockets() == 2
    await first.disconnect()
    assert pipeline_tail.running() == 1
    await raise_alerts([row(4)])
    await receive_until(second, has(("0", 4)))
    await second.disconnect()
    assert pipeline_tail.running() == 0 and pipeline_feed.open_sockets() == 0

    again = await opened()
    try:
        snapshot = (await receive_until(again, typed("snapshot")))[-1]
        assert [a["sequence_number"] for a in snapshot["alerts"]] == [4]
        assert pipeline_tail.running() == 1
    finally:
        await again.disconnect()


def alert_json(partition: str, sequence: int, raised: float) -> Json:
    return {"partition_id": partition, "sequence_number": sequence, "raised_at": raised}


def test_a_socket_forgets_the_keys_no_read_can_return_again() -> None:
    first = pipeline_tail.First(alerts=[], latency={}, floor=95.0, seen={("0", 1): 99.0})
    sent = pipeline_tail.Sent(first)

    assert sent.fresh(94.0, [alert_json("0", 0, 94.5), alert_json("0", 1, 99.0), alert_json("1", 1, 100.0)]) == [
        alert_json("1", 1, 100.0)  # 0/0 was raised before the socket's floor (history), 0/1 was seen
    ]
    assert sent.fresh(99.5, [alert_json("1", 1, 100.0), alert_json("2", 5, 99.6)]) == [alert_json("2", 5, 99.6)]
    assert set(sent.keys) == {("1", 1), ("2", 5)}  # 0/1 (raised at 99) is below every later read


def test_the_keys_a_socket_keeps_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline_tail, "KEYS_KEPT", 10)
    sent = pipeline_tail.Sent(pipeline_tail.First(alerts=[], latency={}, floor=None, seen={}))
    rows = [alert_json("0", i, float(i)) for i in range(25)]
    assert sent.fresh(None, rows) == rows
    assert len(sent.keys) <= 10 and sent.floor is not None
    assert sent.fresh(None, rows) == []  # still none sent twice
