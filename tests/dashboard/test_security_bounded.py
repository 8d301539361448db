"""Bounded work per visitor: monitors only for hubs the store knows, at most LEASEBOARD_MONITORS_MAX
of them (least recently used first out), and unknown names answered 404 / close 4404 with nothing
started."""

from __future__ import annotations

import asyncio

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import LazySettings
from django.test import Client

from balancer.model import HubRef, Member
from dashboard.asgi import application
from dashboard.live.host import Full, host
from tests.support.waiting import until
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = [(b"origin", b"http://127.0.0.1:8000")]
DOORS = [
    "/",
    "/events/",
    "/history/",
    "/partitions/0/",
    "/api/state",
    "/api/events",
    "/api/history",
    "/api/audit",
    "/api/partitions/0",
]


def running() -> set[tuple[str, str]]:
    return {(r.hub, r.consumer_group) for r in list(host._monitors)}


async def heartbeat(stores: Stores, ref: HubRef, hub: str, group: str = "$Default") -> HubRef:
    other = HubRef(ref.namespace, hub, group)
    await stores.controls.heartbeat(Member(other, "w1", await stores.ownership.now()))
    return other


@pytest.mark.parametrize("door", DOORS)
def test_an_unknown_hub_or_group_is_a_404_and_starts_nothing(
    client: Client, stores: Stores, hub: EmbeddedHub, door: str
) -> None:
    for query in ({"hub": "nobody-runs-this"}, {"consumer_group": "nor-this"}):
        response = client.get(door, query)
        assert response.status_code == 404, (door, query, response.status_code)
        assert ("nobody-runs-this", "$Default") not in running() and ("sensors", "nor-this") not in running()


async def test_an_unknown_hub_on_the_socket_is_closed_with_4404(stores: Stores, hub: EmbeddedHub) -> None:
    socket = WebsocketCommunicator(application, "/ws/balancer/?hub=nobody-runs-this", headers=ORIGIN)
    connected, _ = await socket.connect()
    assert connected
    message = await socket.receive_json_from(timeout=5)
    closed = await socket.receive_output(timeout=5)

    assert message["type"] == "error" and "nobody-runs-this" in message["error"]
    assert closed == {"type": "websocket.close", "code": 4404}
    assert ("nobody-runs-this", "$Default") not in running()


async def test_a_hub_the_store_knows_gets_a_monitor(
    client: Client, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    other = await heartbeat(stores, ref, "orders")

    response = await asyncio.to_thread(client.get, "/", {"hub": "orders"})

    assert response.status_code == 200
    assert (other.hub, other.consumer_group) in running()


async def test_monitors_are_capped_and_the_least_recently_used_unwatched_one_goes(
    settings: LazySettings, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    settings.LEASEBOARD_MONITORS_MAX = 3
    a, b, c = [await heartbeat(stores, ref, name) for name in ("a", "b", "c")]
    assert await host.admit(a) is not None and await host.admit(b) is not None
    host.monitor(a)  # a is used again: b is now the least recently used
    assert await host.admit(c) is not None  # the third slot: nothing leaves yet

    assert await host.admit(ref) is not None  # the configured hub needs a slot: b goes
    assert {(r.hub) for r in host._monitors} == {"a", "c", ref.hub}
    await until(lambda: "b" not in {r.hub for r in host._tasks}, "the evicted monitor's task to end")


async def test_a_console_whose_every_slot_is_watched_says_so(
    settings: LazySettings, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    settings.LEASEBOARD_MONITORS_MAX = 1
    a = await heartbeat(stores, ref, "a")
    watched = await host.admit(a)
    assert watched is not None
    token = watched.subscribe(lambda: None)
    try:
        with pytest.raises(Full):
            await host.admit(await heartbeat(stores, ref, "b"))
    finally:
        watched.unsubscribe(token)
    assert await host.admit(await heartbeat(stores, ref, "b")) is not None  # no longer watched: a goes
