"""What anonymous visitors can make the console do: 1,000 requests and 200 websockets with random
and valid hub names against Daphne with the production settings, and the console process's CPU,
memory and running tasks before, during and 30 s after. Target: back to the idle figures after
(monitors and feeds exist only for hubs the store knows, capped: ``dashboard/live/host.py``).

Topology: one Daphne process (``dashboard.production``, SQLite, the SQL store, the embedded hub
with 16 partitions); the store knows two hubs (``sensors``, the configured one, and ``orders``),
each with a worker's heartbeat. A visitor asks one of the pages or JSON APIs, or opens a socket,
for ``sensors`` or ``orders`` (30 %) or a random name (70 %); sockets with a known hub stay open
until the "during" figures are taken, the others are closed by the console with 4404.

CPU is the console process's (psutil, all threads, % of one core) over each phase's window;
memory its resident set; tasks, monitors and sockets are ``/metrics``'s ``leaseboard_console_*``.

Run: ``.venv/bin/python -m tests.benchmarks.bench_visitors [--requests 1000] [--sockets 200] [--after 30]``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import random
import re
import secrets
import string
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # no stubs installed (types-psutil is no dev dependency)
import websockets

from tests.benchmarks.size import size
from tests.support.servers import ServerProcess, start_on_a_free_port

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE, HUB, OTHER, GROUP = "bench.example", "sensors", "orders", "$Default"
PATHS = ("/", "/events/", "/history/", "/api/state", "/api/events", "/api/history", "/api/audit", "/partitions/1/")
SAMPLE = size(5.0, 0.5)  # seconds each phase's CPU is measured over
_GAUGE = re.compile(rb"^leaseboard_console_(\w+) (\S+)$", re.MULTILINE)


def _environment(var: Path) -> dict[str, str]:
    ours = ("DJANGO_", "LEASEBOARD_", "DATABASE_URL", "REDIS_URL")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    environ.update(
        DJANGO_SETTINGS_MODULE="dashboard.production",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_ALLOWED_HOSTS="127.0.0.1",
        LEASEBOARD_SSL_REDIRECT="false",
        LEASEBOARD_VAR_DIR=str(var),
        DATABASE_URL=f"sqlite:///{var / 'db.sqlite3'}",
        LEASEBOARD_STORE="sql",
        LEASEBOARD_SOURCE="embedded",
        LEASEBOARD_PARTITIONS="16",
        LEASEBOARD_NAMESPACE=NAMESPACE,
        LEASEBOARD_HUB=HUB,
        LEASEBOARD_CONSUMER_GROUP=GROUP,
        LEASEBOARD_LOG_LEVEL="ERROR",
    )
    return environ


SEED = f"""
import asyncio, django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from balancer.model import HubRef, Member
from workers.wiring import build_stores
async def seed():
    stores = build_stores("sql")
    for hub in ({HUB!r}, {OTHER!r}):
        await stores.controls.heartbeat(Member(HubRef({NAMESPACE!r}, hub, {GROUP!r}), "worker-1", 0.0))
asyncio.run(seed())
"""


def _name(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return rng.choice((HUB, OTHER))
    return "".join(rng.choices(string.ascii_lowercase + string.digits, k=rng.randint(3, 40)))


class Daphne(ServerProcess):
    """The console under Daphne on ``port``, its log under ``home``: ready once ``/metrics`` answers."""

    name = "console (daphne)"

    def __init__(self, port: int, home: Path, env: dict[str, str]) -> None:
        super().__init__(port, home)
        home.mkdir(parents=True, exist_ok=True)
        self.env = env

    def command(self) -> list[str]:
        return [sys.executable, "-m", "daphne", "-b", self.host, "-p", str(self.port), "dashboard.asgi:application"]

    def popen_options(self) -> dict[str, Any]:
        return {"cwd": ROOT, "env": self.env}

    def ready(self) -> bool:
        return super().ready() and _get(self.port, "/metrics")[0] == 200

    def start(self, timeout: float = 60.0) -> None:  # a production start on a busy machine
        super().start(timeout)


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return 0, b""


class Console:
    def __init__(self, var: Path) -> None:
        self.env = _environment(var)
        subprocess.run([sys.executable, "-c", SEED], cwd=ROOT, env=self.env, check=True)
        # A port taken between choosing and binding it is tried again elsewhere; a console that exits
        # or does not answer fails with its log (once it waited 60 s with no word of why).
        self.server = start_on_a_free_port(lambda port: Daphne(port, var / "daphne", self.env))
        self.port = self.server.port
        assert self.server.process is not None
        self.ps = psutil.Process(self.server.process.pid)

    def get(self, path: str) -> tuple[int, bytes]:
        return _get(self.port, path)

    def figures(self) -> dict[str, float]:
        """CPU over SAMPLE seconds, memory now, and the console's own gauges."""
        self.ps.cpu_percent(None)
        time.sleep(SAMPLE)  # the measuring window itself, not a wait for a condition
        cpu = self.ps.cpu_percent(None)
        found: dict[str, float] = {"cpu": cpu, "rss_mb": self.ps.memory_info().rss / 2**20}
        status, body = self.get("/metrics")
        if status == 200:
            found.update({name.decode(): float(value) for name, value in _GAUGE.findall(body)})
        return found

    def stop(self) -> None:
        self.server.stop()


