"""The adapter on the real ``EventHubConsumerClient``, offline.

Azure cannot be reached from here, but the SDK's own client can be pointed (``custom_endpoint_address``)
at a loopback port: one that refuses connections, or one that accepts and then says nothing. That
runs the SDK's real receive machinery (its event processor, load-balancing thread, consumer and
AMQP transport) around the adapter: it must accept the adapter's arguments, report its failures
through ``on_error`` into a ``ReaderFailed``, and stop when the adapter closes it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from azure.eventhub import EventHubConsumerClient
from azure.eventhub.exceptions import ConnectError

from tests.support.waiting import until_sync
from workers.sources.base import Position
from workers.sources.eventhubs import ClientFactory, ConsumerClient, EventHubsConfigError, EventHubsSource, ReaderFailed

from .fake import CONNECTION_STRING, KEY, NAMESPACE


def real_client_on(port: int) -> ClientFactory:
    def make(connection_string: str, eventhub_name: str, consumer_group: str) -> ConsumerClient:
        return EventHubConsumerClient.from_connection_string(
            connection_string,
            consumer_group=consumer_group,
            eventhub_name=eventhub_name,
            custom_endpoint_address=f"sb://127.0.0.1:{port}",
            retry_total=0,  # the SDK's retries only make the test slower
        )

    return make


@pytest.fixture
def refusing_port() -> int:
    """A loopback port nothing listens on (connections are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[tuple[int, list[socket.socket]]]:
    """A loopback port that accepts connections and never answers; yields it and the connections."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                return  # the server socket was closed

    thread = threading.Thread(target=accept, name="silent server", daemon=True)
    thread.start()
    yield int(server.getsockname()[1]), accepted
    server.close()
    for conn in accepted:
        conn.close()


def test_an_unreachable_namespace_is_one_clear_error_at_construction(refusing_port: int) -> None:
    with pytest.raises(
        EventHubsConfigError, match=f"cannot read event hub 'sensors' in namespace {NAMESPACE}"
    ) as caught:
        EventHubsSource("sensors", connection_string=CONNECTION_STRING, client_factory=real_client_on(refusing_port))
    assert "Connection refused" in str(caught.value) and KEY not in str(caught.value)


def test_the_real_sdk_takes_the_readers_arguments_and_its_receive_error_ends_the_reader(refusing_port: int) -> None:
    # The source's own client only lists the partitions (the real one would need the service to answer);
    # the reader's client is the SDK's.
    make = real_client_on(refusing_port)
    reader_client = make(CONNECTION_STRING, "sensors", "$Default")
    source = EventHubsSource("sensors", connection_string=CONNECTION_STRING, client_factory=_ListingOnly(reader_client))
    reader = source.reader("0", Position.after(41, offset="4100"))
    errors: list[BaseException] = []

    def failed() -> bool:
        try:
            reader.receive(10)
        except ReaderFailed as exc:
            errors.append(exc)
        return bool(errors)

    until_sync(failed, "the reader to fail", timeout=30)
    assert isinstance(errors[0].__cause__, ConnectError), errors[0].__cause__  # not a TypeError for an argument
    assert "Connection refused" in str(errors[0])
    until_sync(lambda: not reader.receiving, "the SDK's receive to end")
    source.close()


def test_close_ends_a_real_receive_that_waits_on_a_silent_service_promptly(
    silent_port: tuple[int, list[socket.socket]],
) -> None:
    port, accepted = silent_port
    client = real_client_on(port)(CONNECTION_STRING, "sensors", "$Default")
    source = EventHubsSource("sensors", connection_string=CONNECTION_STRING, client_factory=_ListingOnly(client))
    reader = source.reader("0", Position.earliest())
    until_sync(lambda: len(accepted) >= 1, "the SDK to connect")
    assert reader.receive(10) == [] and reader.receiving  # connected, waiting, nothing yet
    started = time.monotonic()
    reader.close()
    assert time.monotonic() - started < 2.0
    assert not reader.receiving
    source.close()


class _ListingOnly:
    """A factory whose first client (the source's) only lists partitions; later ones are ``reader``."""

    def __init__(self, reader: ConsumerClient) -> None:
        self._reader = reader
        self._made = 0

    def __call__(self, connection_string: str, eventhub_name: str, consumer_group: str) -> ConsumerClient:
        self._made += 1
        return _Listing() if self._made == 1 else self._reader


class _Listing:
    def get_partition_ids(self) -> list[str]:
        return ["0", "1"]

    def get_partition_properties(self, partition_id: str) -> dict[str, object]:
        raise AssertionError("not asked in these tests")

    def receive_batch(self, on_event_batch: object, **kwargs: object) -> None:
        raise AssertionError("the source's own client never receives")

    def close(self) -> None:
        pass
