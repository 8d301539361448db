"""Real ``manage.py runworkers`` processes racing on a real Redis, and what a test reads back.

Each ``Site`` has its own embedded hub, record directory (``tests.workers.recording``), SQLite
file (the workers' event log; the ownership store with ``store="sql"``) and Redis. Waiting is
polling with a deadline; a process that dies unexpectedly fails the wait with its log.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from balancer.model import HubRef
from balancer.redisstore import Keys, scope
from tests.redis_server import RedisServer
from tests.workers.recording import read_records
from workers.hub import EmbeddedHub

ROOT = Path(__file__).resolve().parents[2]
REF = HubRef("localhost", "race-e2e", "$Default")
# 001's spans, scaled down: the wait formula's cap (0.8 x 2.5 s) leaves room for 7 partitions per
# node at 250 ms each, and half a delay (125 ms) decides every race.
SPANS = {
    "normal-lease": 4.0, "maximum-lease": 8.0, "maximum-shutdown": 2.0, "minimum-lease-grab": 2.5,
    "leases-held-delay": 0.25,
}  # fmt: skip
INTERVAL = 0.5


@dataclass
class Site:
    root: Path
    redis: RedisServer
    database: Path
    partitions: int
    hub: EmbeddedHub = field(init=False)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.hub = EmbeddedHub(self.root / "hub", REF.hub, partitions=self.partitions)
        self.client = redis.Redis.from_url(self.redis.url, decode_responses=True)

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DATABASE_URL": f"sqlite:///{self.database}",
            "REDIS_URL": self.redis.url,
            "LEASEBOARD_VAR_DIR": str(self.root / "var"),
            "LEASEBOARD_HUB_DIR": str(self.root / "hub"),
            "LEASEBOARD_PARTITIONS": str(self.partitions),
            "LEASEBOARD_RECORD_DIR": str(self.root / "records"),
            "LEASEBOARD_LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
        }

    def start(self, prefix: str, *, store: str = "redis", env: dict[str, str] | None = None,
              extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        command = [
            sys.executable, "manage.py", "runworkers", "--count", "1", "--owner-prefix", prefix,
            "--strategy", "race", "--store", store, "--source", "embedded", "--hub", REF.hub,
            "--interval", str(INTERVAL), "--expiry", "10",
            "--handler", "tests.workers.recording.RecordingHandler",
            "--checkpoint-events", "20", "--checkpoint-seconds", "0.5", "--shutdown-timeout", "2",
            *(f"--{name}={value}" for name, value in SPANS.items()), *extra,
        ]  # fmt: skip
        with (self.root / f"{prefix}.log").open("ab") as out:
            process = subprocess.Popen(command, cwd=ROOT, env={**self.env, **(env or {})}, stdout=out,
                                       stderr=subprocess.STDOUT)  # fmt: skip
        self.processes[prefix] = process
        return process

    def log(self, prefix: str) -> str:
        return (self.root / f"{prefix}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
        self.client.close()
        self.hub.close()

    # what the test reads -------------------------------------------------------------------

    def allocation(self) -> dict[str, str]:
        """The race's allocation hash: partition -> the node processing it."""
        try:
            return dict(self.client.hgetall(f"{scope(REF)}:race:allocation"))
        except redis.ConnectionError:
            return {}

    def redis_owners(self) -> dict[str, str]:
        """Ownership records in the Redis store: partition -> owner ("" released)."""
        import json

        try:
            raw = self.client.hgetall(Keys.of(REF).ownership)
        except redis.ConnectionError:
            return {}
        return {p: json.loads(v)["owner"] for p, v in raw.items()}

    def sql_owners(self) -> dict[str, str]:
        """Ownership records in the SQLite store (``store="sql"``)."""
        with sqlite3.connect(self.database, timeout=10) as db:
            rows = db.execute(
                "SELECT partition_id, owner_id FROM dashboard_ownership WHERE hub = ?", (REF.hub,)
            ).fetchall()
        return dict(rows)

    def members(self) -> set[str]:
        try:
            return set(self.client.hkeys(Keys.of(REF).members))
        except redis.ConnectionError:
            return set()

    def records(self) -> list[tuple[str, int, str]]:
        return read_records(self.root / "records")

    def last(self) -> dict[str, int]:
        return {p: self.hub.properties(p).last_enqueued_sequence_number for p in self.hub.partition_ids()}

    def balanced(self, owners: dict[str, str], nodes: set[str]) -> bool:
        counts = [list(owners.values()).count(n) for n in nodes]
        return len(owners) == self.partitions and set(owners.values()) == nodes and max(counts) - min(counts) <= 1

    async def until(self, condition: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> float:
        """Poll ``condition`` until truthy; the seconds it took. Fails after ``timeout`` with the logs."""
        started = time.monotonic()
        while not condition():
            for prefix, process in self.processes.items():
                if process.poll() is not None and process.returncode not in (0, -signal.SIGKILL):
                    raise AssertionError(f"{prefix} exited with {process.returncode}:\n{self.log(prefix)[-3000:]}")
            if time.monotonic() - started > timeout:
                logs = "\n".join(f"--- {p}\n{self.log(p)[-2500:]}" for p in self.processes)
                raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")
            await asyncio.sleep(step)
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