async def _sockets(port: int, count: int, rng: random.Random, held: list[Any], codes: Counter[str]) -> None:
    async def one(name: str) -> None:
        url = f"ws://127.0.0.1:{port}/ws/balancer/?hub={name}"
        try:
            socket = await websockets.connect(url, origin=f"http://127.0.0.1:{port}", open_timeout=30)  # type: ignore[arg-type]
        except Exception as exc:  # refused at the handshake
            codes[f"refused ({type(exc).__name__})"] += 1
            return
        try:
            await asyncio.wait_for(socket.recv(), 30)  # the snapshot, or the error before a close
            await socket.send(b"\x00binary")  # a bad frame too: answered, not a leak
            await asyncio.wait_for(socket.recv(), 30)
        except websockets.ConnectionClosed as closed:
            codes[str(closed.rcvd.code if closed.rcvd else "closed")] += 1
            return
        except TimeoutError:
            codes["no answer"] += 1
        codes["open"] += 1
        held.append(socket)

    await asyncio.gather(*(one(_name(rng)) for _ in range(count)))


def _requests(console: Console, count: int, rng: random.Random) -> Counter[int]:
    asked = [f"{rng.choice(PATHS)}?hub={_name(rng)}" for _ in range(count)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        return Counter(status for status, _ in pool.map(console.get, asked))


def _row(phase: str, f: dict[str, float]) -> str:
    return (
        f"{phase:<22} {f['cpu']:>7.1f} {f['rss_mb']:>8.1f} {f.get('tasks', -1):>7.0f} "
        f"{f.get('monitors', -1):>9.0f} {f.get('sockets', -1):>8.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=size(1000, 40))
    parser.add_argument("--sockets", type=int, default=size(200, 8))
    parser.add_argument("--after", type=float, default=size(30.0, 1.0))
    args = parser.parse_args()
    rng = random.Random(20)
    with tempfile.TemporaryDirectory(prefix="bench-visitors-") as tmp:
        console = Console(Path(tmp))
        try:
            before = console.figures()
            held: list[Any] = []
            codes: Counter[str] = Counter()
            started = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(1) as side:
                statuses = side.submit(_requests, console, args.requests, rng)
                asyncio.run(_sockets(console.port, args.sockets, random.Random(21), held, codes))
                answered = statuses.result()
            took = time.perf_counter() - started
            during = console.figures()  # the sockets of known hubs still open

            async def close_all() -> None:
                await asyncio.gather(*(s.close() for s in held), return_exceptions=True)

            asyncio.run(close_all())
            time.sleep(max(0.0, args.after - SAMPLE))  # the "30 s after" of the measurement itself
            after = console.figures()
        finally:
            console.stop()
    print(f"{args.requests} requests ({took:.1f} s with the sockets), statuses: {dict(sorted(answered.items()))}")
    print(f"{args.sockets} websockets (a binary frame each), outcomes: {dict(sorted(codes.items()))}")
    print(f"{'phase':<22} {'CPU %':>7} {'RSS MB':>8} {'tasks':>7} {'monitors':>9} {'sockets':>8}")
    print(_row("idle before", before))
    print(_row("during (sockets open)", during))
    print(_row(f"{args.after:.0f} s after", after))
    cpu_back = after["cpu"] <= max(2 * before["cpu"], before["cpu"] + 5)
    # A monitor a visitor started for a hub the store knows (orders) may stay its idle time: at most
    # one per known hub, whatever the visitors asked; everything else is back where it was.
    extra = after.get("monitors", 0) - before.get("monitors", 0)
    bounded = after.get("monitors", 0) <= 2 and after.get("sockets") == 0
    tasks = after.get("tasks", 0) - before.get("tasks", 0)
    print(
        f"back to idle: CPU {'yes' if cpu_back else 'NO'}; sockets 0 and monitors only for the 2 known hubs: "
        f"{'yes' if bounded else 'NO'} ({extra:+.0f} monitor, {tasks:+.0f} tasks)"
    )


if __name__ == "__main__":
    main()
