"""The console under load: event → browser latency at 200 balancer events per second with 1024
partitions and 64 workers, and the render time of ``/metrics`` for that fleet.

Topology (the production one, on one machine): Daphne serving the dashboard on a SQLite file, a
Redis channel layer, a publisher process standing in for the workers (each event is a real ETag
claim in the SQL store, then an EventLog row and a channel-layer message, as ``runworkers``
sends them), and the fleet page open in Debian Chromium. Latency is from the moment the publisher
hands an event over (its ``at``) to the moment the page has applied it to its grid and feed; both
ends read this machine's clock. The first two seconds are warm-up and not counted.

Run: ``.venv/bin/python -m tests.benchmarks.bench_dashboard [--rate 200] [--seconds 15]
[--partitions 1024] [--workers 64]``. Targets: p95 ≤ 250 ms; ``/metrics`` < 100 ms. Needs
``redis-server`` (without it the in-memory layer is used, and events cross by polling: say so).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.benchmarks.size import size
from tests.support.redis_server import RedisServer, start_redis
from tests.support.servers import ServerError, free_port
from tests.support.waiting import until_sync

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WARMUP = size(2.0, 0.5)
NAMESPACE, HUB, GROUP = "bench.example", "sensors", "$Default"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# --- the child processes --------------------------------------------------------------------------


def _django() -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    django.setup()


async def _seed(partitions: int, workers: int) -> None:
    from balancer.model import HubRef, Member, OwnershipRecord
    from workers.wiring import build_stores

    ref = HubRef(NAMESPACE, HUB, GROUP)
    stores = build_stores("sql")
    for w in range(workers):
        await stores.controls.heartbeat(Member(ref, f"worker-{w:02d}", 0.0))
    records = [OwnershipRecord(ref, str(p), f"worker-{p % workers:02d}") for p in range(partitions)]
    await stores.ownership.claim_ownership(records)
    await stores.ownership.aclose()  # type: ignore[attr-defined]


async def _publish(rate: float, seconds: float, workers: int) -> dict[str, float]:
    from balancer.model import BalancerEvent, EventKind, HubRef, Member
    from dashboard.live.broadcast import apublish
    from workers.wiring import build_stores

    ref = HubRef(NAMESPACE, HUB, GROUP)
    stores = build_stores("sql")
    records = {r.partition_id: r for r in await stores.ownership.list_ownership(ref)}
    names = [f"worker-{w:02d}" for w in range(workers)]
    rng = random.Random(7)
    stop = asyncio.Event()

    async def heartbeats() -> None:
        while not stop.is_set():
            for name in names:
                await stores.controls.heartbeat(Member(ref, name, 0.0))
            await asyncio.sleep(2.0)

    beating = asyncio.create_task(heartbeats())
    started = time.perf_counter()
    sent = 0
    lanes = 4  # a claim and an event log row are two SQLite writes: four at a time keep the rate

    async def lane(j: int) -> None:
        nonlocal sent
        mine = [p for p in records if int(p) % lanes == j]  # disjoint, so the lanes never race for one ETag
        k = j
        while time.perf_counter() - started < seconds:
            delay = started + k / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            k += lanes
            pid = rng.choice(mine)
            seen = records[pid]
            taker = rng.choice([n for n in names if n != seen.owner_id])
            won = await stores.ownership.claim_ownership([seen.claimed_by(taker)])
            if won:
                records[pid] = won[0]
            why = "bench: over its share"
            await apublish(BalancerEvent(EventKind.STEAL, ref, pid, taker, seen.owner_id, taker, why, time.time()))
            sent += 1

    await asyncio.gather(*(lane(j) for j in range(lanes)))
    elapsed = time.perf_counter() - started
    stop.set()
    await beating
    await stores.ownership.aclose()  # type: ignore[attr-defined]
    return {"sent": sent, "seconds": elapsed, "rate": sent / elapsed}


def child(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["seed", "publish"])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--partitions", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=64)
    args = parser.parse_args(argv)
    _django()
    if args.role == "seed":
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        asyncio.run(_seed(args.partitions, args.workers))
        return 0
    print(json.dumps(asyncio.run(_publish(args.rate, args.seconds, args.workers))), flush=True)
    return 0


# --- the benchmark --------------------------------------------------------------------------------


def _environment(var: Path, redis_url: str, partitions: int) -> dict[str, str]:
    ours = ("DJANGO_", "LEASEBOARD_", "DATABASE_URL", "REDIS_URL")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    environ.update(
        DJANGO_SETTINGS_MODULE="dashboard.settings",
        LEASEBOARD_VAR_DIR=str(var),
        DATABASE_URL=f"sqlite:///{var / 'db.sqlite3'}",
        LEASEBOARD_STORE="sql",
        LEASEBOARD_SOURCE="embedded",
        LEASEBOARD_PARTITIONS=str(partitions),
        LEASEBOARD_NAMESPACE=NAMESPACE,
        LEASEBOARD_HUB=HUB,
        LEASEBOARD_CONSUMER_GROUP=GROUP,
        LEASEBOARD_EXPIRY="3600",
        LEASEBOARD_LOG_LEVEL="WARNING",
    )
    if redis_url:
        environ["REDIS_URL"] = redis_url
    return environ


def _wait_for(url: str, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    def answers() -> bool:
        with urllib.request.urlopen(url, timeout=2):
            return True

    def running() -> None:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")

    until_sync(answers, f"{url} to answer", timeout, step=0.1, check=running, ignoring=(OSError,))


def _start_redis() -> RedisServer | None:
    """A redis-server for the channel layer, or None without one (the in-memory layer is used)."""
    try:
        return start_redis()
    except ServerError:
        return None


def _stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def _metrics_render(partitions: int, workers: int, rounds: int = 40) -> list[float]:
    """Milliseconds to render /metrics for a synthetic fleet, in this process (no I/O)."""
    _django()
    from balancer.model import HubRef
    from dashboard.live import metrics
    from dashboard.live.console import ConsoleState, Lease, PartitionRow, SourceStatus, WorkerRow
    from dashboard.live.lag import STATUSES

    now = time.time()
    names = [f"worker-{w:02d}" for w in range(workers)]
    ref = HubRef(NAMESPACE, HUB, GROUP)
    state = ConsoleState(
        ref,
        now,
        30.0,
        0,
        SourceStatus("embedded"),
        tuple(
            PartitionRow(
                str(p),
                names[p % workers],
                Lease.OWNED,
                now,
                1000 + p,
                1097 + p,
                now,
                now,
                p % 97,
                None,
                lag_seconds=(p % 97) / 10,
                lag_status=STATUSES[p % 5],
            )
            for p in range(partitions)
        ),
        tuple(WorkerRow(n, partitions // workers, False, now, True, events_per_second=12.5) for n in names),
    )
    logged = {"claim": 1024, "steal": 5000, "release": 100, "expire": 3, "lost": 1}
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        body = metrics.render(ref, state, logged)
        took.append((time.perf_counter() - started) * 1000)
    assert body.count(b"leaseboard_partition_status{") == partitions
    return took


class SocketClient:
    """A plain websocket client beside the browser: the server's part of the latency, without a renderer."""

    def __init__(self, url: str, origin: str) -> None:
        import threading

        self.url = url
        self.origin = origin  # the page's own, port included: the console refuses any other (dashboard.asgi.SameOrigin)
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        import websockets
        from websockets.typing import Origin

        async with websockets.connect(self.url, origin=Origin(self.origin), max_size=None) as ws:
            while not self._stop.is_set():
                try:
                    message = json.loads(await asyncio.wait_for(ws.recv(), 0.25))
                except TimeoutError:
                    continue
                if message["type"] == "events":
                    now = time.time()
                    self.latencies += [(now - e["at"]) * 1000 for e in message["events"]]

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join(5)
        return self.latencies


