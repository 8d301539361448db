"""Graceful edges: SIGTERM and SIGINT drain in bounded time, a store that is not up at start is
retried with backoff and a clear message, and configuration errors are refused in one line.

``runworkers`` waits for its stores before its workers start (``workers.wiring``'s probe: one
line per try); the workers themselves back off too if their first cycle fails (``EventProcessor``,
which ``serve`` and embedded workers use as well): both are tested here."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from balancer.lease import Coordinator
from balancer.model import HubRef
from balancer.stores.memory import MemoryStore
from balancer.strategies import get_strategy
from tests.support import migrated
from tests.support.azurite import Azurite
from tests.support.servers import free_port
from tests.support.waiting import until
from workers.hub.embedded import EmbeddedHub
from workers.runtime.processor import EventProcessor
from workers.runtime.sink import EventSink

ROOT = Path(__file__).resolve().parents[2]
HUB = "edges"


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated SQLite file for the dashboard tables of the worker processes (their event log)."""
    path = tmp_path_factory.mktemp("edges") / "db.sqlite3"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{path}"}
    migrated.migrate(env)  # a copy: tests/support/migrated.py
    return f"sqlite:///{path}"


@pytest.fixture
def env(tmp_path: Path, database: str) -> dict[str, str]:
    (tmp_path / "records").mkdir()
    hub = EmbeddedHub(tmp_path / "hub", HUB, partitions=4)
    for pid in hub.partition_ids():
        hub.send_batch([b'{"n": 1}'] * 20, partition_id=pid)
    hub.close()
    return {
        **os.environ,
        "DATABASE_URL": database,
        "LEASEBOARD_VAR_DIR": str(tmp_path / "var"),
        "LEASEBOARD_HUB_DIR": str(tmp_path / "hub"),
        "LEASEBOARD_RECORD_DIR": str(tmp_path / "records"),
        "LEASEBOARD_DEADLETTER_DIR": str(tmp_path / "deadletter"),
        "LEASEBOARD_LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    }


def _default_sigint() -> None:
    # A child of a backgrounded shell inherits SIGINT ignored; the test presses Ctrl-C as a user would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def start(tmp_path: Path, env: dict[str, str]) -> Iterator[Any]:
    processes: list[subprocess.Popen[bytes]] = []

    def run(*options: str, extra: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"worker{len(processes)}.log"
        command = [
            sys.executable,
            "manage.py",
            "runworkers",
            "--owner-prefix",
            "edge",
            "--hub",
            HUB,
            "--source",
            "embedded",
            "--interval",
            "0.5",
            "--expiry",
            "3",
            *options,
        ]
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**env, **(extra or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_default_sigint,
            )
        processes.append(process)
        return process, log

    yield run
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def logged(log: Path) -> Callable[[], str]:
    """What a failed wait adds: the worker's log."""
    return lambda: log.read_text(errors="replace")


def handled(tmp_path: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in (tmp_path / "records").glob("*.csv"))


# signals -------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_drains_every_partition_to_a_final_checkpoint_and_exits_0(
    signum: signal.Signals, start: Any, tmp_path: Path
) -> None:
    process, log = start("--store", "memory", "--handler", "tests.chaos.recording.Recorder")
    await until(lambda: handled(tmp_path) == 80, "the 80 events to be handled", 30, detail=logged(log))
    sent = time.monotonic()
    process.send_signal(signum)
    assert await asyncio.to_thread(process.wait, 15) == 0
    assert time.monotonic() - sent < 10
    text = log.read_text()
    assert f"{signum.name}: stopping 1 worker(s): finishing events in hand, checkpointing, releasing" in text
    for pid in "0123":
        assert f"partition {pid} (edge-0): pump stopped after 20 events (checkpoint at 19)" in text
    assert "worker edge-0 stopped" in text and "Traceback" not in text


@pytest.mark.slow
async def test_a_handler_that_never_returns_does_not_hold_up_sigterm_beyond_the_shutdown_timeout(
    start: Any, tmp_path: Path
) -> None:
    process, log = start("--store", "memory", "--handler", "tests.chaos.recording.stuck", "--shutdown-timeout", "1")
    await until(lambda: (tmp_path / "records" / "stuck").exists(), "the handler to get stuck", 30, detail=logged(log))
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(process.wait, 15) == 0
    assert time.monotonic() - sent < 5  # one shutdown timeout for the pumps, the release is immediate
    assert "still busy after 1s; releasing it anyway" in log.read_text()


# a store that is not up yet ------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_store_that_is_down_at_start_is_retried_with_backoff_and_a_clear_line_per_try(
    start: Any, tmp_path: Path
) -> None:
    azurite = Azurite(free_port(), tmp_path / "azurite")
    azurite.location.mkdir()
    process, log = start(
        "--store",
        "blob",
        "--handler",
        "tests.chaos.recording.Recorder",
        extra={"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string, "LEASEBOARD_BLOB_CONTAINER": "edges"},
    )
    try:
        await until(lambda: "is not reachable" in log.read_text(), "the first failed try", 30, detail=logged(log))
        down_since = time.monotonic()
        await asyncio.sleep(4.0)
        await asyncio.to_thread(azurite.start)
        await until(
            lambda: handled(tmp_path) == 80, "the worker to recover and handle every event", 40, detail=logged(log)
        )
        down = time.monotonic() - down_since
        lines = log.read_text().splitlines()
        tries = [line for line in lines if "is not reachable" in line]
        assert all("cannot reach the service" in t and f"127.0.0.1:{azurite.port}" in t for t in tries)
        waits = [float(t.rsplit("retrying in ", 1)[1].rstrip("s")) for t in tries]
        assert waits == [min(2.0**i, 30.0) for i in range(len(waits))]  # 1 s, doubling, at most 30 s
        assert len(tries) <= 4 < down  # every second it would have been tried more than 4 times
        assert sum("answers now" in line for line in lines) == 1
        assert "Traceback" not in log.read_text()
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 15) == 0
    finally:
        azurite.stop()


