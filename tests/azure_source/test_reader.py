"""Readers of the Event Hubs source at the SDK's boundary: what is asked of the SDK, what comes out."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.eventhub import EventHubConsumerClient
from azure.eventhub._consumer import EventHubConsumer
from azure.eventhub._pyamqp.error import ErrorCondition
from azure.eventhub.exceptions import ConnectError, ConnectionLostError, EventHubError

from tests.support.clock import FakeClock
from tests.support.waiting import until_sync
from workers.sources.base import Position, ReceivedEvent
from workers.sources.eventhubs import EventHubsReader, EventHubsSource, PartitionStolen, ReaderFailed, is_stolen, sdk
from workers.sources.eventhubs.reader import GATE_CHECK

from .fake import (
    CONNECTION_STRING,
    T0_MS,
    Clients,
    Hub,
    LegacyFakeConsumerClient,
    RetryConfig,
    refused_error,
    sdk_error,
    sdk_event,
    sdk_properties,
    stolen_error,
    utc,
)


@pytest.fixture
def opened(source: EventHubsSource) -> Iterator[list[EventHubsReader]]:
    """Readers a test opens; closed after it."""
    readers: list[EventHubsReader] = []
    yield readers
    for reader in readers:
        reader.close()


def open_reader(
    source: EventHubsSource,
    clients: Clients,
    opened: list[EventHubsReader],
    pid: str = "0",
    position: Position | None = None,
) -> tuple[EventHubsReader, LegacyFakeConsumerClient]:
    reader = source.reader(pid, position or Position.earliest())
    opened.append(reader)
    client = clients.last
    client.wait_for(lambda: client.started, "the reader to ask the SDK to receive")
    return reader, client


def deliver(client: LegacyFakeConsumerClient, *batches: list[object]) -> None:
    """Feeds batches and waits until the reader's callback has taken them all."""
    total = client.delivered + sum(len(b) for b in batches)
    client.feed(*batches)  # type: ignore[arg-type]
    client.wait_for(lambda: client.delivered >= total, f"{total} events delivered")


# what is asked of the SDK ------------------------------------------------------------------------

POSITIONS = {
    "after an offset": (Position.after(41, offset="4100"), "4100"),
    "after a sequence number": (Position(sequence_number=41), 41),
    "after sequence number 0": (Position(sequence_number=0), 0),
    "before the first event": (Position(sequence_number=-1), "-1"),
    "latest": (Position(latest=True), "@latest"),
    "earliest": (Position.earliest(), "-1"),
}


@pytest.mark.parametrize("case", POSITIONS)
def test_each_position_asks_the_sdk_to_start_just_after_it(
    case: str, source: EventHubsSource, clients: Clients, opened: list[EventHubsReader]
) -> None:
    position, expected = POSITIONS[case]
    _, client = open_reader(source, clients, opened, "2", position)
    kwargs = client.asked
    assert kwargs["starting_position"] == expected and type(kwargs["starting_position"]) is type(expected)
    assert kwargs["starting_position_inclusive"] is False
    assert kwargs["partition_id"] == "2"
    assert kwargs["owner_level"] == 0  # exclusive receiver, the level Microsoft's processor uses
    assert kwargs["track_last_enqueued_event_properties"] is True
    if client.consumer_kwargs is not None:
        assert kwargs["consumer_group"] == "$Default"
    else:
        assert callable(kwargs["on_error"])
    assert (client.eventhub_name, client.consumer_group, client.connection_string) == (
        "sensors",
        "$Default",
        CONNECTION_STRING,
    )


def test_every_keyword_the_reader_passes_is_one_the_real_sdk_reads(
    source: EventHubsSource, clients: Clients, opened: list[EventHubsReader]
) -> None:
    # The SDK's methods take **kwargs, which would swallow a misspelt keyword.
    _, client = open_reader(source, clients, opened, "1")
    if client.consumer_kwargs is not None:
        create = EventHubConsumerClient._create_consumer
        positional = ["consumer_group", "partition_id", "event_position"]
        assert list(inspect.signature(create).parameters)[1:4] == positional
        code = inspect.getsource(create)
        passed = set(client.consumer_kwargs) - set(positional)
        unread = {k for k in passed if f'kwargs.get("{k}"' not in code}
        assert not unread, unread
        assert inspect.signature(EventHubConsumer.receive).bind(None, True, 1, None)
    else:
        assert client.receive_kwargs is not None
        named = set(inspect.signature(EventHubConsumerClient.receive_batch).parameters) - {"self", "kwargs"}
        passed = {
            k
            for k, v in client.receive_kwargs.items()
            if v is not None and k not in ("on_partition_initialize", "on_partition_close")
        }
        assert passed <= named, passed - named


