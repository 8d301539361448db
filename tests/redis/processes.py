"""Real ``manage.py runworkers`` processes racing on a real Redis, and what a test reads back.

Each ``Site`` has its own embedded hub, record directory (``tests.workers.recording``), SQLite
file (the workers' event log; the ownership store with ``store="sql"``) and Redis. Waiting is
polling with a deadline; a process that dies unexpectedly fails the wait with its log.
"""

from __future__ import annotations

import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import redis

from balancer.model import HubRef
from balancer.stores.redis.layout import Keys, scope
from tests.support.processes import Processes, last_enqueued, manage, worker_env
from tests.support.redis_server import RedisServer
from workers.hub.embedded import EmbeddedHub

REF = HubRef("localhost", "race-e2e", "$Default")
# 001's spans, scaled down: the wait formula's cap (0.8 x 2.5 s) leaves room for 7 partitions per
# node at 250 ms each, and half a delay (125 ms) decides every race.
SPANS = {
    "normal-lease": 4.0,
    "maximum-lease": 8.0,
    "maximum-shutdown": 2.0,
    "minimum-lease-grab": 2.5,
    "leases-held-delay": 0.25,
}
INTERVAL = 0.5


@dataclass
class Site(Processes):
    redis: RedisServer
    database: Path
    partitions: int
    hub: EmbeddedHub = field(init=False)

    def __post_init__(self) -> None:
        self.hub = EmbeddedHub(self.root / "hub", REF.hub, partitions=self.partitions)
        self.client = redis.Redis.from_url(self.redis.url, decode_responses=True)

    @property
    def env(self) -> dict[str, str]:
        return worker_env(
            self.root,
            DATABASE_URL=f"sqlite:///{self.database}",
            REDIS_URL=self.redis.url,
            LEASEBOARD_PARTITIONS=str(self.partitions),
        )

    def start(
        self, prefix: str, *, store: str = "redis", env: dict[str, str] | None = None, extra: tuple[str, ...] = ()
    ) -> subprocess.Popen[bytes]:
        command = manage(
            "runworkers",
            "--count",
            "1",
            "--owner-prefix",
            prefix,
            "--strategy",
            "race",
            "--store",
            store,
            "--source",
            "embedded",
            "--hub",
            REF.hub,
            "--interval",
            str(INTERVAL),
            "--expiry",
            "10",
            "--handler",
            "tests.workers.recording.RecordingHandler",
            "--checkpoint-events",
            "20",
            "--checkpoint-seconds",
            "0.5",
            "--shutdown-timeout",
            "2",
            *(f"--{name}={value}" for name, value in SPANS.items()),
            *extra,
        )
        return self.spawn(prefix, command, {**self.env, **(env or {})})

    def stop_all(self) -> None:
        self.kill_all()
        self.client.close()
        self.hub.close()

    # what the test reads -------------------------------------------------------------------

    def _hash(self, key: str) -> dict[str, str]:
        """The hash ``key``, {} while the server cannot be reached (a restart): a connection of the
        test's own that failed (ciul saw one, under load, in the middle of a run) is opened again
        and asked again, up to five times, so it is not taken for an empty hash."""
        for _ in range(5):
            try:
                return cast(dict[str, str], self.client.hgetall(key))  # decode_responses
            except redis.ConnectionError:
                self.client.connection_pool.disconnect()  # the next try opens a new connection
        return {}

    def allocation(self) -> dict[str, str]:
        """The race's allocation hash: partition -> the node processing it."""
        return self._hash(f"{scope(REF)}:race:allocation")

    def redis_owners(self) -> dict[str, str]:
        """Ownership records in the Redis store: partition -> owner ("" released)."""
        import json

        return {p: json.loads(v)["owner"] for p, v in self._hash(Keys.of(REF).ownership).items()}

    def sql_owners(self) -> dict[str, str]:
        """Ownership records in the SQLite store (``store="sql"``)."""
        with sqlite3.connect(self.database, timeout=10) as db:
            rows = db.execute(
                "SELECT partition_id, owner_id FROM dashboard_ownership WHERE hub = ?", (REF.hub,)
            ).fetchall()
        return dict(rows)

    def members(self) -> set[str]:
        try:
            return set(cast(list[str], self.client.hkeys(Keys.of(REF).members)))  # decode_responses
        except redis.ConnectionError:
            return set()

    def last(self) -> dict[str, int]:
        return last_enqueued(self.hub)

    def balanced(self, owners: dict[str, str], nodes: set[str]) -> bool:
        counts = [list(owners.values()).count(n) for n in nodes]
        return len(owners) == self.partitions and set(owners.values()) == nodes and max(counts) - min(counts) <= 1

    async def until(self, condition: Callable[[], Any], timeout: float, what: str) -> float:
        """``Processes.until``, returning the seconds it took."""
        started = time.monotonic()
        await super().until(condition, timeout, what)
        return time.monotonic() - started


def start_producing(site: Site, every: float = 0.02) -> tuple[threading.Event, threading.Thread]:
    """A thread writing one event to every partition every ``every`` seconds until the event is set."""
    stop = threading.Event()

    def produce() -> None:
        while not stop.wait(every):
            for pid in site.hub.partition_ids():
                site.hub.send(b'{"race": true}', partition_id=pid)

    thread = threading.Thread(target=produce, name="race-producer", daemon=True)
    thread.start()
    return stop, thread


def handled_by(records: list[tuple[str, int, str]]) -> dict[str, dict[int, list[str]]]:
    """partition -> sequence number -> the owners that handled it, in order."""
    out: dict[str, dict[int, list[str]]] = {}
    for pid, sequence, owner in records:
        out.setdefault(pid, {}).setdefault(sequence, []).append(owner)
    return out
