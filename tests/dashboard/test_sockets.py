"""The console's websockets shared fairly (issue 37, item 3; ``dashboard/web/sockets.py``): a cap per
client, and a tenth of the seats kept for signed-in users, so one anonymous client cannot take every
socket and an operator always gets a live view. Every seat is given back when its socket ends."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import LazySettings
from django.contrib.auth.models import User
from django.test import Client

from dashboard.asgi import application
from dashboard.web import consumers
from dashboard.web.sockets import SEATS
from tests.support.waiting import until
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

from .test_security_frames import ORIGIN

pytestmark = pytest.mark.django_db(transaction=True)


def socket(address: str, cookie: str = "") -> WebsocketCommunicator:
    headers = ORIGIN + ([(b"cookie", cookie.encode())] if cookie else [])
    ws = WebsocketCommunicator(application, "/ws/balancer/", headers=headers)
    ws.scope["client"] = (address, 50000)  # read when the application first runs, at connect
    return ws


async def opened(ws: WebsocketCommunicator) -> dict[str, Any]:
    """The first message after connecting: the snapshot, or the error of a refused socket (then its close)."""
    connected, _ = await ws.connect(timeout=10)
    assert connected
    first: dict[str, Any] = json.loads((await ws.receive_output(timeout=10))["text"])
    if first["type"] == "error":
        closing = await ws.receive_output(timeout=10)
        assert closing["type"] == "websocket.close"
        first["close"] = closing["code"]
    return first


def signed_in_cookie() -> str:
    User.objects.create_user("ops", password="x", is_staff=True)
    browser = Client()
    browser.login(username="ops", password="x")
    return f"sessionid={browser.cookies['sessionid'].value}"


@pytest.fixture
async def small(settings: LazySettings) -> None:
    """10 seats, 3 per client; none taken (a socket of an earlier test still ending gives its seat back)."""
    settings.LEASEBOARD_SOCKETS_MAX = 10
    settings.LEASEBOARD_SOCKETS_PER_CLIENT = 3
    await until(lambda: SEATS.taken == 0, what="the seats of earlier tests' sockets given back")


async def test_one_client_gets_its_share_and_no_more(stores: Stores, hub: EmbeddedHub, small: None) -> None:
    sockets = [socket("203.0.113.7") for _ in range(4)]
    try:
        answers = [await opened(ws) for ws in sockets]
        other = socket("198.51.100.9")
        sockets.append(other)
        answers.append(await opened(other))
    finally:
        for ws in sockets:
            await ws.disconnect()
    assert [a["type"] for a in answers] == ["snapshot"] * 3 + ["error", "snapshot"]
    assert answers[3]["close"] == consumers.CLOSE_TRY_LATER and "per client" in answers[3]["error"]
    await until(lambda: SEATS.taken == 0, what="every seat given back")


async def test_anonymous_readers_leave_seats_to_signed_in_users(stores: Stores, hub: EmbeddedHub, small: None) -> None:
    cookie = await sync_to_async(signed_in_cookie)()
    sockets = [socket(f"198.51.100.{i}") for i in range(10)]
    try:
        anonymous = [await opened(ws) for ws in sockets]
        operator = socket("198.51.100.200", cookie)
        sockets.append(operator)
        signed_in = await opened(operator)
    finally:
        for ws in sockets:
            await ws.disconnect()
    assert [a["type"] for a in anonymous] == ["snapshot"] * 9 + ["error"]
    assert "signed-in users" in anonymous[9]["error"]
    assert signed_in["type"] == "snapshot"
    await until(lambda: SEATS.taken == 0 and not SEATS.by_client, what="every seat given back")
