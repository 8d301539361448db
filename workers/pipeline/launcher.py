"""``runpipeline`` as a child process, for ``manage.py serve`` (the demo) and the latency benchmark.

The job needs its own JVM; a child process keeps it out of the serving process's event loop and
lets Ctrl-C stop it like any other worker: SIGTERM, then a bounded wait, then SIGKILL (a batch
cut short is replayed by the next run, so even the kill loses nothing).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("leaseboard.pipeline")
MANAGE = Path(__file__).resolve().parents[2] / "manage.py"
# Seconds between two micro-batch starts (``runpipeline --trigger-seconds``): a batch that takes longer
# is followed at once by the next. Short, so an event waits for at most about one batch before its own.
DEFAULT_TRIGGER_SECONDS = 0.5


def start_pipeline(
    hub: str,
    log_path: Path,
    *,
    master: str = "local[2]",
    trigger_seconds: float = DEFAULT_TRIGGER_SECONDS,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``manage.py runpipeline`` for ``hub``, its output appended to ``log_path``; returns the process."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        str(MANAGE),
        "runpipeline",
        "--hub",
        hub,
        "--master",
        master,
        "--trigger-seconds",
        f"{trigger_seconds:g}",
    ]
    with log_path.open("ab") as out:
        process = subprocess.Popen(
            command,
            cwd=MANAGE.parent,
            env=dict(env if env is not None else os.environ),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the terminal goes to serve, which stops us in order
        )
    log.info("pipeline of hub %s started (pid %d, %s), log in %s", hub, process.pid, master, log_path)
    return process


def stop_pipeline(process: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """SIGTERM ``process`` and wait up to ``timeout`` s, then SIGKILL it; returns its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("pipeline (pid %d) did not stop within %gs; killing it", process.pid, timeout)
            process.kill()
    return process.wait()
