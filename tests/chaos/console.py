"""The console under faults: a dashboard process (daphne) on the fleet's store, polled all the while.

``Console`` starts ``daphne dashboard.asgi:application`` on a free loopback port with the workers'
environment (the same store, database and hub directory) and the fleet's hub as the configured one,
so ``/metrics`` reports on it. ``poll()`` starts one thread per path (``/api/state`` and
``/metrics``), each sending a request every ``period`` seconds and recording a ``Probe`` (status,
``leaseboard_store_up``, when) on the monotonic clock the rest of the evidence uses; ``rules``
judges them (``console``, ``store_down_shown``).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from balancer.model import HubRef
from tests.chaos.evidence import Probe
from tests.support import waiting
from tests.support.processes import kill, start_logged
from tests.support.servers import free_port

PATHS = ("/api/state", "/metrics")
_STORE_UP = re.compile(rb"^leaseboard_store_up (\S+)$", re.MULTILINE)
_TITLE = re.compile(rb"<title>\s*(.*?)\s*</title>", re.DOTALL)


def _detail(body: bytes) -> str:
    """What an error answer says, in one short line (a Django debug page: its title)."""
    title = _TITLE.search(body[:4000])
    text = title.group(1) if title else body[:160]
    return " ".join(text.decode(errors="replace").split())[:160]


@dataclass
class Console:
    root: Path
    env: dict[str, str]
    ref: HubRef
    period: float = 0.5  # seconds between two requests to one path
    timeout: float = 10.0  # seconds a request may take before it counts as unanswered
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    probes: list[Probe] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.root / "console.log"

    def start(self) -> None:
        env = {
            **self.env,
            "LEASEBOARD_NAMESPACE": self.ref.namespace,
            "LEASEBOARD_HUB": self.ref.hub,
            "LEASEBOARD_CONSUMER_GROUP": self.ref.consumer_group,
        }
        command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port)]
        self.process = start_logged(self.log, [*command, "dashboard.asgi:application"], env)

    async def ready(self, timeout: float = 60.0) -> None:
        """Return once ``/metrics`` answers 200 (fail early, with the log, if the process exits)."""

        def alive() -> None:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise AssertionError(f"the console exited with {code}:\n{self.log_tail()}")

        def answers() -> bool:
            return self.request("/metrics", 2.0).status == 200

        what = "the console to answer /metrics"
        await asyncio.to_thread(waiting.until_sync, answers, what, timeout, step=0.1, check=alive, detail=self.log_tail)

    def request(self, path: str, timeout: float | None = None) -> Probe:
        query = f"?hub={self.ref.hub}" if path.startswith("/api/") else ""
        at = time.monotonic()
        status: int | None = None
        store_up: float | None = None
        detail = ""
        try:
            with urllib.request.urlopen(self.url + path + query, timeout=timeout or self.timeout) as response:
                status = int(response.status)
                body = response.read()
            if path == "/metrics":
                found = _STORE_UP.search(body)
                store_up = float(found.group(1)) if found else None
        except urllib.error.HTTPError as error:
            status = int(error.code)
            detail = _detail(error.read())
        except OSError as error:  # refused, reset, timed out: no answer
            detail = f"{type(error).__name__}: {error}"[:160]
        return Probe(path, at, time.monotonic(), status, store_up, detail)

    def events(self, page: int = 500) -> list[dict[str, object]]:
        """Every balancer event of the fleet's hub in the console's log, in id order (``/api/events``)."""
        out: list[dict[str, object]] = []
        after = 0
        while True:
            url = f"{self.url}/api/events?hub={self.ref.hub}&after={after}&limit={page}"
            with urllib.request.urlopen(url, timeout=self.timeout) as response:
                batch = json.loads(response.read())
            out += batch
            if len(batch) < page:
                return out
            after = int(batch[-1]["id"])

    def poll(self) -> None:
        """Start polling every path from a thread of its own (a slow answer on one does not hold the other)."""
        for path in PATHS:

            def loop(path: str = path) -> None:
                while not self._stop.is_set():
                    self.probes.append(self.request(path))
                    self._stop.wait(self.period)

            thread = threading.Thread(target=loop, name=f"console-poller{path.replace('/', '-')}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop_polling(self) -> list[Probe]:
        """Stop the pollers; returns every probe, by time sent."""
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout + 5)
        self._threads.clear()
        return sorted(self.probes, key=lambda p: p.at)

    def stop(self) -> None:
        self._stop.set()
        if self.process is not None:
            kill(self.process)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no console log)"
        return "--- console\n" + "\n".join(text[-lines:])

    def tracebacks(self) -> int:
        try:
            return self.log.read_text(errors="replace").count("Traceback (most recent call last)")
        except OSError:
            return 0
