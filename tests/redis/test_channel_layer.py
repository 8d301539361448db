"""The Redis channel layer across processes: Daphne and two ``runworkers`` processes with
``REDIS_URL`` set. One websocket on ``/ws/balancer/`` sees both workers' balancer events, and a
listener on the channel layer's own group sees them arrive as ``balancer.event`` messages
through Redis (``channels_redis``), not only through the event log the consumer also polls.
The consumer outlives the channel layer's blocking reads, and the dashboard reads ownership from
the Redis store as the workers write it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets

from dashboard.live.broadcast import GROUP, MESSAGE_TYPE
from dashboard.live.layers import RedisChannelLayer
from tests.support.redis_server import RedisServer
from tests.support.servers import free_port
from tests.support.waiting import until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HUB = "layer-e2e"


@pytest.fixture
def environment(tmp_path: Path, redis_server: RedisServer, sqlite_copy: Path) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("LEASEBOARD_", "DATABASE_URL", "REDIS_URL"))}
    return {
        **kept,
        "DJANGO_SETTINGS_MODULE": "dashboard.settings",
        "DATABASE_URL": f"sqlite:///{sqlite_copy}",  # the event log both sides share
        "REDIS_URL": redis_server.url,
        "LEASEBOARD_STORE": "redis",
        "LEASEBOARD_HUB": HUB,
        "LEASEBOARD_VAR_DIR": str(tmp_path / "var"),
        "LEASEBOARD_HUB_DIR": str(tmp_path / "hub"),
        "LEASEBOARD_PARTITIONS": "4",
        "LEASEBOARD_LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    started: dict[str, subprocess.Popen[bytes]] = {}
    yield started
    for process in started.values():
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def spawn(name: str, command: list[str], env: dict[str, str], root: Path) -> subprocess.Popen[bytes]:
    with (root / f"{name}.log").open("ab") as out:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def answering(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


async def test_both_workers_balancer_events_reach_one_websocket_through_the_redis_channel_layer(
    tmp_path: Path, environment: dict[str, str], processes: dict[str, subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    processes["daphne"] = spawn(
        "daphne",
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "dashboard.asgi:application"],
        environment,
        tmp_path,
    )

    def daphne_runs() -> None:
        assert processes["daphne"].poll() is None, (tmp_path / "daphne.log").read_text()[-3000:]

    await until(
        lambda: asyncio.to_thread(answering, f"http://127.0.0.1:{port}/api/state"),
        "daphne to answer",
        30,
        step=0.1,
        check=daphne_runs,
    )

    # the layer the settings configure for REDIS_URL
    layer = RedisChannelLayer(hosts=[{"address": environment["REDIS_URL"], "socket_timeout": 15}], prefix="leaseboard")
    listener = await layer.new_channel()
    await layer.group_add(GROUP, listener)
    layer_reporters: set[str] = set()
    socket_reporters: set[str] = set()

    async def read_layer() -> None:
        while True:
            message = await layer.receive(listener)
            assert message["type"] == MESSAGE_TYPE
            layer_reporters.add(message["event"]["reporter"])

    uri = f"ws://127.0.0.1:{port}/ws/balancer/?hub={HUB}"
    async with websockets.connect(uri, origin=websockets.Origin(f"http://127.0.0.1:{port}")) as socket:
        reading = asyncio.create_task(read_layer())
        for prefix in ("A", "B"):
            processes[prefix] = spawn(
                prefix,
                [
                    sys.executable,
                    "manage.py",
                    "runworkers",
                    "--owner-prefix",
                    prefix,
                    "--store",
                    "redis",
                    "--hub",
                    HUB,
                    "--interval",
                    "0.5",
                    "--expiry",
                    "3",
                ],
                environment,
                tmp_path,
            )
        deadline = time.monotonic() + 60
        try:
            while not ({"A-0", "B-0"} <= socket_reporters and {"A-0", "B-0"} <= layer_reporters):
                for name, process in processes.items():
                    assert process.poll() is None, f"{name}: {(tmp_path / f'{name}.log').read_text()[-3000:]}"
                assert time.monotonic() < deadline, (socket_reporters, layer_reporters)
                message: dict[str, Any] = json.loads(await asyncio.wait_for(socket.recv(), 30))
                assert message["type"] != "error", message
                if message["type"] in ("events", "history"):
                    socket_reporters |= {e["reporter"] for e in message["events"]}
            # The consumer's channel-layer receive blocks up to 5 s at a time: a socket that stays
            # open past that (with redis-py 8's 5 s read timeout it died here) still gets B's releases.
            quiet_until = time.monotonic() + 7
            while time.monotonic() < quiet_until:
                message = json.loads(await asyncio.wait_for(socket.recv(), 30))
                assert message["type"] != "error", message
            layer_reporters.clear()
            processes["B"].send_signal(signal.SIGTERM)
            released = False
            while not (released and "B-0" in layer_reporters):
                assert time.monotonic() < deadline + 10, "B's releases did not arrive"
                if reading.done():
                    raise AssertionError(f"the channel-layer listener ended: {reading.exception()!r}")
                message = json.loads(await asyncio.wait_for(socket.recv(), 30))
                if message["type"] == "events":
                    released |= any(e["reporter"] == "B-0" and e["kind"] == "release" for e in message["events"])
            assert processes["B"].wait(20) == 0
        finally:
            reading.cancel()
    await layer.group_discard(GROUP, listener)
    await layer.flush()

    def owners() -> set[str]:  # the dashboard reads ownership from the Redis store the workers write
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/state?hub={HUB}", timeout=5) as response:
            return {p["owner"] for p in json.load(response)["partitions"]} - {None}

    while await asyncio.to_thread(owners) != {"A-0"}:  # B released everything to A
        assert time.monotonic() < deadline + 30, await asyncio.to_thread(owners)
        await asyncio.sleep(0.1)
