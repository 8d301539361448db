"""``/ws/balancer/`` through the real ASGI application (origin check, auth stack, routing)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import LazySettings
from django.contrib.auth.models import User

from balancer.model import ControlKind, HubRef
from dashboard.asgi import application
from dashboard.control.audit import recent_audit
from dashboard.live import delta, monitor
from dashboard.live.broadcast import apublish
from dashboard.models import AuditEntry, EventLog
from dashboard.web import consumers, feed
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

from .conftest import coordinator, event

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = [(b"origin", b"http://127.0.0.1:8000")]


@pytest.fixture(autouse=True)
def fast_monitor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(monitor, "ROUND_SECONDS", 0.2)


async def receive_until(
    ws: WebsocketCommunicator, wanted: str, timeout: float = 5.0
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The next message of type ``wanted``, and every message received before it."""
    before: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"no {wanted!r} message in {timeout}s (got {[m['type'] for m in before]})"
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


async def opened(path: str = "/ws/balancer/", user: Any = None) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, path, headers=ORIGIN)
    if user is not None:
        communicator.scope["user"] = user  # what the session middleware finds for a logged-in browser
    connected, _ = await communicator.connect()
    assert connected
    return communicator


@pytest.fixture
async def ws(stores: Stores, hub: EmbeddedHub) -> AsyncIterator[WebsocketCommunicator]:
    communicator = await opened()
    try:
        await receive_until(communicator, "audit")
        yield communicator
    finally:
        await communicator.disconnect()


