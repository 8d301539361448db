"""``/ws/balancer/`` through the real ASGI application (origin check, auth stack, routing)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from balancer.model import HubRef
from dashboard.asgi import application
from dashboard.broadcast import apublish
from dashboard.models import EventLog
from workers.bootstrap import Stores
from workers.hub import EmbeddedHub

from .conftest import coordinator, event

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = [(b"origin", b"http://127.0.0.1:8000")]


async def receive_until(
    ws: WebsocketCommunicator, wanted: str, timeout: float = 5.0
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The next message of type ``wanted``, and every message received before it."""
    before = []
    while True:
        message: dict[str, Any] = await ws.receive_json_from(timeout=timeout)
        if message["type"] == wanted:
            return message, before
        before.append(message)


async def events_until(ws: WebsocketCommunicator, wanted: int, timeout: float = 10.0) -> list[int]:
    """Ids of the events received until (and with) event ``wanted``; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    received: list[int] = []
    while wanted not in received:
        assert time.monotonic() < deadline, f"event {wanted} not received in {timeout}s (got {received})"
        message = await ws.receive_json_from(timeout=timeout)
        received += event_ids([message])
    return received


def event_ids(messages: list[dict[str, Any]]) -> list[int]:
    return [e["id"] for m in messages if m["type"] == "events" for e in m["events"]]


@pytest.fixture
async def ws(stores: Stores, hub: EmbeddedHub) -> AsyncIterator[WebsocketCommunicator]:
    communicator = WebsocketCommunicator(application, "/ws/balancer/", headers=ORIGIN)
    connected, _ = await communicator.connect()
    assert connected
    try:
        yield communicator
    finally:
        await communicator.disconnect()


async def test_connecting_sends_a_snapshot_then_the_recent_history(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    earlier = await apublish(event(ref, "1"))
    communicator = WebsocketCommunicator(application, "/ws/balancer/", headers=ORIGIN)
    connected, _ = await communicator.connect()
    assert connected
    try:
        first = await communicator.receive_json_from(timeout=5)
        second = await communicator.receive_json_from(timeout=5)
    finally:
        await communicator.disconnect()

    assert first["type"] == "snapshot"
    assert first["state"]["hub"] == ref.hub and len(first["state"]["partitions"]) == 4
    assert first["state"]["last_event_id"] == earlier["id"]
    assert second == {"type": "history", "events": [earlier]}


async def test_a_published_event_arrives_once_and_in_order(ws: WebsocketCommunicator, ref: HubRef) -> None:
    await receive_until(ws, "history")

    published = [await apublish(event(ref, str(i))) for i in range(3)]
    # Both paths deliver (the group message and the poll): wait for two snapshots to pass, each
    # sent after a flush of the log, and count.
    _, seen = await receive_until(ws, "snapshot")
    _, more = await receive_until(ws, "snapshot")

    assert event_ids(seen + more) == [p["id"] for p in published]


async def test_events_another_process_wrote_arrive_by_polling(ws: WebsocketCommunicator, ref: HubRef) -> None:
    await receive_until(ws, "history")

    # What a runworkers process without Redis does: a row, and no message this process can see.
    row = EventLog.from_domain(event(ref, "2", owner="w-remote"))
    await database_sync_to_async(row.save)()
    message, _ = await receive_until(ws, "events")

    assert [e["id"] for e in message["events"]] == [row.id]
    assert message["events"][0]["owner_id"] == "w-remote"


async def test_a_row_committed_after_a_higher_id_was_sent_still_arrives_once(
    ws: WebsocketCommunicator, ref: HubRef
) -> None:
    await receive_until(ws, "history")
    first = await apublish(event(ref, "0"))
    # PostgreSQL hands out ids before commit: id first+1 belongs to a slow transaction that
    # commits only after id first+2 has been sent to the page.
    slow_id, quick_id = first["id"] + 1, first["id"] + 2
    quick = EventLog.from_domain(event(ref, "2"))
    quick.id = quick_id
    await database_sync_to_async(quick.save)()
    received = await events_until(ws, quick_id)

    slow = EventLog.from_domain(event(ref, "1"))
    slow.id = slow_id
    await database_sync_to_async(slow.save)()
    received += await events_until(ws, slow_id)
    _, rest = await receive_until(ws, "snapshot")
    _, more = await receive_until(ws, "snapshot")
    received += event_ids(rest + more)

    assert sorted(received) == [first["id"], slow_id, quick_id]


async def test_events_of_other_hubs_are_not_sent(ws: WebsocketCommunicator, ref: HubRef) -> None:
    await receive_until(ws, "history")

    await apublish(event(HubRef(ref.namespace, "doorbells", ref.consumer_group), "0"))
    mine = await apublish(event(ref, "0"))
    message, before = await receive_until(ws, "events")

    assert event_ids([*before, message]) == [mine["id"]]


async def test_a_later_snapshot_shows_a_claim(ws: WebsocketCommunicator, stores: Stores, ref: HubRef) -> None:
    first, _ = await receive_until(ws, "snapshot")
    assert all(p["owner"] is None for p in first["state"]["partitions"])

    await coordinator(stores, ref, "w1", partitions=1).cycle()

    for _ in range(10):
        snapshot, _ = await receive_until(ws, "snapshot")
        if snapshot["state"]["partitions"][0]["owner"] == "w1":
            break
    assert snapshot["state"]["partitions"][0]["owner"] == "w1"
    assert snapshot["state"]["workers"][0]["id"] == "w1"


async def test_a_bad_consumer_group_is_refused_with_4400(stores: Stores) -> None:
    communicator = WebsocketCommunicator(application, "/ws/balancer/?consumer_group=no%20spaces", headers=ORIGIN)
    connected, _ = await communicator.connect()
    assert connected
    message = await communicator.receive_json_from(timeout=5)
    closed = await communicator.receive_output(timeout=5)

    assert message["type"] == "error" and "consumer_group" in message["error"]
    assert closed["type"] == "websocket.close" and closed["code"] == 4400


async def test_a_foreign_origin_is_refused(stores: Stores) -> None:
    communicator = WebsocketCommunicator(application, "/ws/balancer/", headers=[(b"origin", b"https://evil.example")])
    connected, _ = await communicator.connect()

    assert not connected