def test_each_reader_has_a_client_of_its_own(
    source: EventHubsSource, clients: Clients, opened: list[EventHubsReader]
) -> None:
    _, first = open_reader(source, clients, opened, "0")
    _, again = open_reader(source, clients, opened, "0")  # a hand-off inside one process overlaps briefly
    assert first is not again and clients.made[0] not in (first, again)
    assert first.started and again.started


@pytest.mark.parametrize("owner_level", [7, None])
def test_the_owner_level_given_is_the_one_the_service_sees(
    owner_level: int | None, clients: Clients, clock: FakeClock
) -> None:
    source = EventHubsSource(
        "sensors",
        connection_string=CONNECTION_STRING,
        client_factory=clients,
        clock=clock,
        owner_level=owner_level,
        owner_id="worker-a",
    )
    with source:
        reader = source.reader("1", Position.earliest())
        clients.last.wait_for(lambda: clients.last.started, "the reader to receive")
        assert clients.last.asked["owner_level"] == owner_level
        reader.close()


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, 20), (64, 64), (5, 5), (1000, 300)],  # never above the queue (300)
)
def test_a_read_takes_at_most_prefetch_events_20_unless_set(
    given: int | None, expected: int, clients: Clients, clock: FakeClock
) -> None:
    # The SDK hands events over only when a read ends: at a 0.2 s silence or after `prefetch` frames,
    # so a trickle faster than 5 a second waits for `prefetch` events (see reader.py).
    if given is None:
        source = EventHubsSource("sensors", connection_string=CONNECTION_STRING, client_factory=clients, clock=clock)
    else:
        source = EventHubsSource(
            "sensors", connection_string=CONNECTION_STRING, client_factory=clients, clock=clock, prefetch=given
        )
    with source:
        reader = source.reader("1", Position.earliest())
        clients.last.wait_for(lambda: clients.last.started, "the reader to receive")
        assert clients.last.asked["prefetch"] == expected
        reader.close()


@pytest.mark.parametrize("given", [0, -3, 2.5, True])
def test_a_prefetch_that_is_no_whole_number_above_zero_is_refused_in_one_line(
    given: object, clients: Clients, clock: FakeClock
) -> None:
    with pytest.raises(ValueError, match=f"prefetch must be a whole number of at least 1, got {given}") as raised:
        EventHubsSource(
            "sensors",
            connection_string=CONNECTION_STRING,
            client_factory=clients,
            clock=clock,
            prefetch=given,  # type: ignore[arg-type]
        )
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("env", ["0", "-3", "lots", "2.5"])
def test_a_prefetch_setting_that_is_no_whole_number_above_zero_is_refused_in_one_line(env: str) -> None:
    root = Path(__file__).resolve().parents[2]
    environment = {**os.environ, "EVENTHUB_PREFETCH": env, "DJANGO_SETTINGS_MODULE": "dashboard.settings"}
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=root,
        env=environment,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "ImproperlyConfigured: EVENTHUB_PREFETCH must be" in done.stderr


def test_a_reader_of_an_unknown_partition_or_with_a_bad_position_is_refused(
    source: EventHubsSource, clients: Clients
) -> None:
    with pytest.raises(ValueError, match="no partition '12'"):
        source.reader("12", Position.earliest())
    with pytest.raises(TypeError, match="Position"):
        source.reader("0", "-1")  # type: ignore[arg-type]
    assert len(clients.made) == 1  # no receiving client was made for either


# what comes out ----------------------------------------------------------------------------------


def test_sdk_events_become_received_events_in_order_in_batches_of_at_most_max_events(
    source: EventHubsSource, clients: Clients, opened: list[EventHubsReader]
) -> None:
    reader, client = open_reader(source, clients, opened, "3")
    assert reader.receive(10) == []  # nothing yet, and it does not wait
    deliver(
        client,
        [sdk_event(5, body=b'{"home": 7}', partition_key="home-7", offset="4096")],
        [sdk_event(6, body=[b"two ", b"sections"]), sdk_event(7, body=b"")],
    )
    assert reader.receive(2) == [
        ReceivedEvent("3", 5, "4096", (T0_MS + 5) / 1000, "home-7", b'{"home": 7}'),
        ReceivedEvent("3", 6, "600", (T0_MS + 6) / 1000, None, b"two sections"),
    ]
    assert reader.receive(2) == [ReceivedEvent("3", 7, "700", (T0_MS + 7) / 1000, None, b"")]
    assert reader.receive(2) == []
    with pytest.raises(ValueError, match="at least 1"):
        reader.receive(0)