async def test_before_its_first_cycle_a_worker_backs_off_and_once_it_holds_leases_it_does_not(tmp_path: Path) -> None:
    store = MemoryStore()
    store.down = True
    ref = HubRef("edges", "backoff", "$Default")
    delays: list[float] = []
    now = [1000.0]  # the coordinator's clock stands still (no wait really passes): a busy machine changes no delay
    processor: EventProcessor

    def sleep(seconds: float) -> Coroutine[Any, Any, None]:
        # The processor hands this sleep to its pumps too; only its own cycle waits (``_wait``) are
        # counted. A pump's waits (a poll, a paused lease's check, an idle wait) and the processor's
        # timer for its pumps' lease deadlines are told by their caller and made short.
        caller = sys._getframe(1)
        if caller.f_locals.get("self") is not processor or caller.f_code.co_name != "_wait":
            return asyncio.sleep(0.001)
        return cycle_wait(seconds)

    async def cycle_wait(seconds: float) -> None:
        delays.append(round(seconds, 3))
        if len(delays) == 9 or len(delays) == 12:
            store.down = False  # back after 9 tries at start; then down again for good
        elif len(delays) == 10:
            store.down = True
        elif len(delays) == 14:
            processor.stop()
        await asyncio.sleep(0)

    hub = EmbeddedHub(tmp_path, "backoff", partitions=1)

    async def partitions() -> tuple[str, ...]:
        return hub.partition_ids()

    coordinator = Coordinator(
        ref,
        "w",
        store,
        partitions,
        get_strategy("balanced"),
        expiry=3.0,
        on_event=EventSink(),
        rng=random.Random(0),
        monotonic=lambda: now[0],
    )
    processor = EventProcessor(
        coordinator,
        checkpoints=store,
        source=hub,
        handler=lambda e, ctx: None,
        interval=0.5,
        jitter=0.0,
        sleep=sleep,
        shutdown_timeout=1.0,
    )
    await asyncio.wait_for(processor.run(), 10)
    hub.close()
    assert delays[:9] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]  # doubling, at most 30 s
    # A cycle worked: it announced the worker, so the next comes a quarter interval later, then every
    # interval from then on, outage or not.
    assert delays[9:] == [0.125] + [0.5] * 4


# configuration errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--strategy", "fastest"], "unknown strategy 'fastest'; choose one of: "),
        (["--interval", "2", "--expiry", "1"], r"^--expiry \(1s\) must be longer than --interval \(2s\)$"),
        (["--count", "-1"], "^--count must be at least 1, got -1$"),
        (["--checkpoint-events", "0"], "^--checkpoint-events must be at least 1, got 0$"),
        (["--checkpoint-seconds", "-1"], "^--checkpoint-seconds must be more than 0, got -1$"),
        (["--shutdown-timeout", "0"], "^--shutdown-timeout must be more than 0, got 0$"),
        (["--metrics-port", "70000"], r"^--metrics-port must be a TCP port \(1-65535, or 0 for none\), got 70000$"),
        (["--handler", "tests.nowhere.handle"], "cannot import module 'tests.nowhere'"),
    ],
)
def test_a_bad_option_is_refused_at_start_in_one_line_naming_it(options: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message) as refused:
        call_command("runworkers", "--store", "memory", *options)
    assert "\n" not in str(refused.value)


def test_settings_from_the_environment_are_named_when_they_cannot_work(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.LEASEBOARD_INTERVAL, settings.LEASEBOARD_EXPIRY = 2.0, 1.0
    expiry = r"^LEASEBOARD_EXPIRY \(1s\) must be longer than LEASEBOARD_INTERVAL \(2s\)$"
    with pytest.raises(CommandError, match=expiry):
        call_command("runworkers", "--store", "memory")
    settings.LEASEBOARD_INTERVAL, settings.LEASEBOARD_EXPIRY = 2.0, 10.0
    settings.LEASEBOARD_CHECKPOINT_SECONDS = 0.0
    with pytest.raises(CommandError, match=r"^LEASEBOARD_CHECKPOINT_SECONDS must be more than 0, got 0$"):
        call_command("runworkers", "--store", "memory")
    settings.LEASEBOARD_CHECKPOINT_SECONDS = 1.0
    monkeypatch.setenv("LEASEBOARD_CLOCK_SKEW", "soon")
    with pytest.raises(CommandError, match=r"^LEASEBOARD_CLOCK_SKEW must be a number of seconds, got 'soon'$"):
        call_command("runworkers", "--store", "memory")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("LEASEBOARD_INTERVAL", "abc", "Error: LEASEBOARD_INTERVAL must be a number, got 'abc'"),
        ("LEASEBOARD_PARTITIONS", "-3", "Error: LEASEBOARD_PARTITIONS must be at least 1, got -3"),
    ],
)
def test_a_bad_environment_value_is_refused_in_one_line_not_a_traceback(
    variable: str, value: str, message: str
) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "runworkers", "--store", "memory"],
        cwd=ROOT,
        env={**os.environ, variable: value},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == message
