"""``manage.py runhub`` as a real process: the connection string it prints works, its key is private,
and it serves the same partition logs that ``EmbeddedHub`` (the embedded source) reads and writes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient

from tests.support.waiting import until_sync
from workers.hub.amqp.keys import KEY_FILE
from workers.hub.embedded import EmbeddedHub
from workers.sources.base import Position

from .conftest import Receiving, bodies, start_receiving

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RunHub:
    process: subprocess.Popen[str]
    connection_string: str
    namespace: str
    var: Path
    hub_dir: Path
    out: list[str]

    def log(self) -> str:
        return (self.var / "runhub.err").read_text(errors="replace")


@pytest.fixture
def runhub(tmp_path: Path) -> Iterator[RunHub]:
    var, hub_dir = tmp_path / "var", tmp_path / "hub"
    var.mkdir()
    env = {
        **os.environ,
        "LEASEBOARD_VAR_DIR": str(var),
        "LEASEBOARD_HUB_DIR": str(hub_dir),
        "PYTHONUNBUFFERED": "1",
        "LEASEBOARD_LOG_LEVEL": "DEBUG",
    }
    env.pop("LEASEBOARD_HUB_KEY", None)
    with (var / "runhub.err").open("w") as err:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "runhub", "--port", "0", "--hub", "homes", "--partitions", "3"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    out: list[str] = []
    assert process.stdout is not None

    def connection_string() -> str | None:
        line = process.stdout.readline() if process.stdout else ""
        if line:
            out.append(line)
        if process.poll() is not None:
            raise AssertionError(f"runhub exited with {process.returncode}: {''.join(out)}")
        found = re.match(r"EVENTHUB_CONNECTION_STRING=(\S+)", line)
        return found.group(1) if found else None

    found = until_sync(connection_string, "the connection string", 30)
    namespace = process.stdout.readline()
    out.append(namespace)
    assert namespace.startswith("LEASEBOARD_NAMESPACE="), namespace
    running = RunHub(process, found, namespace.strip().split("=", 1)[1], var, hub_dir, out)
    yield running
    if process.poll() is None:
        process.kill()
        process.wait(10)


def test_runhub_prints_a_working_connection_string_and_keeps_its_key_private(runhub: RunHub) -> None:
    key_file = runhub.var / KEY_FILE
    key = key_file.read_text().strip()
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert f"SharedAccessKey={key};" in runhub.connection_string
    assert runhub.connection_string.startswith("Endpoint=sb://127.0.0.1:")
    assert runhub.connection_string.endswith(";UseDevelopmentEmulator=true")
    port = runhub.connection_string.split(";")[0].rsplit(":", 1)[1]
    assert runhub.namespace == f"127.0.0.1:{port}"  # what Microsoft's processor calls it in blob names
    with EventHubProducerClient.from_connection_string(runhub.connection_string, eventhub_name="homes") as client:
        assert client.get_partition_ids() == ["0", "1", "2"]
    runhub.process.send_signal(signal.SIGTERM)
    assert runhub.process.wait(15) == 0
    logged = runhub.log() + "".join(line for line in runhub.out if "CONNECTION_STRING" not in line)
    assert "embedded hub serving AMQP" in logged
    assert key not in logged


def test_runhub_serves_the_log_the_embedded_hub_reads_and_partitions_added_while_it_runs(
    runhub: RunHub, receivers: list[Receiving]
) -> None:
    hub = EmbeddedHub(runhub.hub_dir, "homes")
    hub.send(b"written by another process", partition_id="1")
    receiving = start_receiving(
        EventHubConsumerClient.from_connection_string(
            runhub.connection_string, consumer_group="$Default", eventhub_name="homes"
        ),
        partition_id="1",
        starting_position="-1",
    )
    receivers.append(receiving)
    assert bodies(receiving.wait_for(1)) == [b"written by another process"]

    hub.add_partitions(5)
    with EventHubProducerClient.from_connection_string(runhub.connection_string, eventhub_name="homes") as client:
        until_sync(lambda: client.get_partition_ids() == ["0", "1", "2", "3", "4"], "the new partitions to be served")
        client.send_event(EventData(b"sent over AMQP"), partition_id="4")
        client.send_event(EventData(b"and to an old one"), partition_id="1")
    reader = hub.reader("4", Position())
    assert [e.body for e in reader.receive(10)] == [b"sent over AMQP"]
    reader.close()
    assert bodies(receiving.wait_for(2))[1] == b"and to an old one"
