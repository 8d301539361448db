"""Bad input: every case is answered with an AMQP error and logged; the hub serves on, stored events intact.

The server here has short handshake (0.5 s) and idle (1 s) timeouts so half-open and silent
connections are closed quickly; the raw client (``rawclient``) sends what the SDK would refuse to.
"""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Iterator

import pytest
from azure.eventhub import EventData
from proton import Message

from tests.support.waiting import until_sync
from workers.hub.amqp import frames
from workers.hub.amqp.auth import SasKey
from workers.hub.amqp.connection import Limits
from workers.hub.embedded import EmbeddedHub
from workers.sources.base import Position

from .conftest import Receiving, Served, body, consumer, producer, serve, start_receiving
from .rawclient import RawClient, read_until_eof

STORED = [b"first", b"second", b"third"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("amqp-bad")
    with EmbeddedHub(root, "sensors", partitions=2) as hub:
        hub.send_batch(STORED, partition_id="1")
    running = serve(root, Limits(idle_timeout=1.0, handshake_timeout=0.5, max_frame_size=64 * 1024))
    yield running
    running.thread.stop()


@pytest.fixture
def hub(served: Served) -> Iterator[EmbeddedHub]:
    with EmbeddedHub(served.root, "sensors") as hub:
        yield hub


@pytest.fixture(autouse=True)
def still_serving(served: Served, hub: EmbeddedHub) -> Iterator[None]:
    """After every test: the stored events are intact and a new client is served."""
    yield
    reader = hub.reader("1", Position())
    assert [e.body for e in reader.receive(100)][:3] == STORED
    reader.close()
    client = RawClient(served.port)
    try:
        client.open()
        assert client.authorize(served.key, f"sb://127.0.0.1:{served.port}/sensors") == 202
    finally:
        client.close()


def closing_error(raw: bytes) -> tuple[str, str]:
    """(condition, description) of the close frame in what a server wrote before EOF."""
    splitter = frames.FrameSplitter(1 << 24)
    for item in splitter.feed(raw):
        if isinstance(item, frames.Frame) and item.kind == 0 and item.body:
            code, fields, _ = frames.decode(item.body)
            if code == frames.CLOSE and fields and fields[0] is not None:
                condition, description = fields[0].value[0], fields[0].value[1]
                return str(condition), str(description)
    raise AssertionError(f"no close frame with an error in {raw[:200]!r}")


def test_bytes_that_are_not_amqp_get_a_protocol_header_and_the_connection_closes(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = read_until_eof(sock)
    assert raw.startswith(b"AMQP")  # what a server speaks, then EOF


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">IBBH", 12, 2, 0, 0) + b"\x00\x53\x10\xff",  # an open whose list has a bad constructor
        struct.pack(">IBBH", 0x7FFFFFFF, 2, 0, 0) + b"\x00" * 8,  # a frame size no server takes
        struct.pack(">IBBH", 8, 1, 0, 0),  # a data offset inside the frame header
    ],
    ids=["undecodable-performative", "huge-frame", "bad-data-offset"],
)
def test_a_malformed_frame_is_answered_with_a_connection_error(
    served: Served, frame: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="leaseboard.amqp"):
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
            sock.sendall(frames.AMQP_HEADER + frame)
            raw = read_until_eof(sock)
        condition, _ = closing_error(raw)
    assert condition in ("amqp:connection:framing-error", "amqp:decode-error")
    assert any(condition in r.getMessage() or "bad frame" in r.getMessage() for r in caplog.records)


def test_unknown_link_addresses_are_detached_with_not_found_and_the_connection_serves_on(
    served: Served, hub: EmbeddedHub, caplog: pytest.LogCaptureFixture
) -> None:
    client = RawClient(served.port)
    try:
        client.open()
        assert client.authorize(served.key, f"sb://127.0.0.1:{served.port}/") == 202  # the whole namespace
        with caplog.at_level(logging.WARNING, logger="leaseboard.amqp"):
            unknown_hub = client.sender("amqps://127.0.0.1/no-such-hub")
            nonsense = client.sender("sensors/Consumers/What")
            no_partition = client.receiver("sensors/ConsumerGroups/$Default/Partitions/7")
            bad_filter = client.receiver(
                "sensors/ConsumerGroups/$Default/Partitions/0", "amqp.annotation.x-opt-offset < '3'"
            )
            assert client.detached(unknown_hub).name == "amqp:not-found"
            assert client.detached(nonsense).name == "amqp:not-found"
            assert client.detached(no_partition).name == "com.microsoft:argument-out-of-range"
            assert client.detached(bad_filter).name == "amqp:invalid-field"
        assert sum("refused link" in r.getMessage() for r in caplog.records) >= 4
        good = client.sender("sensors/Partitions/0")
        delivery = client.send(good, Message(body=b"after the refusals", inferred=True).encode())
        client.pump(lambda: delivery.remote_state, what="the outcome")
        assert delivery.remote_state == delivery.ACCEPTED
    finally:
        client.close()
    reader = hub.reader("0", Position())
    assert b"after the refusals" in [e.body for e in reader.receive(100)]
    reader.close()


