"""The hub over TLS (AMQPS, as Azure Event Hubs serves it): a client trusting the hub's CA sends and
receives; one that does not is refused before a byte of AMQP; the plain port, if kept, still works
beside it on the same hubs; ``runhub`` turns TLS on from its options or the environment and never
prints the key."""

from __future__ import annotations

import os
import re
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient
from azure.eventhub.exceptions import ConnectError

from tests.support.waiting import until_sync
from workers.hub.amqp.auth import SasKey
from workers.hub.amqp.server import HubServer
from workers.hub.amqp.thread import ServerThread
from workers.hub.amqp.tls import (
    ENV_CERT,
    ENV_KEY,
    ENV_KEY_PASSWORD,
    TlsConfigError,
    TlsFiles,
    server_context,
    tls_files,
)
from workers.hub.embedded import EmbeddedHub

from .certs import Certificates, available_tools, encrypt_key, make_certificates
from .conftest import Receiving, bodies, start_receiving

ROOT = Path(__file__).resolve().parents[2]
# The SDK's consumer (a processor: claim, attach, receive) took over 10 s under a load average of 70.
RECEIVE_TIMEOUT = 30.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_hub(certs: Certificates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """A server with TLS on a free port and the plain port beside it; hub ``homes`` (2 partitions)."""
    root = tmp_path_factory.mktemp("amqps")
    EmbeddedHub(root, "homes", partitions=2).close()
    server = HubServer(
        root, SasKey.generate(), tls=server_context(TlsFiles(certs.cert, certs.key)), tls_port=0, poll_interval=0.01
    )
    with ServerThread(server) as running:
        yield running


def tls_args(thread: ServerThread, ca: Path | None) -> dict[str, Any]:
    """What an SDK client needs for TLS on a port other than 5671 (the only one it uses by itself)."""
    args: dict[str, Any] = {"custom_endpoint_address": f"sb://127.0.0.1:{thread.tls_port}"}
    if ca is not None:
        args["connection_verify"] = str(ca)
    return args


def test_a_client_trusting_the_hubs_ca_sends_and_receives_over_tls(
    tls_hub: ServerThread, certs: Certificates, receivers: list[Receiving]
) -> None:
    text = tls_hub.server.connection_string(tls=True)
    assert "UseDevelopmentEmulator" not in text  # TLS stays on in the SDK
    with EventHubProducerClient.from_connection_string(text, eventhub_name="homes", **tls_args(tls_hub, certs.ca)) as p:
        assert p.get_partition_ids() == ["0", "1"]
        p.send_batch([EventData(b"over tls"), EventData(b"and again")], partition_id="1")
    consumer = EventHubConsumerClient.from_connection_string(
        text, consumer_group="$Default", eventhub_name="homes", **tls_args(tls_hub, certs.ca)
    )
    receiving = start_receiving(consumer, partition_id="1", starting_position="-1")
    receivers.append(receiving)
    assert bodies(receiving.wait_for(2, timeout=RECEIVE_TIMEOUT))[:2] == [b"over tls", b"and again"]
    assert receiving.errors == []


def test_a_client_that_does_not_trust_the_hubs_certificate_is_refused(tls_hub: ServerThread) -> None:
    text = tls_hub.server.connection_string(tls=True)
    # No connection_verify: the SDK trusts certifi's public authorities only.
    with (
        EventHubProducerClient.from_connection_string(
            text, eventhub_name="homes", retry_total=0, **tls_args(tls_hub, None)
        ) as producer,
        pytest.raises(ConnectError),
    ):
        producer.get_partition_ids()
    # And at the TLS layer itself: the handshake fails on the certificate, before any AMQP.
    context = ssl.create_default_context()
    with (
        socket.create_connection(("127.0.0.1", tls_hub.tls_port or 0), timeout=5) as sock,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        context.wrap_socket(sock, server_hostname="127.0.0.1")


def test_a_certificate_for_another_name_is_refused(tls_hub: ServerThread, certs: Certificates) -> None:
    context = ssl.create_default_context(cafile=str(certs.ca))
    with (
        socket.create_connection(("127.0.0.1", tls_hub.tls_port or 0), timeout=5) as sock,
        pytest.raises(ssl.SSLCertVerificationError, match="match"),
    ):
        context.wrap_socket(sock, server_hostname="eventhubs.example.com")


def test_a_plain_client_on_the_tls_port_gets_no_amqp(tls_hub: ServerThread) -> None:
    with socket.create_connection(("127.0.0.1", tls_hub.tls_port or 0), timeout=5) as sock:
        sock.sendall(b"AMQP\x03\x01\x00\x00")  # the SASL protocol header, in the clear
        received = b""
        try:
            while chunk := sock.recv(4096):
                received += chunk
        except ConnectionResetError:
            pass
    assert not received.startswith(b"AMQP")


def test_the_plain_port_still_serves_the_same_hubs_beside_tls(tls_hub: ServerThread, certs: Certificates) -> None:
    assert tls_hub.server.port not in (None, tls_hub.tls_port)
    tls_text = tls_hub.server.connection_string(tls=True)
    with EventHubProducerClient.from_connection_string(
        tls_text, eventhub_name="homes", **tls_args(tls_hub, certs.ca)
    ) as producer:
        producer.send_event(EventData(b"sent over tls, read in the clear"), partition_id="0")
    plain = tls_hub.server.connection_string()
    assert plain.endswith("UseDevelopmentEmulator=true")
    with EventHubConsumerClient.from_connection_string(plain, consumer_group="$Default", eventhub_name="homes") as c:
        assert c.get_partition_properties("0")["last_enqueued_sequence_number"] >= 0
    receiving = start_receiving(
        EventHubConsumerClient.from_connection_string(plain, consumer_group="$Default", eventhub_name="homes"),
        partition_id="0",
        starting_position="-1",
    )
    try:
        assert b"sent over tls, read in the clear" in bodies(receiving.wait_for(1, timeout=RECEIVE_TIMEOUT))
    finally:
        receiving.close()


@pytest.mark.parametrize("tool", available_tools())
def test_certificates_from_each_tool_serve_tls(tool: str, tmp_path: Path) -> None:
    made = make_certificates(tmp_path, ("localhost", "127.0.0.1"), tool)
    assert made.key.stat().st_mode & 0o777 == 0o600
    root = tmp_path / "hubs"
    EmbeddedHub(root, "one", partitions=1).close()
    server = HubServer(
        root, SasKey.generate(), port=None, tls=server_context(TlsFiles(made.cert, made.key)), tls_port=0
    )
    with ServerThread(server) as running:
        assert running.server.port is None  # TLS only
        context = ssl.create_default_context(cafile=str(made.ca))
        for name in ("localhost", "127.0.0.1"):
            with (
                socket.create_connection(("127.0.0.1", running.port), timeout=5) as sock,
                context.wrap_socket(sock, server_hostname=name) as tls,
            ):
                assert tls.version() in ("TLSv1.2", "TLSv1.3")


# -- the configuration: options, environment, and what is refused -----------------------------------


def test_tls_is_off_unless_a_certificate_and_key_are_named(certs: Certificates) -> None:
    assert tls_files(None, None, env={}) is None
    assert tls_files(None, None, env={ENV_CERT: str(certs.cert), ENV_KEY: str(certs.key)}) == TlsFiles(
        certs.cert, certs.key
    )
    assert tls_files("a.pem", "a.key", env={ENV_CERT: "b.pem", ENV_KEY: "b.key"}) == TlsFiles(
        Path("a.pem"), Path("a.key")
    )
    with pytest.raises(TlsConfigError, match="key"):
        tls_files(str(certs.cert), None, env={})


def test_a_key_readable_by_everyone_or_not_matching_is_refused(certs: Certificates, tmp_path: Path) -> None:
    shared = tmp_path / "shared.key"
    shared.write_bytes(certs.key.read_bytes())
    shared.chmod(0o644)
    with pytest.raises(TlsConfigError, match="readable by everyone"):
        server_context(TlsFiles(certs.cert, shared))
    other = make_certificates(tmp_path / "other")
    with pytest.raises(TlsConfigError, match="cannot use the TLS certificate") as refused:
        server_context(TlsFiles(certs.cert, other.key))
    assert other.key.read_text() not in str(refused.value)


def test_an_encrypted_key_needs_its_password_from_the_environment(certs: Certificates, tmp_path: Path) -> None:
    locked = encrypt_key(certs.key, tmp_path / "locked.key", "s3cret-pass")
    with pytest.raises(TlsConfigError, match=ENV_KEY_PASSWORD):
        server_context(TlsFiles(certs.cert, locked), env={})  # refused, not prompted for on the terminal
    with pytest.raises(TlsConfigError) as wrong:
        server_context(TlsFiles(certs.cert, locked), env={ENV_KEY_PASSWORD: "wrong-pass"})
    assert "wrong-pass" not in str(wrong.value)
    assert isinstance(
        server_context(TlsFiles(certs.cert, locked), env={ENV_KEY_PASSWORD: "s3cret-pass"}), ssl.SSLContext
    )


# -- runhub ------------------------------------------------------------------------------------------


def start_runhub(tmp_path: Path, args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], list[str]]:
    var = tmp_path / "var"
    var.mkdir(exist_ok=True)
    full = {
        **os.environ,
        "LEASEBOARD_VAR_DIR": str(var),
        "LEASEBOARD_HUB_DIR": str(tmp_path / "hub"),
        "PYTHONUNBUFFERED": "1",
        "LEASEBOARD_LOG_LEVEL": "DEBUG",
        **env,
    }
    for name in ("LEASEBOARD_HUB_KEY", ENV_CERT, ENV_KEY, ENV_KEY_PASSWORD):
        if name not in env:
            full.pop(name, None)
    process = subprocess.Popen(
        [sys.executable, "manage.py", "runhub", "--hub", "homes", "--partitions", "2", *args],
        cwd=ROOT,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out: list[str] = []

    def started() -> bool:
        assert process.stdout is not None
        line = process.stdout.readline()
        out.append(line)
        if not line and process.poll() is not None:
            raise AssertionError(f"runhub exited with {process.returncode}: {''.join(out)}")
        return line.startswith("Ctrl-C stops it")

    until_sync(started, "runhub to start", 30)
    return process, out


def printed(out: list[str], name: str) -> str:
    for line in out:
        if line.startswith(f"{name}="):
            return line.strip().split("=", 1)[1]
    raise AssertionError(f"runhub printed no {name}: {''.join(out)}")


def stop(process: subprocess.Popen[str], out: list[str]) -> str:
    """Stops runhub; returns all it printed."""
    process.terminate()
    rest, _ = process.communicate(timeout=15)
    return "".join(out) + rest


def test_runhub_serves_tls_from_its_options_beside_the_plain_port(tmp_path: Path, certs: Certificates) -> None:
    process, out = start_runhub(
        tmp_path, ["--port", "0", "--tls-port", "0", "--tls-cert", str(certs.cert), "--tls-key", str(certs.key)], {}
    )
    try:
        tls_text = printed(out, "EVENTHUB_TLS_CONNECTION_STRING")
        plain_text = printed(out, "EVENTHUB_CONNECTION_STRING")
        assert plain_text.endswith("UseDevelopmentEmulator=true") and "UseDevelopmentEmulator" not in tls_text
        port = int(re.search(r"sb://127\.0\.0\.1:(\d+)/", tls_text).group(1))  # type: ignore[union-attr]
        assert f"custom_endpoint_address='sb://127.0.0.1:{port}'" in "".join(out)
        args: dict[str, Any] = {"custom_endpoint_address": f"sb://127.0.0.1:{port}", "connection_verify": str(certs.ca)}
        with EventHubProducerClient.from_connection_string(tls_text, eventhub_name="homes", **args) as producer:
            producer.send_event(EventData(b"via runhub's tls"), partition_id="0")
        with EventHubProducerClient.from_connection_string(plain_text, eventhub_name="homes") as producer:
            assert producer.get_partition_properties("0")["last_enqueued_sequence_number"] == 0
    finally:
        logged = stop(process, out)
    assert process.returncode == 0
    assert f"TLS certificate {certs.cert}, key {certs.key}" in logged
    assert certs.key.read_text().splitlines()[1] not in logged  # the key's body is never printed


def test_runhub_takes_tls_from_the_environment_and_can_serve_tls_only(tmp_path: Path, certs: Certificates) -> None:
    process, out = start_runhub(
        tmp_path, ["--tls-port", "0", "--no-plain"], {ENV_CERT: str(certs.cert), ENV_KEY: str(certs.key)}
    )
    try:
        text = printed(out, "EVENTHUB_CONNECTION_STRING")
        assert printed(out, "EVENTHUB_TLS_CONNECTION_STRING") == text
        assert "UseDevelopmentEmulator" not in text
        namespace = printed(out, "LEASEBOARD_NAMESPACE")
        args: dict[str, Any] = {"custom_endpoint_address": f"sb://{namespace}", "connection_verify": str(certs.ca)}
        with EventHubProducerClient.from_connection_string(text, eventhub_name="homes", **args) as producer:
            assert producer.get_partition_ids() == ["0", "1"]
    finally:
        logged = stop(process, out)
    assert "AMQPS (TLS) on 127.0.0.1" in logged and "AMQP on" not in logged


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tls-cert", "{cert}"], "the key (--tls-key"),
        (["--no-plain"], "--no-plain needs TLS"),
        (["--tls-cert", "{cert}", "--tls-key", "{missing}"], "is not a file"),
    ],
    ids=["cert-without-key", "no-plain-without-tls", "missing-key"],
)
def test_runhub_refuses_a_tls_setup_it_cannot_serve(
    tmp_path: Path, certs: Certificates, args: list[str], message: str
) -> None:
    var = tmp_path / "var"
    var.mkdir()
    env = {**os.environ, "LEASEBOARD_VAR_DIR": str(var), "LEASEBOARD_HUB_DIR": str(tmp_path / "hub")}
    for name in (ENV_CERT, ENV_KEY):
        env.pop(name, None)
    filled = [a.format(cert=certs.cert, missing=tmp_path / "nowhere.key") for a in args]
    done = subprocess.run(
        [sys.executable, "manage.py", "runhub", "--port", "0", "--tls-port", "0", *filled],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