def _metrics_http(url: str, rounds: int = 20) -> tuple[list[float], int]:
    took = []
    size = 0
    for _ in range(rounds):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as response:
            size = len(response.read())
        took.append((time.perf_counter() - started) * 1000)
    return took, size


def run(
    rate: float, seconds: float, partitions: int, workers: int, keep: bool = False, screenshot: str = ""
) -> dict[str, Any]:
    from playwright.sync_api import expect, sync_playwright

    from workers.hub.embedded import EmbeddedHub

    var = Path(tempfile.mkdtemp(prefix="bench-dashboard-"))
    redis = _start_redis()
    redis_url = redis.url if redis else ""
    environ = _environment(var, redis_url, partitions)
    if keep:
        environ["LEASEBOARD_LOG_LEVEL"] = "DEBUG"
    me = [sys.executable, "-m", "tests.benchmarks.bench_dashboard"]
    sizes = ["--partitions", str(partitions), "--workers", str(workers)]
    daphne: subprocess.Popen[bytes] | None = None
    try:
        with EmbeddedHub(var / "hub", HUB, partitions=partitions):
            pass
        subprocess.run([*me, "seed", *sizes], cwd=ROOT, env=environ, check=True, timeout=300)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        daphne = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "dashboard.asgi:application"],
            cwd=ROOT,
            env=environ,
            stdout=subprocess.DEVNULL,
            stderr=(var / "daphne.log").open("wb"),
        )
        _wait_for(f"{url}/api/state", daphne)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(url + "/")
            # Locator assertions, not wait_for_function: Playwright polls a waited-for function with
            # the page's own eval(), which the console's Content-Security-Policy refuses (no
            # 'unsafe-eval'); locators and evaluate() run from the driver's side, which CSP allows.
            expect(page.locator("#partitions .tile")).to_have_count(partitions, timeout=60_000)
            expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=60_000)
            page.evaluate("for (const k of ['latencies', 'renderMs', 'lastLeg']) window.Leaseboard[k].length = 0")
            socket = SocketClient(f"ws://127.0.0.1:{port}/ws/balancer/", origin=url)
            published = subprocess.run(
                [*me, "publish", "--rate", str(rate), "--seconds", str(seconds), *sizes],
                cwd=ROOT,
                env=environ,
                check=True,
                capture_output=True,
                timeout=seconds + 120,
            )
            page.wait_for_timeout(1500)  # the last events in flight
            plain = socket.stop()
            if screenshot:
                page.screenshot(path=screenshot, full_page=True)
            latencies = page.evaluate("window.Leaseboard.latencies.slice()")
            render_ms = page.evaluate("window.Leaseboard.renderMs.slice()")
            last_leg = [s * 1000 for s in page.evaluate("window.Leaseboard.lastLeg.slice()")]
            stale = page.evaluate("document.getElementById('connection').dataset.state")
            browser.close()
        sent = json.loads(published.stdout.decode().strip().splitlines()[-1])
        skip = int(WARMUP * sent["rate"])
        counted = [s * 1000 for s in latencies[skip:]]
        plain = plain[skip:]
        http_ms, size = _metrics_http(f"{url}/metrics")
    finally:
        _stop(daphne)
        if redis:
            redis.stop()
        if keep:
            print(f"kept {var} (daphne.log has the server's DEBUG log)")
        else:
            shutil.rmtree(var, ignore_errors=True)
    render = _metrics_render(partitions, workers)
    return {
        "layer": "redis" if redis_url else "in-memory (polling)",
        "sent": sent,
        "received": len(latencies),
        "latency_ms": counted,
        "socket_ms": plain,
        "render_ms": render_ms,
        "last_leg_ms": last_leg,
        "connection": stale,
        "metrics_render_ms": render,
        "metrics_http_ms": http_ms,
        "metrics_bytes": size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--rate", type=float, default=size(200.0, 50.0), help="balancer events per second (default 200)"
    )
    parser.add_argument("--seconds", type=float, default=size(15.0, 2.0), help="how long to publish (default 15)")
    parser.add_argument("--partitions", type=int, default=size(1024, 64))
    parser.add_argument("--workers", type=int, default=size(64, 8))
    parser.add_argument("--keep", action="store_true", help="keep the run's folder, with the server's DEBUG log")
    parser.add_argument("--screenshot", default="", help="save the page as it is at the end to this PNG file")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} is missing: `make test` installs Debian's chromium package")
    found = run(args.rate, args.seconds, args.partitions, args.workers, args.keep, args.screenshot)
    lat = found["latency_ms"]
    sent = found["sent"]
    rows = [
        ("channel layer", found["layer"], ""),
        ("events published", f"{sent['sent']} in {sent['seconds']:.1f} s ({sent['rate']:.0f}/s)", f"{args.rate:g}/s"),
        ("events the page applied", f"{found['received']}", "all"),
        ("event → browser p50", f"{statistics.median(lat):.0f} ms", ""),
        ("event → browser p95", f"{percentile(lat, 0.95):.0f} ms", "≤ 250 ms"),
        ("event → browser p99 / max", f"{percentile(lat, 0.99):.0f} / {max(lat):.0f} ms", ""),
        (
            "of which server → page (p50 / p95)",
            f"{statistics.median(found['last_leg_ms']):.0f} / {percentile(found['last_leg_ms'], 0.95):.0f} ms",
            "",
        ),
        (
            "event → plain websocket client p50 / p95",
            f"{statistics.median(found['socket_ms']):.0f} / {percentile(found['socket_ms'], 0.95):.0f} ms",
            "",
        ),
        ("page: one message applied (p95)", f"{percentile(found['render_ms'], 0.95):.1f} ms", ""),
        (
            "/metrics render (p50 / p95)",
            f"{statistics.median(found['metrics_render_ms']):.1f} / "
            f"{percentile(found['metrics_render_ms'], 0.95):.1f} ms",
            "< 100 ms",
        ),
        (
            "/metrics over HTTP (p50 / p95)",
            f"{statistics.median(found['metrics_http_ms']):.1f} / "
            f"{percentile(found['metrics_http_ms'], 0.95):.1f} ms "
            f"({found['metrics_bytes'] // 1024} kB)",
            "",
        ),
    ]
    print(f"{args.partitions} partitions, {args.workers} workers, page connection at the end: {found['connection']}")
    width = max(len(r[0]) for r in rows)
    for name, value, target in rows:
        print(f"  {name:<{width}}  {value:<34} {('target ' + target) if target else ''}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("seed", "publish"):
        raise SystemExit(child(sys.argv[1:]))
    main()
