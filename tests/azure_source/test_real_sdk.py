"""The adapter on the real ``EventHubConsumerClient``, offline.

Azure cannot be reached from here, but the SDK's own client can be pointed (``custom_endpoint_address``)
at a loopback port: one that refuses connections, one that accepts and then says nothing, or the
embedded hub's AMQP server. That runs the SDK's real consumer and AMQP transport under the adapter:
it must accept the adapter's arguments, turn its failures into a ``ReaderFailed``, stop when the
adapter closes it, and read without the SDK's event processor.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.eventhub import EventHubConsumerClient
from azure.eventhub._consumer import EventHubConsumer
from azure.eventhub.exceptions import ConnectError

from tests.amqp.conftest import Served, serve
from tests.support.waiting import until_sync
from workers.hub.embedded import EmbeddedHub
from workers.sources.base import Position
from workers.sources.eventhubs import (
    ClientFactory,
    ConsumerClient,
    EventHubsConfigError,
    EventHubsSource,
    PartitionStolen,
    ReaderFailed,
)
from workers.sources.eventhubs.sdk import open_consumer

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


def test_the_installed_sdk_has_the_private_consumer_the_readers_drive(caplog: pytest.LogCaptureFixture) -> None:
    # If this fails after an upgrade of azure-eventhub, readers fall back to receive_batch (slower
    # starts): check the new version's _create_consumer and EventHubConsumer, then move the pin.
    client = EventHubConsumerClient.from_connection_string(
        CONNECTION_STRING, consumer_group="$Default", eventhub_name="sensors"
    )
    consumer = open_consumer(
        client,
        consumer_group="$Default",
        partition_id="0",
        starting_position="-1",
        on_events=lambda batch: None,
        owner_level=0,
        prefetch=20,
    )
    assert isinstance(consumer, EventHubConsumer) and not consumer.running  # made, not connected
    assert consumer._owner_level == 0 and consumer._prefetch == 20 and consumer._offset == "-1"
    assert consumer._track_last_enqueued_event_properties and consumer._offset_inclusive is False
    assert "receive_batch instead" not in caplog.text
    consumer.close()
    client.close()


@pytest.fixture
def amqp_hub(tmp_path: Path) -> Iterator[Served]:
    root = tmp_path
    with EmbeddedHub(root, "sensors", partitions=2) as hub:
        hub.send_batch([f"e{i}".encode() for i in range(5)], partition_id="1")
    running = serve(root)
    yield running
    running.thread.stop()


def _processor_threads() -> set[int | None]:
    """The SDK's EventProcessor threads alive now (other tests' processors may linger as daemons)."""
    return {t.ident for t in threading.enumerate() if "_load_balancing" in t.name}


def test_a_reader_on_the_amqp_hub_reads_without_the_sdks_event_processor(amqp_hub: Served) -> None:
    before = _processor_threads()
    with EventHubsSource("sensors", connection_string=amqp_hub.connection_string) as source:
        reader = source.reader("1", Position(sequence_number=1))
        got: list[int] = []

        def three_read() -> bool:
            got.extend(e.sequence_number for e in reader.receive(10))
            return len(got) >= 3

        until_sync(three_read, "3 events")
        assert got == [2, 3, 4]
        assert amqp_hub.owner_levels("sensors", "1") == [0]
        assert not _processor_threads() - before  # this reader started no EventProcessor
        assert reader.last_enqueued is not None and reader.last_enqueued.sequence_number == 4


def _ignore(*received: object) -> None:
    pass


def _keep_alive_threads() -> set[int | None]:
    """pyamqp's keep-alive threads alive now (its target is the client's _keep_alive)."""
    return {t.ident for t in threading.enumerate() if "_keep_alive" in t.name}


def test_a_reader_starts_no_keep_alive_thread_beside_the_one_that_receives(amqp_hub: Served) -> None:
    # Two threads reading one connection can hand its transfers over in the wrong order (the SDK's
    # keep-alive beside the receiving one: workers.sources.eventhubs.sdk, KEEP_ALIVE). The SDK's own
    # consumer would start one; the reader's does not.
    before = _keep_alive_threads()
    with EventHubsSource("sensors", connection_string=amqp_hub.connection_string) as source:
        reader = source.reader("1", Position.earliest())
        until_sync(lambda: bool(reader.receive(10)), "the reader's first events")
        assert not _keep_alive_threads() - before
        with EventHubConsumerClient.from_connection_string(
            amqp_hub.connection_string, "$Default", eventhub_name="sensors"
        ) as client:  # the same private consumer, made as the SDK makes it: with the thread (what is avoided)
            consumer = client._create_consumer("$Default", "0", "-1", _ignore)
            consumer.receive(True, 10, None)
            assert _keep_alive_threads() - before
            consumer.close()


def test_a_reader_on_the_amqp_hub_is_cut_off_by_a_higher_owner_level(amqp_hub: Served) -> None:
    with (
        EventHubsSource("sensors", connection_string=amqp_hub.connection_string) as old,
        EventHubsSource("sensors", connection_string=amqp_hub.connection_string, owner_level=1) as new,
    ):
        before = old.reader("0", Position.earliest())
        until_sync(lambda: amqp_hub.owner_levels("sensors", "0") == [0], "the first receiver to attach")
        after = new.reader("0", Position.earliest())
        errors: list[ReaderFailed] = []

        def stolen() -> bool:
            try:
                before.receive(10)
            except ReaderFailed as exc:
                errors.append(exc)
            return bool(errors)

        until_sync(stolen, "the old reader to be cut off")
        assert isinstance(errors[0], PartitionStolen), errors[0]
        until_sync(lambda: not before.receiving, "the old reader's thread to end")
        assert after.receive(10) == [] and after.receiving
        assert amqp_hub.owner_levels("sensors", "0") == [1]


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
