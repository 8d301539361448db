"""``dashboard.live.broadcast``: the row is saved whatever happens to the channel-layer message."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from balancer.model import HubRef
from dashboard.live import broadcast
from dashboard.live.broadcast import GROUP, apublish, publish
from dashboard.models import EventLog
from tests.support.servers import free_port

from .conftest import event

pytestmark = pytest.mark.django_db(transaction=True)


def test_publish_saves_a_row_and_returns_its_json(ref: HubRef) -> None:
    payload = publish(event(ref, "2", owner="w7"))

    row = EventLog.objects.get(id=payload["id"])
    assert (row.partition_id, row.owner_id, row.kind) == ("2", "w7", "claim")
    assert payload == row.as_json()


def test_publish_works_from_any_thread(ref: HubRef) -> None:
    results: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda i=i: results.append(publish(event(ref, str(i))))) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    assert sorted(r["partition_id"] for r in results) == ["0", "1", "2", "3"]
    assert EventLog.objects.count() == 4


async def test_publish_called_on_an_event_loop_does_not_raise(ref: HubRef) -> None:
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(GROUP, channel)
    try:
        payload = publish(event(ref, "1"))  # what a coordinator's sync on_event would do
        message = await layer.receive(channel)
    finally:
        await layer.group_discard(GROUP, channel)

    assert message == {"type": "balancer.event", "event": payload}
    assert await database_sync_to_async(EventLog.objects.filter(id=payload["id"]).exists)()


async def test_apublish_sends_the_saved_row_to_the_group(ref: HubRef) -> None:
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(GROUP, channel)
    try:
        payload = await apublish(event(ref, "3"))
        message = await layer.receive(channel)
    finally:
        await layer.group_discard(GROUP, channel)

    assert message["type"] == "balancer.event" and message["event"]["id"] == payload["id"]


@pytest.fixture
def unreachable_redis_layer(settings: Any) -> None:
    # A real Redis channel layer pointed at a port nobody listens on.
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [f"redis://127.0.0.1:{free_port()}/0"]},
        }
    }


@pytest.fixture(autouse=True)
def layer_working() -> None:
    broadcast._layer.failures = 0  # as at start: a failure before this test's own is news to log


@pytest.mark.usefixtures("unreachable_redis_layer")
def test_a_channel_layer_outage_is_logged_once_not_per_event(ref: HubRef, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="dashboard.live.broadcast"):
        for n in "012":
            publish(event(ref, n))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "not sent to the channel layer" in warnings[0]
    assert EventLog.objects.count() == 3 and broadcast._layer.failures == 3


def test_a_channel_layer_back_from_an_outage_is_logged_once(ref: HubRef, caplog: pytest.LogCaptureFixture) -> None:
    broadcast._layer.failures = 4  # an outage that refused four events
    with caplog.at_level(logging.WARNING, logger="dashboard.live.broadcast"):
        publish(event(ref, "0"))
        publish(event(ref, "1"))
    assert [r.getMessage() for r in caplog.records] == [
        "balancer events reach the channel layer again (4 were not sent; saved all the same)"
    ]
    assert broadcast._layer.failures == 0


@pytest.mark.usefixtures("unreachable_redis_layer")
def test_a_failing_channel_layer_is_logged_and_the_row_kept(ref: HubRef, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dashboard.live.broadcast"):
        payload = publish(event(ref, "0"))

    assert EventLog.objects.filter(id=payload["id"]).exists()
    assert "not sent to the channel layer" in caplog.text


@pytest.mark.usefixtures("unreachable_redis_layer")
async def test_apublish_with_a_failing_channel_layer_does_not_raise(ref: HubRef) -> None:
    payload = await apublish(event(ref, "0"))

    assert await database_sync_to_async(EventLog.objects.filter(id=payload["id"]).exists)()
