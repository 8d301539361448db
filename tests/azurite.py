"""Azurite, the Azure Storage emulator from npm, as a test server on a free loopback port.

``start_azurite()`` returns a running ``Azurite``; ``kill()`` stops the process but keeps its data
and port (an outage), ``start()`` brings it back, ``stop()`` ends it and deletes the data. The
binary is the one ``.ci/system-deps.sh`` installs into ``var/node`` (``$LEASEBOARD_AZURITE`` or
``azurite-blob`` on ``$PATH`` otherwise), run directly so there is one process id to stop.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.servers import ServerError, start_on_a_free_port, wait_until_ready

ROOT = Path(__file__).resolve().parent.parent
ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (public, in Microsoft's documentation): not a secret.
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_binary() -> Path:
    """Where ``azurite-blob`` is; ServerError saying how to install it when it is nowhere."""
    configured = os.environ.get("LEASEBOARD_AZURITE")
    candidates = [Path(configured)] if configured else []
    candidates.append(ROOT / "var" / "node" / "node_modules" / ".bin" / "azurite-blob")
    found = shutil.which("azurite-blob")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise ServerError("azurite-blob not found: run .ci/system-deps.sh (or make test), or set LEASEBOARD_AZURITE")


def connection_string(port: int, host: str = "127.0.0.1") -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
        f"BlobEndpoint=http://{host}:{port}/{ACCOUNT};"
    )


def _listening(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


@dataclass
class Azurite:
    """One Azurite blob service and its data directory."""

    port: int
    location: Path
    host: str = "127.0.0.1"
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def connection_string(self) -> str:
        return connection_string(self.port, self.host)

    @property
    def log_path(self) -> Path:
        return self.location / "azurite.log"

    def start(self, timeout: float = 15.0) -> None:
        """Start (or restart) the service on its port and data; return once it accepts connections."""
        if self.process is not None and self.process.poll() is None:
            return
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed by kill())
        self.process = subprocess.Popen(
            [
                str(azurite_binary()),
                "--blobHost", self.host, "--blobPort", str(self.port), "--location", str(self.location),
                "--skipApiVersionCheck", "--loose", "--disableTelemetry",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until_ready(
            self.process, lambda: _listening(self.host, self.port), timeout, f"Azurite on port {self.port}",
            self.log_path, self.kill,
        )  # fmt: skip

    def kill(self) -> None:
        """Stop the process, keeping the data and the port for ``start()`` (an outage)."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(5)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(5)
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        """Stop the process and delete its data (idempotent)."""
        self.kill()
        shutil.rmtree(self.location, ignore_errors=True)


def start_azurite(attempts: int = 3) -> Azurite:
    """A running Azurite blob service on a free loopback port with a fresh data directory."""
    location = Path(tempfile.mkdtemp(prefix="leaseboard-azurite-"))
    return start_on_a_free_port(
        lambda port: Azurite(port, location), "EADDRINUSE",
        lambda: shutil.rmtree(location, ignore_errors=True), attempts,
    )  # fmt: skip