def test_a_link_without_a_token_is_refused_as_unauthorized(served: Served) -> None:
    client = RawClient(served.port)
    try:
        client.open()
        link = client.sender("sensors/Partitions/0")
        assert client.detached(link).name == "amqp:unauthorized-access"
        assert client.authorize(SasKey(served.key.name, "wrong"), "sb://x/sensors") == 401  # a token of another key
    finally:
        client.close()


def test_an_oversize_message_detaches_the_link_and_stores_nothing(
    served: Served, hub: EmbeddedHub, caplog: pytest.LogCaptureFixture
) -> None:
    before = hub.properties("0").last_enqueued_sequence_number
    client = RawClient(served.port)
    try:
        client.open()
        assert client.authorize(served.key, f"sb://127.0.0.1:{served.port}/sensors") == 202
        link = client.sender("sensors/Partitions/0")
        assert link.remote_max_message_size == 1024 * 1024
        with caplog.at_level(logging.WARNING, logger="leaseboard.amqp"):
            client.send(link, Message(body=b"x" * (1536 * 1024), inferred=True).encode())
            condition = client.detached(link, timeout=10)
        assert condition.name == "amqp:link:message-size-exceeded"
        assert any("max-message-size" in r.getMessage() or "limit" in r.getMessage() for r in caplog.records)
        small = client.sender("sensors/Partitions/0")
        delivery = client.send(small, Message(body=b"small", inferred=True).encode())
        client.pump(lambda: delivery.remote_state, what="the outcome of a small message")
        assert delivery.remote_state == delivery.ACCEPTED
    finally:
        client.close()
    assert hub.properties("0").last_enqueued_sequence_number == before + 1


def test_a_transfer_that_is_not_an_event_is_rejected_and_the_link_stays(served: Served, hub: EmbeddedHub) -> None:
    before = hub.properties("0").last_enqueued_sequence_number
    client = RawClient(served.port)
    try:
        client.open()
        assert client.authorize(served.key, f"sb://127.0.0.1:{served.port}/sensors") == 202
        link = client.sender("sensors/Partitions/0")
        bad = client.send(link, b"\x00\x53\x75\xff\x00")  # a data section with a constructor that does not exist
        client.pump(lambda: bad.remote_state, what="the outcome")
        assert bad.remote_state == bad.REJECTED and bad.remote.condition.name == "amqp:decode-error"
        good = client.send(link, Message(body=b"fine", inferred=True).encode())
        client.pump(lambda: good.remote_state, what="the outcome")
        assert good.remote_state == good.ACCEPTED
    finally:
        client.close()
    assert hub.properties("0").last_enqueued_sequence_number == before + 1


@pytest.mark.parametrize("first_bytes", [b"", frames.SASL_HEADER], ids=["nothing", "header-only"])
def test_a_half_open_connection_is_closed_after_the_handshake_timeout(
    served: Served, first_bytes: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="leaseboard.amqp"):
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
            sock.sendall(first_bytes)
            read_until_eof(sock)
        until_sync(lambda: any("half-open" in r.getMessage() for r in caplog.records), "the half-open warning")


def test_a_connection_that_goes_silent_after_open_is_closed_by_the_idle_timeout(served: Served) -> None:
    client = RawClient(served.port)
    try:
        client.open()  # and then never a frame more: no heartbeats
        client.pump(lambda: client.conn.state & client.conn.REMOTE_CLOSED, timeout=5, what="the idle close")
        condition = client.conn.remote_condition
        assert condition is not None and condition.name == "amqp:resource-limit-exceeded"
    finally:
        client.close()


def test_an_idle_sdk_producer_reconnects_after_the_hub_closed_its_connection(served: Served, hub: EmbeddedHub) -> None:
    before = hub.properties("0").last_enqueued_sequence_number
    with producer(served, "sensors") as client:
        client.send_event(EventData(b"before idling"), partition_id="0")
        until_sync(
            lambda: served.call(lambda: served.server.stats.open_connections) == 0, "the idle connection to close"
        )
        client.send_event(EventData(b"after idling"), partition_id="0")
    reader = hub.reader("0", Position())
    assert [e.body for e in reader.receive(1000)][before + 1 :] == [b"before idling", b"after idling"]
    reader.close()


def test_a_receiving_sdk_client_keeps_its_connection_with_heartbeats(
    served: Served, hub: EmbeddedHub, receivers: list[Receiving]
) -> None:
    receiving = start_receiving(consumer(served, "sensors"), partition_id="1", starting_position="@latest")
    receivers.append(receiving)
    until_sync(lambda: served.owner_levels("sensors", "1"), "the receiver to attach")

    def heartbeats() -> int:
        return served.call(lambda: max((c.heartbeats for c in served.server.connections), default=0))

    until_sync(lambda: heartbeats() >= 4, "four heartbeats (twice the idle timeout)")
    hub.send(b"still there", partition_id="1")
    [event] = receiving.wait_for(1)
    assert body(event) == b"still there"
    assert event.sequence_number == hub.properties("1").last_enqueued_sequence_number
    assert receiving.errors == []
