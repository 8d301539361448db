"""Azurite, the Azure Storage emulator from npm, as a test server on a free loopback port.

``start_azurite()`` returns a running ``Azurite``; ``kill()`` stops the process but keeps its data
and port (an outage), ``start()`` brings it back, ``stop()`` ends it and deletes the data. The
binary is the one ``.ci/system-deps.sh`` installs into ``var/node`` (``$LEASEBOARD_AZURITE`` or
``azurite-blob`` on ``$PATH`` otherwise), run directly so there is one process group to stop.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from tests.support import reaper
from tests.support.servers import HOST, ServerError, ServerProcess, start_on_a_free_port

ROOT = Path(__file__).resolve().parents[2]
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


def connection_string(port: int, host: str = HOST) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
        f"BlobEndpoint=http://{host}:{port}/{ACCOUNT};"
    )


class Azurite(ServerProcess):
    """One Azurite blob service and its data directory ``location``."""

    name = "azurite"
    in_use = "EADDRINUSE"

    def __init__(self, port: int, location: Path, host: str = HOST) -> None:
        super().__init__(port, location, host)

    @property
    def location(self) -> Path:
        return self.home

    @property
    def connection_string(self) -> str:
        return connection_string(self.port, self.host)

    @property
    def log_path(self) -> Path:
        return self.home / "azurite.log"

    def command(self) -> list[str]:
        return [
            str(azurite_binary()),
            "--blobHost",
            self.host,
            "--blobPort",
            str(self.port),
            "--location",
            str(self.home),
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",
        ]

    def kill(self) -> None:
        """Stop the process, keeping the data and the port for ``start()`` (an outage).

        A clean shutdown, not SIGKILL: Azurite keeps its metadata in memory (LokiJS, saved every
        5 s and on SIGTERM), so a SIGKILL would lose blobs the real service would have kept."""
        self.shutdown()


def start_azurite(attempts: int = 3) -> Azurite:
    """A running Azurite blob service on a free loopback port with a fresh data directory."""
    location = Path(tempfile.mkdtemp(prefix="leaseboard-azurite-"))
    reaper.remove_on_exit(location)  # if this process is killed before it stops the server
    return start_on_a_free_port(lambda port: Azurite(port, location), attempts)
