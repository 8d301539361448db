"""Every frame a client sends to ``/ws/balancer/`` is answered, and nothing the socket started outlives it."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator

from dashboard.asgi import application
from dashboard.live import monitor
from dashboard.web import consumers
from tests.support.waiting import until
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = [(b"origin", b"http://127.0.0.1:8000")]
SOCKETS = 200
KINDS = ("text", "binary", "big", "flood")


@pytest.fixture(autouse=True)
def fast_monitor(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    monkeypatch.setattr(monitor, "ROUND_SECONDS", 0.2)
    settings.LEASEBOARD_SOCKETS_PER_CLIENT = SOCKETS  # every socket here is one test client's (test_sockets.py)


async def answer(ws: WebsocketCommunicator, timeout: float = 10.0) -> dict[str, Any]:
    """The first error message or close, skipping the stream's own messages."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, "no answer to the bad frame"
        output: dict[str, Any] = await ws.receive_output(timeout=left)
        if output["type"] == "websocket.close":
            return output
        message = json.loads(output["text"])
        if message["type"] == "error":
            return dict(message)


async def bad_socket(kind: str) -> tuple[str, dict[str, Any]]:
    ws = WebsocketCommunicator(application, "/ws/balancer/", headers=ORIGIN)
    connected, _ = await ws.connect(timeout=10)
    assert connected
    try:
        if kind == "text":
            await ws.send_to(text_data="this is not {json")
        elif kind == "binary":
            await ws.send_to(bytes_data=b"\x00\xff\xfe")
        elif kind == "big":
            await ws.send_to(text_data=json.dumps({"x": "y" * (consumers.MAX_FRAME + 10)}))
        else:
            for _ in range(consumers.FLOOD_FRAMES + 5):
                await ws.send_to(text_data="{}")
            reply = await answer(ws)
            while reply["type"] != "websocket.close":  # the first frames are refused one by one
                reply = await answer(ws)
            return kind, reply
        return kind, await answer(ws)
    finally:
        await ws.disconnect()


async def settled(condition: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0)  # yields to the loop so cancelled tasks finish; not a wait for time
    return True


async def test_bad_frames_are_answered_and_leave_no_task(stores: Stores, hub: EmbeddedHub) -> None:
    before = len(asyncio.all_tasks())
    assert not consumers._pumps

    replies: list[tuple[str, dict[str, Any]]] = []
    for start in range(0, SOCKETS, 50):
        async with asyncio.timeout(120):  # a hang fails here rather than at the suite's timeout
            replies += await asyncio.gather(*(bad_socket(KINDS[i % len(KINDS)]) for i in range(start, start + 50)))

    for kind, reply in replies:
        if kind in ("text", "binary"):
            assert reply["type"] == "error" and reply["code"] == "bad_frame", reply
        elif kind == "big":
            assert reply == {"type": "websocket.close", "code": consumers.CLOSE_TOO_BIG, "reason": reply["reason"]}
            assert reply["reason"]
        else:
            assert reply["type"] == "websocket.close" and reply["code"] == consumers.CLOSE_FLOOD and reply["reason"]
    assert len(replies) == SOCKETS
    left = (len(consumers._pumps), consumers._open)
    assert await settled(lambda: not consumers._pumps and consumers._open == 0), left
    assert await settled(lambda: len(asyncio.all_tasks()) <= before), len(asyncio.all_tasks()) - before


async def test_a_consumer_that_raises_still_releases_its_pump(
    stores: Stores, hub: EmbeddedHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: consumers.BalancerConsumer, content: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug in a handler")

    monkeypatch.setattr(consumers.BalancerConsumer, "receive_json", broken)
    ws = WebsocketCommunicator(application, "/ws/balancer/", headers=ORIGIN)
    connected, _ = await ws.connect(timeout=10)
    assert connected
    assert await settled(lambda: len(consumers._pumps) == 1)
    await ws.send_json_to({"action": "drain"})
    with pytest.raises(RuntimeError):  # the pump's own messages may come first (seen under load)
        for _ in range(100):
            await ws.receive_output(timeout=10)

    assert await settled(lambda: not consumers._pumps and consumers._open == 0)


async def test_waiting_for_a_monitors_first_round_holds_no_thread_and_ends_when_cancelled() -> None:
    # A socket closed as soon as it opened used to leave a thread blocked for up to 10 s in
    # ready.wait: enough of them fill the default executor.
    import threading

    from dashboard.dbthread import DatabaseThread
    from dashboard.live.monitor import Monitor
    from dashboard.live.state import parse_ref

    db = DatabaseThread("test-first-round")
    try:
        watched = Monitor(parse_ref(None, None), db)  # never run: its first round never comes
        before = threading.active_count()
        waiters = [asyncio.create_task(watched.first_round(10.0)) for _ in range(20)]
        await until(lambda: all(not w.done() for w in waiters) and len(waiters) == 20, "the waiters to start")
        assert threading.active_count() == before
        for waiter in waiters:
            waiter.cancel()
        done, _ = await asyncio.wait(waiters, timeout=1.0)
        assert len(done) == 20
        watched.ready.set()
        await asyncio.wait_for(watched.first_round(10.0), 1.0)
    finally:
        db.close()