async def test_connecting_sends_a_snapshot_the_recent_history_and_the_audit_log(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    earlier = await apublish(event(ref, "1"))
    communicator = await opened()
    try:
        first = await communicator.receive_json_from(timeout=5)
        second = await communicator.receive_json_from(timeout=5)
        third = await communicator.receive_json_from(timeout=5)
    finally:
        await communicator.disconnect()

    assert first["type"] == "snapshot"
    assert first["state"]["hub"] == ref.hub and len(first["state"]["partitions"]) == 4
    assert first["state"]["last_event_id"] == earlier["id"]
    assert {"lag_seconds", "lag_status", "events_per_second"} <= set(first["state"]["partitions"][0])
    assert second == {"type": "history", "events": [earlier]}
    assert third == {"type": "audit", "entries": []}


async def test_a_published_event_arrives_once_and_in_order(ws: WebsocketCommunicator, ref: HubRef) -> None:
    published = [await apublish(event(ref, str(i))) for i in range(3)]
    # Both paths deliver (the group message and the poll): wait for two deltas to pass, each sent
    # after a flush of the log, and count.
    _, seen = await receive_until(ws, "delta")
    _, more = await receive_until(ws, "delta")

    assert event_ids(seen + more) == [p["id"] for p in published]


async def test_events_another_process_wrote_arrive_by_polling(ws: WebsocketCommunicator, ref: HubRef) -> None:
    # What a runworkers process without Redis does: a row, and no message this process can see.
    row = EventLog.from_domain(event(ref, "2", owner="w-remote"))
    await database_sync_to_async(row.save)()
    message, _ = await receive_until(ws, "events")

    assert [e["id"] for e in message["events"]] == [row.id]
    assert message["events"][0]["owner_id"] == "w-remote"


async def test_a_row_committed_after_a_higher_id_was_sent_still_arrives_once(
    ws: WebsocketCommunicator, ref: HubRef
) -> None:
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
    _, rest = await receive_until(ws, "delta")
    _, more = await receive_until(ws, "delta")
    received += event_ids(rest + more)

    assert sorted(received) == [first["id"], slow_id, quick_id]


async def test_idle_sockets_share_one_reader_of_the_event_log_and_each_still_gets_every_event(
    stores: Stores, hub: EmbeddedHub, ref: HubRef, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 37: 500 idle sockets read the log 1,000 times a second. Now one feed per hub reads it;
    # a socket reads it once, to catch up when it joins.
    calls: list[float] = []
    real = feed.unsent

    def counted(*args: Any) -> list[dict[str, Any]]:
        calls.append(time.monotonic())
        return real(*args)

    monkeypatch.setattr(feed, "unsent", counted)
    monkeypatch.setattr(consumers, "unsent", counted)
    sockets = [await opened() for _ in range(10)]
    try:
        for socket in sockets:
            await receive_until(socket, "audit")
        assert feed.running() == 1
        # The window opens after each socket's one catch-up read (just after its audit message).
        idle, started = 2.0, time.monotonic() + 0.5
        while time.monotonic() - started < idle:
            await asyncio.sleep(0.1)
        # One read per monitor round (the sockets sending its delta share it) and per POLL_EVERY, not
        # per socket: ten sockets read it 200 times in these two seconds before the feed.
        reads = sum(1 for at in calls if started <= at < started + idle)
        assert reads <= idle * (1 / monitor.ROUND_SECONDS + 1 / feed.POLL_EVERY) + 2, reads
        row = EventLog.from_domain(event(ref, "2", owner="w-remote"))  # another process's row: no message
        await database_sync_to_async(row.save)()
        for socket in sockets:
            assert row.id in await events_until(socket, row.id)
        late = await opened()  # joins after the feed read the row: catches up on its own
        try:
            _, before = await receive_until(late, "audit")
            snapshot = next(m for m in before if m["type"] == "snapshot")
            if snapshot["state"]["last_event_id"] < row.id:  # the monitor had not seen it yet
                assert row.id in await events_until(late, row.id)
        finally:
            await late.disconnect()
    finally:
        for socket in sockets:
            await socket.disconnect()
    assert feed.running() == 0


async def test_a_new_audit_entry_reaches_every_socket_from_one_shared_read(
    stores: Stores, hub: EmbeddedHub, ref: HubRef, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[float] = []
    real = recent_audit

    def counted(*args: Any) -> list[dict[str, Any]]:
        reads.append(time.monotonic())
        return real(*args)

    monkeypatch.setattr(feed, "recent_audit", counted)
    monkeypatch.setattr(consumers, "recent_audit", counted)  # each socket's first read, when it joins
    sockets = [await opened() for _ in range(5)]
    try:
        for socket in sockets:
            await receive_until(socket, "audit")
        entry = AuditEntry(**AuditEntry.scope(ref), at=time.time(), user="ops", action="drain", target="w-1")
        entry.reason, entry.outcome = "maintenance", AuditEntry.APPLIED
        await database_sync_to_async(entry.save)()
        written = time.monotonic()
        for socket in sockets:
            message, _ = await receive_until(socket, "audit")
            assert [e["id"] for e in message["entries"]] == [entry.id]
        # one read per monitor round for every socket, not one per socket
        rounds = (time.monotonic() - written) / monitor.ROUND_SECONDS + 2
        assert sum(1 for at in reads if at >= written) <= rounds
    finally:
        for socket in sockets:
            await socket.disconnect()


async def test_events_of_other_hubs_are_not_sent(ws: WebsocketCommunicator, ref: HubRef) -> None:
    await apublish(event(HubRef(ref.namespace, "doorbells", ref.consumer_group), "0"))
    mine = await apublish(event(ref, "0"))
    message, before = await receive_until(ws, "events")

    assert event_ids([*before, message]) == [mine["id"]]


async def test_deltas_carry_only_what_changed_and_rebuild_the_state(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    communicator = await opened()
    try:
        snapshot, _ = await receive_until(communicator, "snapshot")
        state = snapshot["state"]
        assert all(p["owner"] is None for p in state["partitions"])

        await coordinator(stores, ref, "w1", partitions=1).cycle()
        for _ in range(20):
            message, _ = await receive_until(communicator, "delta")
            state = delta.apply(state, message)
            if state["partitions"][0]["owner"] == "w1":
                break
    finally:
        await communicator.disconnect()

    assert state["partitions"][0]["owner"] == "w1" and state["partitions"][0]["status"] == "owned"
    assert [w["id"] for w in state["workers"]] == ["w1"]
    changed = next(p for p in message["partitions"] if p["id"] == "0")
    assert "owner" in changed and "last_enqueued_sequence_number" not in changed  # fields, not whole partitions
    assert [p["id"] for p in message["partitions"]] == ["0"]  # the untouched partitions are not sent


async def test_the_socket_refuses_any_action_even_from_staff(stores: Stores, hub: EmbeddedHub, ref: HubRef) -> None:
    staff = await database_sync_to_async(User.objects.create_user)("ops", password="x", is_staff=True)
    for user in (None, staff):
        communicator = await opened(user=user)
        try:
            await receive_until(communicator, "audit")
            await communicator.send_json_to({"action": "drain", "target": "w1", "reason": "over the socket"})
            refusal, _ = await receive_until(communicator, "error")
        finally:
            await communicator.disconnect()
        assert refusal["code"] == "read_only" and "staff login" in refusal["error"]
    controls = await stores.controls.list_controls(ref)
    assert not [c for c in controls if c.kind is ControlKind.DRAIN]


async def test_anonymous_sockets_are_closed_with_4401_when_anonymous_reading_is_off(
    settings: LazySettings, stores: Stores, hub: EmbeddedHub
) -> None:
    settings.LEASEBOARD_ANONYMOUS_READ = False
    anonymous = await opened()
    message = await anonymous.receive_json_from(timeout=5)
    closed = await anonymous.receive_output(timeout=5)

    assert message["type"] == "error" and "log in" in message["error"]
    assert closed["type"] == "websocket.close" and closed["code"] == 4401

    user = await database_sync_to_async(User.objects.create_user)("viewer", password="x")
    logged_in = await opened(user=user)
    try:
        first = await logged_in.receive_json_from(timeout=5)
    finally:
        await logged_in.disconnect()
    assert first["type"] == "snapshot"


async def test_a_bad_consumer_group_is_refused_with_4400(stores: Stores) -> None:
    communicator = await opened("/ws/balancer/?consumer_group=no%20spaces")
    message = await communicator.receive_json_from(timeout=5)
    closed = await communicator.receive_output(timeout=5)

    assert message["type"] == "error" and "consumer_group" in message["error"]
    assert closed["type"] == "websocket.close" and closed["code"] == 4400


async def test_a_foreign_origin_is_refused(stores: Stores) -> None:
    communicator = WebsocketCommunicator(application, "/ws/balancer/", headers=[(b"origin", b"https://evil.example")])
    connected, _ = await communicator.connect()

    assert not connected