def test_lag_comes_from_the_tracked_last_enqueued_event_without_asking_the_service(
    source: EventHubsSource, clients: Clients, hub: Hub, clock: FakeClock, opened: list[EventHubsReader]
) -> None:
    hub.properties["0"] = sdk_properties("0", begin=3, last=10, offset="1000", when=utc(T0_MS), empty=False)
    assert source.properties("0").last_enqueued_sequence_number == 10
    asked = hub.calls["get_partition_properties"]
    reader, client = open_reader(source, clients, opened, "0")
    clock.advance(1.0)
    deliver(client, [sdk_event(11, last_enqueued=250), sdk_event(12, last_enqueued=251)])
    assert reader.last_enqueued is not None and reader.last_enqueued.sequence_number == 251
    props = source.properties("0")
    assert hub.calls["get_partition_properties"] == asked  # answered from the deliveries
    assert (props.begin_sequence_number, props.last_enqueued_sequence_number) == (3, 251)
    assert (props.last_enqueued_offset, props.last_enqueued_time, props.is_empty) == (
        "25100",
        (T0_MS + 251) / 1000,
        False,
    )
    clock.advance(5.1)  # the tracked value is now too old: the service is asked again
    assert source.properties("0").last_enqueued_sequence_number == 10
    assert hub.calls["get_partition_properties"] == asked + 1


def test_a_delivery_annotated_before_the_services_last_answer_does_not_lower_the_last_enqueued_event(
    source: EventHubsSource, clients: Clients, hub: Hub, opened: list[EventHubsReader]
) -> None:
    hub.properties["0"] = sdk_properties("0", begin=0, last=300, offset="30000", when=utc(T0_MS + 300), empty=False)
    assert source.properties("0").last_enqueued_sequence_number == 300
    _, client = open_reader(source, clients, opened, "0")
    deliver(client, [sdk_event(11, last_enqueued=251)])  # waited in the SDK's buffer since before that answer
    assert source.properties("0").last_enqueued_sequence_number == 300


def test_an_event_without_service_annotations_fails_the_reader(
    source: EventHubsSource, clients: Clients, opened: list[EventHubsReader]
) -> None:
    from azure.eventhub import EventData

    reader, client = open_reader(source, clients, opened)
    deliver(client, [EventData(b"sent, never received")])
    with pytest.raises(ReaderFailed, match="without sequence number"):
        reader.receive(10)
    assert client.closed


# errors ------------------------------------------------------------------------------------------


def test_a_stolen_receiver_raises_partition_stolen_at_once_and_stops_the_sdk(
    source: EventHubsSource, clients: Clients, opened: list[EventHubsReader]
) -> None:
    reader, client = open_reader(source, clients, opened, "1")
    deliver(client, [sdk_event(0), sdk_event(1)])
    client.feed(stolen_error())
    client.wait_for(lambda: client.closed and client.returned, "the adapter to close the SDK's receive")
    with pytest.raises(
        PartitionStolen, match=r"partition 1: another receiver took the partition.*higher epoch"
    ) as caught:
        reader.receive(10)  # the two queued events are dropped: the new owner reads them
    assert caught.value.partition_id == "1"
    assert isinstance(caught.value.__cause__, ConnectionLostError)
    with pytest.raises(PartitionStolen):
        reader.receive(10)
    reader.close()
    assert not reader.receiving


def test_another_receive_error_ends_the_reader_after_what_it_already_received(
    source: EventHubsSource, clients: Clients, opened: list[EventHubsReader]
) -> None:
    reader, client = open_reader(source, clients, opened, "2")
    deliver(client, [sdk_event(0), sdk_event(1)])
    client.feed(ConnectError("Failed to open mgmt link: connection refused"))
    # Closed at once: left alone, the SDK would re-create its consumer from the original position.
    client.wait_for(lambda: client.closed and client.returned, "the adapter to close the SDK's receive")
    assert [e.sequence_number for e in reader.receive(10)] == [0, 1]
    with pytest.raises(ReaderFailed, match="partition 2: receiving failed: ConnectError") as caught:
        reader.receive(10)
    assert not isinstance(caught.value, PartitionStolen)


