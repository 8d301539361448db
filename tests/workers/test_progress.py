"""Progress of long work (``workers.progress``): a rich line on a terminal, nothing when piped or with --json.

The commands run as child processes, once with pipes and once on a pseudo-terminal (``pty``), read
until the terminal closes; the pipeline runs in this process with a forced-terminal console.
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from rich.console import Console

from balancer.sim.run import simulate
from tests.pipeline.conftest import HUB, Landing, fleet_events, landing, spark  # noqa: F401  (fixtures)
from workers import progress as progress_module
from workers.pipeline import audit
from workers.progress import progress

REPO = Path(__file__).resolve().parents[2]
ESCAPE = b"\x1b["
SIMULATE = ["simulate", "--scenario", "cold-start", "--partitions", "8", "--workers", "2", "--seeds", "3"]


def environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR")}
    return {**env, "LEASEBOARD_HUB_DIR": str(tmp_path / "hub"), "COLUMNS": "160", "TERM": "xterm"}


def piped(args: list[str], tmp_path: Path) -> tuple[bytes, bytes]:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=environment(tmp_path),
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
        check=True,
    )
    return done.stdout, done.stderr


def on_terminal(args: list[str], tmp_path: Path, *, stdout_to: Path | None = None) -> bytes:
    """What the command shows on a pseudo-terminal (stderr, and stdout unless ``stdout_to`` a file)."""
    master, slave = pty.openpty()
    out = open(stdout_to, "wb") if stdout_to is not None else None  # noqa: SIM115  (closed below)
    try:
        child = subprocess.Popen(
            [sys.executable, "manage.py", *args],
            cwd=REPO,
            env=environment(tmp_path),
            stdin=subprocess.DEVNULL,
            stdout=out if out is not None else slave,
            stderr=slave,
        )
    finally:
        os.close(slave)
        if out is not None:
            out.close()
    chunks = []
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child is gone and the terminal closed
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    assert child.wait(timeout=300) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks)


def without_plan_time(text: str) -> str:
    """The summary without the one wall-clock figure (the rest is the same for the same seeds)."""
    return re.sub(r"plan time .*", "plan time", text)


def without_timing(text: str) -> str:
    return re.sub(r" in [0-9.]+ s \([0-9]+ events/s\)", "", text)


# the helper ------------------------------------------------------------------------------------


def test_off_the_terminal_every_method_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "on_terminal", lambda: False)
    with progress("work", total=3) as task:
        assert not task.enabled
        task.advance()
        task.update(info="x", total=5)
        task.flush()
    with progress("work", total=3, console=Console(file=io.StringIO(), force_terminal=True), enabled=False) as task:
        assert not task.enabled


def test_a_terminal_shows_description_counts_rate_and_time_left() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=160)
    with progress("seeds of cold-start", total=3, unit="seeds", console=console, info="almost") as task:
        assert task.enabled
        for _ in range(3):
            task.advance()
    shown = screen.getvalue()
    assert "seeds of cold-start" in shown and "3/3" in shown and "seeds/s" in shown, shown
    assert "eta" in shown and "almost" in shown and "\x1b[" in shown, shown


def test_a_task_opened_while_one_is_live_joins_its_line() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=160)
    with progress("benchmarks", total=2, console=console) as outer:
        with progress("inner rows", total=4, unit="rows") as inner:  # no console: joins the live one
            assert inner.enabled
            inner.advance(4)
        outer.advance()
    assert "inner rows" in screen.getvalue() and "4/4" in screen.getvalue()
    assert progress_module._live is None  # the display ended with its last task


def test_the_simulator_calls_on_seed_after_each_seed_and_returns_the_same_result() -> None:
    seen: list[int] = []
    with_callback = simulate(None, "cold-start", 8, 2, 3, on_seed=seen.append)
    plain = simulate(None, "cold-start", 8, 2, 3)
    assert seen == [0, 1, 2]
    assert {k: v for k, v in with_callback.items() if k != "plan_ms"} == {
        k: v for k, v in plain.items() if k != "plan_ms"
    }


# simulate ----------------------------------------------------------------------------------------


def test_simulate_piped_is_quiet(tmp_path: Path) -> None:
    out, err = piped(SIMULATE, tmp_path)
    assert err == b"" and ESCAPE not in out
    assert out.decode().startswith("cooperative / cold-start: 8 partitions")
    out, err = piped([*SIMULATE, "--json"], tmp_path)
    assert err == b"" and ESCAPE not in out
    assert json.loads(out)["seeds"] == 3


def test_simulate_on_a_terminal_shows_progress_and_the_same_summary(tmp_path: Path) -> None:
    shown = on_terminal(SIMULATE, tmp_path)
    assert ESCAPE in shown and b"seeds/s" in shown and b"3/3" in shown, shown
    out, _ = piped(SIMULATE, tmp_path)
    assert without_plan_time(out.decode()).splitlines()[0] in shown.decode()


def test_simulate_with_a_redirected_stdout_writes_it_unchanged(tmp_path: Path) -> None:
    shown = on_terminal(SIMULATE, tmp_path, stdout_to=tmp_path / "out.txt")
    assert b"seeds/s" in shown  # stderr is the terminal: the line shows there
    written = (tmp_path / "out.txt").read_bytes()
    out, _ = piped(SIMULATE, tmp_path)
    assert ESCAPE not in written and without_plan_time(written.decode()) == without_plan_time(out.decode())


def test_simulate_with_json_on_a_terminal_shows_no_progress(tmp_path: Path) -> None:
    shown = on_terminal([*SIMULATE, "--json"], tmp_path)
    assert ESCAPE not in shown
    assert json.loads(shown)["seeds"] == 3


# produce -----------------------------------------------------------------------------------------

PRODUCE = ["produce", "--rate", "0", "--count", "3000", "--seed", "5", "--partitions", "4"]


def test_produce_piped_is_quiet_and_on_a_terminal_shows_progress(tmp_path: Path) -> None:
    out, err = piped([*PRODUCE, "--hub", "piped"], tmp_path)
    assert err == b"" and ESCAPE not in out
    assert out.decode().startswith("wrote 3000 events to hub 'piped' (4 partitions)")

    shown = on_terminal([*PRODUCE, "--hub", "shown"], tmp_path, stdout_to=tmp_path / "out.txt")
    assert ESCAPE in shown and b"events/s" in shown and b"/3000" in shown, shown
    written = (tmp_path / "out.txt").read_text()
    assert without_timing(written) == without_timing(out.decode()).replace("'piped'", "'shown'")


# runpipeline --once ------------------------------------------------------------------------------


@pytest.fixture
def forced_terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=240)
    monkeypatch.setattr(progress_module, "terminal_console", lambda: console)
    yield screen


def test_pending_files_and_rows_come_from_the_landing_and_the_source_log(landing: Landing) -> None:  # noqa: F811
    readings = fleet_events(30)
    landing.land("0", 0, [e.to_json() for e in readings[:10]])
    landing.land("1", 0, [e.to_json() for e in readings[10:]])
    paths = landing.paths
    files = audit.pending(paths.landing, paths.checkpoint)
    assert len(files) == 2 and audit.rows(files) == 30
    log = paths.checkpoint / "sources" / "0"
    log.mkdir(parents=True)
    (log / "0").write_text("v1\n" + json.dumps({"path": files[0].as_uri(), "batchId": 0}) + "\n")
    assert audit.pending(paths.landing, paths.checkpoint) == files[1:]


@pytest.mark.django_db(transaction=True)
def test_runpipeline_once_shows_batches_and_events_on_a_terminal_only(
    spark: Any,  # noqa: F811
    landing: Landing,  # noqa: F811
    settings: Any,
    forced_terminal: io.StringIO,
) -> None:
    settings.LEASEBOARD_LANDING_DIR = landing.root
    settings.LEASEBOARD_PIPELINE_DIR = landing.pipeline
    settings.LEASEBOARD_DEADLETTER_DIR = landing.dead
    bodies = [e.to_json() for e in fleet_events(120, seed=3)]
    landing.land("0", 0, bodies[:60])
    out = io.StringIO()
    call_command("runpipeline", "--hub", HUB, "--master", "local[2]", "--once", stdout=out)
    shown = forced_terminal.getvalue()
    assert "1 batches, 60 events written, 0 files left" in shown and "60/60" in shown, shown
    assert "\x1b[" not in out.getvalue() and "1 batches: 60 events" in out.getvalue()

    landing.land("1", 0, bodies[60:])
    forced_terminal.truncate(0)
    forced_terminal.seek(0)
    call_command("runpipeline", "--hub", HUB, "--master", "local[2]", "--once", stdout=out)
    assert "60/60" in forced_terminal.getvalue() and "2 batches" not in forced_terminal.getvalue()
