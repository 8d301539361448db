"""Bad input around Redis: a Redis that is down when ``runworkers`` starts (a clear line per
attempt, backing off, no traceback, no password; it starts once Redis answers; SIGTERM while it
waits ends it cleanly), and neighbours' keys, which a running race never touches."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path
from typing import cast

import pytest
import redis
from redis.typing import EncodableT

from balancer.model import HubRef
from balancer.stores.redis.layout import Keys, scope
from tests.support.redis_server import RedisServer
from tests.support.servers import free_port

from .processes import REF, Site

pytestmark = pytest.mark.slow

SECRET = "s3cr3t-pw"


async def test_a_redis_that_is_down_at_start_is_retried_with_backoff_then_used(
    tmp_path: Path, sqlite_copy: Path
) -> None:
    server = RedisServer(free_port(), tmp_path / "redis", password=SECRET)
    server.directory.mkdir()
    site = Site(tmp_path, server, sqlite_copy, partitions=2)
    try:
        site.start("A")
        lines: list[str] = []

        def retried_twice() -> bool:
            lines[:] = re.findall(r"is not reachable: .*", site.log("A"))
            return len(lines) >= 2

        await site.until(retried_twice, 30, "two failed attempts")
        assert f"cannot reach Redis at 127.0.0.1:{server.port}/0" in lines[0]
        assert lines[0].endswith("retrying in 1s") and lines[1].endswith("retrying in 2s")  # backing off
        server.start()
        await site.until(lambda: len(site.allocation()) == 2, 30, "A to race for the partitions once Redis answers")
        assert "answers now" in site.log("A")
        site.processes["A"].send_signal(signal.SIGTERM)
        assert site.processes["A"].wait(20) == 0
        log = site.log("A")
        assert "Traceback" not in log and SECRET not in log
    finally:
        site.stop_all()
        server.stop()


async def test_sigterm_while_waiting_for_redis_ends_the_worker_cleanly(tmp_path: Path, sqlite_copy: Path) -> None:
    server = RedisServer(free_port(), tmp_path / "redis")  # never started
    site = Site(tmp_path, server, sqlite_copy, partitions=2)
    try:
        site.start("A")
        await site.until(lambda: "is not reachable" in site.log("A"), 30, "the first failed attempt")
        site.processes["A"].send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert await asyncio.to_thread(site.processes["A"].wait, 10) == 0
        assert time.monotonic() - started < 5 and "Traceback" not in site.log("A")
    finally:
        site.stop_all()


async def test_a_running_race_never_touches_another_consumer_groups_keys(
    tmp_path: Path, redis_server: RedisServer, sqlite_copy: Path
) -> None:
    neighbour = scope(HubRef(REF.namespace, REF.hub, "analytics"))
    raw = redis.Redis.from_url(redis_server.url)
    theirs: dict[str, dict[EncodableT, EncodableT]] = {
        f"{neighbour}:race:allocation": {"0": "x-0", "1": "x-0"},
        f"{neighbour}:race:grab": {"0": "x-0"},
        f"{neighbour}:ownership": {"0": '{"owner": "x-0", "etag": "e", "modified": "1.0", "level": 0}'},
    }
    for key, fields in theirs.items():
        raw.hset(key, mapping=fields)
    before = {key: raw.dump(key) for key in theirs}
    site = Site(tmp_path, redis_server, sqlite_copy, partitions=2)
    try:
        site.start("A")
        site.start("B")
        await site.until(lambda: site.balanced(site.allocation(), {"A-0", "B-0"}), 30, "A and B to share")
        for prefix in ("A", "B"):
            site.processes[prefix].send_signal(signal.SIGTERM)
            assert site.processes[prefix].wait(20) == 0
    finally:
        site.stop_all()
    assert {key: raw.dump(key) for key in theirs} == before
    ours = [k.decode() for k in cast(list[bytes], raw.keys("*")) if k.decode() not in theirs]  # bytes: not decoded
    # the store's and the race's keys are in our scope; the channel layer's are its own
    assert all(k.startswith(scope(REF) + ":") or not k.startswith("leaseboard:{") for k in ours), ours
    assert Keys.of(REF).ownership in ours
    raw.close()