def test_an_sdk_receive_batch_that_raises_or_returns_by_itself_fails_the_reader(
    hub: Hub, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    clients = Clients(hub, legacy=True)
    with EventHubsSource("sensors", connection_string=CONNECTION_STRING, client_factory=clients, clock=clock) as source:
        reader, client = open_reader(source, clients, [], "0")
        client.end_alone()
        client.wait_for(lambda: client.returned, "receive_batch to return")
        with pytest.raises(ReaderFailed, match="returned without being closed"):
            reader.receive(1)

        def refuse(*args: object, **kwargs: object) -> None:
            raise ValueError("This consumer client is already receiving events from partition 1")

        monkeypatch.setattr(LegacyFakeConsumerClient, "receive_batch", refuse)
        other = source.reader("1", Position.earliest())
        until_sync(lambda: not other.receiving, "the reader's thread to end")
        with pytest.raises(ReaderFailed, match="already receiving") as caught:
            other.receive(1)
        assert isinstance(caught.value.__cause__, ValueError)


# the SDK's consumer, driven directly --------------------------------------------------------------


@pytest.fixture
def direct(hub: Hub, clock: FakeClock) -> Iterator[tuple[EventHubsSource, Clients]]:
    clients = Clients(hub)
    with EventHubsSource("sensors", connection_string=CONNECTION_STRING, client_factory=clients, clock=clock) as source:
        yield source, clients  # closing the source closes its readers


def test_a_refused_open_is_retried_with_the_clients_backoff_then_reads(
    direct: tuple[EventHubsSource, Clients],
) -> None:
    source, clients = direct
    clients.open_errors = [refused_error(), refused_error()]
    reader, client = open_reader(source, clients, [], "0")
    deliver(client, [sdk_event(0)])
    assert client.opens == 3 and [e.sequence_number for e in reader.receive(10)] == [0]


def test_an_open_refused_after_every_retry_fails_the_reader_with_the_sdks_error(
    direct: tuple[EventHubsSource, Clients],
) -> None:
    source, clients = direct
    clients.open_errors = [refused_error() for _ in range(5)]
    reader, client = open_reader(source, clients, [], "1")
    errors: list[ReaderFailed] = []

    def failed() -> bool:
        try:
            reader.receive(1)
        except ReaderFailed as exc:
            errors.append(exc)
        return bool(errors)

    until_sync(failed, "the reader to fail")
    assert client.opens == 4  # the first try and the client's 3 retries
    assert isinstance(errors[0].__cause__, ConnectError) and "Connection refused" in str(errors[0])
    until_sync(lambda: not reader.receiving and client.returned, "the consumer to be closed")


def test_a_link_that_went_down_opens_again_only_once_the_gate_says_the_lease_holds(
    direct: tuple[EventHubsSource, Clients],
) -> None:
    # A worker cut off from the hub and the store: its paused pump keeps the reader, and the link
    # must not open again while the lease may be another worker's (equal owner levels: the service
    # would cut the new owner off).
    source, clients = direct
    reader, client = open_reader(source, clients, [], "3")
    client.wait_for(lambda: client.opens == 1, "the first open")
    held = threading.Event()
    asked: list[bool] = []

    def may_open() -> bool:
        asked.append(held.is_set())
        return asked[-1]

    reader.gate(may_open)
    assert client.consumer is not None
    client.consumer.running = False  # the link went down while the lease may have run out
    until_sync(lambda: asked.count(False) >= 3, f"the reader to ask its gate three times (every {GATE_CHECK}s)")
    assert client.opens == 1
    held.set()  # renewed
    client.wait_for(lambda: client.opens == 2, "the link to open again")
    deliver(client, [sdk_event(0)])
    assert [e.sequence_number for e in reader.receive(10)] == [0]
    held.clear()
    client.consumer.running = False
    started = time.monotonic()
    reader.close()  # a reader waiting at its gate closes at once
    assert time.monotonic() - started < 2.0 and not reader.receiving and client.opens == 2


def test_close_cuts_the_backoff_between_two_opens_short(direct: tuple[EventHubsSource, Clients]) -> None:
    source, clients = direct
    reader, client = open_reader(source, clients, [], "2")
    client.wait_for(lambda: client.opens == 1, "the first open")
    client._config = RetryConfig(backoff_factor=60.0)
    client.fail_open(refused_error())
    assert client.consumer is not None
    client.consumer.running = False  # the link went down: the next turn opens it again
    client.wait_for(lambda: client.opens == 2, "the failed open")
    started = time.monotonic()
    reader.close()
    assert time.monotonic() - started < 2.0 and not reader.receiving and client.returned


def test_without_the_sdks_private_consumer_readers_use_receive_batch_and_say_so_once(
    hub: Hub, clock: FakeClock, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sdk, "_fallback_logged", threading.Lock())
    clients = Clients(hub, legacy=True)
    with EventHubsSource("sensors", connection_string=CONNECTION_STRING, client_factory=clients, clock=clock) as source:
        readers = [open_reader(source, clients, [], pid) for pid in "01"]
        assert all(client.receive_kwargs is not None for _, client in readers)
        deliver(readers[0][1], [sdk_event(0)])
        assert [e.sequence_number for e in readers[0][0].receive(10)] == [0]
    fallbacks = [r for r in caplog.records if "receive_batch instead" in r.getMessage()]
    assert len(fallbacks) == 1 and fallbacks[0].levelname == "WARNING"
    assert "_create_consumer is missing" in fallbacks[0].getMessage()


@pytest.mark.parametrize(
    ("make", "stolen"),
    [
        (stolen_error, True),
        # A receiver refused because another holds the partition with a higher epoch.
        (
            lambda: sdk_error(
                b"com.microsoft:receiver-disconnected", "Receiver 'x' with epoch '0' is disconnected: epoch '1' exists."
            ),
            True,
        ),
        (lambda: sdk_error(ErrorCondition.LinkDetachForced, "The link was closed by the service (idle)."), False),
        (lambda: ConnectionLostError("connection reset by peer"), False),
        (lambda: EventHubError("Unexpected response: 503"), False),
    ],
)
def test_only_another_receiver_taking_the_partition_counts_as_stolen(make: object, stolen: bool) -> None:
    assert is_stolen(make()) is stolen  # type: ignore[operator]


def test_a_stolen_error_wrapped_by_another_exception_is_still_stolen() -> None:
    try:
        try:
            raise stolen_error()
        except EventHubError as inner:
            raise RuntimeError("receive failed") from inner
    except RuntimeError as outer:
        assert is_stolen(outer)


# backpressure and shutdown -----------------------------------------------------------------------


def small_reader(
    clients: Clients, hub: Hub, clock: FakeClock
) -> tuple[EventHubsSource, EventHubsReader, LegacyFakeConsumerClient]:
    source = EventHubsSource(
        "sensors", connection_string=CONNECTION_STRING, client_factory=clients, clock=clock, queue_events=5
    )
    reader = source.reader("0", Position.earliest())
    client = clients.last
    client.wait_for(lambda: client.started, "the reader to receive")
    return source, reader, client


def test_a_full_queue_holds_the_sdk_back_until_the_reader_catches_up(
    clients: Clients, hub: Hub, clock: FakeClock
) -> None:
    source, reader, client = small_reader(clients, hub, clock)
    with source:
        client.wait_for(lambda: client.max_batch_size is not None, "the reader to ask for a batch")
        batch = client.max_batch_size
        client.feed([sdk_event(n) for n in range(400)])
        # The callback that finds the queue full waits inside the SDK's thread: delivery stops.
        client.wait_for(lambda: client.in_callback and client.delivered >= 5, "the callback to block on a full queue")
        assert batch == 5 and client.delivered == 5  # one batch queued, the next one waiting for room
        got: list[int] = []
        while len(got) < 400:
            before = client.delivered
            chunk = [e.sequence_number for e in reader.receive(3)]
            assert len(chunk) <= 3
            got += chunk
            if not chunk:
                client.wait_for(lambda: client.delivered > before, "more deliveries")  # noqa: B023
        assert got == list(range(400))


def test_close_stops_a_receiver_blocked_on_a_full_queue_promptly(clients: Clients, hub: Hub, clock: FakeClock) -> None:
    source, reader, client = small_reader(clients, hub, clock)
    client.feed([sdk_event(n) for n in range(400)])
    client.wait_for(lambda: client.in_callback and client.delivered >= 5, "the callback to block on a full queue")
    started = time.monotonic()
    reader.close()
    assert time.monotonic() - started < 2.0
    assert client.closed and client.returned and not reader.receiving
    with pytest.raises(ValueError, match="closed"):
        reader.receive(1)
    reader.close()  # twice is fine
    source.close()


def test_closing_the_source_closes_its_readers_and_its_client(clients: Clients, hub: Hub, clock: FakeClock) -> None:
    source = EventHubsSource("sensors", connection_string=CONNECTION_STRING, client_factory=clients, clock=clock)
    readers = [source.reader(pid, Position.earliest()) for pid in "012"]
    for client in clients.made[1:]:
        client.wait_for(lambda c=client: c.started, "the reader to receive")  # type: ignore[misc]
    source.close()
    assert all(c.closed for c in clients.made)
    assert not any(r.receiving for r in readers)
