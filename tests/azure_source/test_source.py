"""The Event Hubs source outside its readers: connection string, partition ids, properties."""

from __future__ import annotations

import inspect
import threading
import time

import pytest
from azure.eventhub import EventHubConsumerClient
from azure.eventhub._pyamqp.error import ErrorCondition
from azure.eventhub.exceptions import AuthenticationError, ConnectError

from tests.support.clock import FakeClock
from tests.support.waiting import until_sync
from workers.sources.base import PartitionProperties, Position
from workers.sources.eventhubs import EventHubsConfigError, EventHubsSource, sdk_client
from workers.sources.eventhubs.sdk import sdk_probe_client

from .fake import (
    CONNECTION_STRING,
    KEY,
    NAMESPACE,
    T0_MS,
    Clients,
    FakeConsumerClient,
    Hub,
    sdk_error,
    sdk_properties,
    utc,
)


def test_the_fake_client_has_the_sdks_signatures() -> None:
    for name in ("get_partition_ids", "get_partition_properties", "receive_batch", "close"):
        real = inspect.signature(getattr(EventHubConsumerClient, name)).parameters.values()
        fake = inspect.signature(getattr(FakeConsumerClient, name)).parameters.values()
        assert [(p.name, p.kind, p.default) for p in fake] == [(p.name, p.kind, p.default) for p in real], name


def test_the_real_client_is_built_from_the_connection_string_without_connecting() -> None:
    client = sdk_client(CONNECTION_STRING, "sensors", "audit")
    try:
        assert isinstance(client, EventHubConsumerClient)
        assert (client._address.hostname, client.eventhub_name) == (NAMESPACE, "sensors")
        assert client._consumer_group == "audit"
    finally:
        client.close()


# connection string ---------------------------------------------------------------------------------

BAD = {
    "missing": None,
    "empty": "",
    "garbage": "this is not a connection string " + KEY,
    "no key": f"Endpoint=sb://{NAMESPACE}/;SharedAccessKeyName=listen",
    "no endpoint": f"SharedAccessKeyName=listen;SharedAccessKey={KEY}",
    "endpoint without scheme": f"Endpoint={NAMESPACE};SharedAccessKeyName=listen;SharedAccessKey={KEY}",
    "key twice": f"{CONNECTION_STRING};SharedAccessKey={KEY}",
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_connection_string_is_one_clear_error_that_never_shows_the_key(case: str, clients: Clients) -> None:
    value = BAD[case]
    with pytest.raises(EventHubsConfigError) as caught:
        EventHubsSource(hub="sensors", connection_string=value or "", client_factory=clients)
    message = str(caught.value)
    assert "EVENTHUB_CONNECTION_STRING" in message
    assert "Endpoint=sb://<namespace>" in message  # says what a good one looks like
    assert KEY not in message and KEY[:12] not in message
    cause = caught.value
    assert cause.__cause__ is None and (cause.__context__ is None or cause.__suppress_context__)  # no SDK text chained
    assert clients.made == []  # refused before any client was made


def test_a_connection_string_for_another_hub_is_refused(clients: Clients) -> None:
    with pytest.raises(EventHubsConfigError, match=r"'telemetry' \(EntityPath\).*'sensors'") as caught:
        EventHubsSource(
            "sensors", connection_string=f"{CONNECTION_STRING};EntityPath=telemetry", client_factory=clients
        )
    assert KEY not in str(caught.value)


def test_a_hub_level_connection_string_for_the_same_hub_is_accepted(clients: Clients) -> None:
    source = EventHubsSource(
        "sensors", connection_string=f"{CONNECTION_STRING};EntityPath=sensors", client_factory=clients
    )
    assert source.namespace == NAMESPACE and source.partition_ids() == ("0", "1", "2", "3")


def test_credentials_the_service_rejects_are_one_clear_error_at_construction(hub: Hub, clients: Clients) -> None:
    # Were the service (or a proxy) ever to echo the key, it is still not printed.
    hub.ids_error = AuthenticationError(f"CBS token rejected for SharedAccessKey={KEY}: 401 Unauthorized")
    with pytest.raises(EventHubsConfigError, match=f"{NAMESPACE} refused the credentials") as caught:
        EventHubsSource("sensors", connection_string=CONNECTION_STRING, client_factory=clients)
    assert KEY not in str(caught.value) and "401 Unauthorized" in str(caught.value)


def test_an_unknown_hub_is_one_clear_error_at_construction(hub: Hub, clients: Clients) -> None:
    hub.ids_error = sdk_error(ErrorCondition.NotFound, "The messaging entity 'sb://x/sensors' could not be found.")
    with pytest.raises(EventHubsConfigError, match=r"cannot read event hub 'sensors'.*could not be found"):
        EventHubsSource("sensors", connection_string=CONNECTION_STRING, client_factory=clients)


def test_the_consumer_group_is_the_one_given_else_default_and_the_source_reads_no_environment(
    clients: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The settings are read by workers.wiring (build_source); the environment after start is nobody's.
    monkeypatch.setenv("EVENTHUB_CONNECTION_STRING", "Endpoint=sb://elsewhere.example/;SharedAccessKeyName=x")
    monkeypatch.setenv("LEASEBOARD_CONSUMER_GROUP", "audit")
    monkeypatch.setenv("EVENTHUB_PREFETCH", "lots")
    assert EventHubsSource("sensors", connection_string=CONNECTION_STRING, client_factory=clients).consumer_group == (
        "$Default"
    )
    given = EventHubsSource(
        "sensors", connection_string=CONNECTION_STRING, consumer_group="billing", client_factory=clients
    )
    assert given.consumer_group == "billing"
    assert [(c.connection_string, c.eventhub_name, c.consumer_group) for c in clients.made] == [
        (CONNECTION_STRING, "sensors", "$Default"),
        (CONNECTION_STRING, "sensors", "billing"),
    ]
    with pytest.raises(EventHubsConfigError, match="EVENTHUB_CONNECTION_STRING is not set"):
        EventHubsSource("sensors", client_factory=clients)


# partition ids -----------------------------------------------------------------------------------


def test_partition_ids_are_asked_at_most_every_refresh_interval_and_show_partitions_added_later(
    source: EventHubsSource, hub: Hub, clock: FakeClock
) -> None:
    assert source.partition_ids() == ("0", "1", "2", "3")
    asked = hub.calls["get_partition_ids"]
    hub.partitions += ["4", "5"]
    clock.advance(4.9)
    assert source.partition_ids() == ("0", "1", "2", "3")
    assert hub.calls["get_partition_ids"] == asked
    clock.advance(0.1)
    assert source.partition_ids() == ("0", "1", "2", "3", "4", "5")
    assert hub.calls["get_partition_ids"] == asked + 1


def test_a_partition_added_since_the_last_refresh_is_found_when_asked_for(
    source: EventHubsSource, hub: Hub, clock: FakeClock
) -> None:
    hub.partitions.append("4")
    hub.properties["4"] = sdk_properties("4", begin=0, last=-1, offset="-1", when=utc(0), empty=True)
    clock.advance(1.0)
    assert source.properties("4").is_empty
    with pytest.raises(ValueError, match="has no partition '9'"):
        source.properties("9")


def test_a_refresh_hanging_in_a_network_cut_keeps_no_one_else_waiting(
    source: EventHubsSource, hub: Hub, clock: FakeClock
) -> None:
    released = threading.Event()
    hub.ids_hang = released
    clock.advance(5.0)
    hanging = threading.Thread(target=source.partition_ids)  # the partition list's refresh, in its thread
    hanging.start()
    try:
        until_sync(lambda: hub.calls["get_partition_ids"] == 2, "the refresh to be sent into the cut")
        started = time.monotonic()
        assert source.partition_ids() == ("0", "1", "2", "3")  # a pump opening a reader meanwhile
        assert source.reader("2", Position.earliest()) is not None
        assert time.monotonic() - started < 1.0, "waited behind the hanging refresh"
    finally:
        released.set()
        hanging.join(10)
    clock.advance(5.0)
    hub.ids_hang = None
    hub.partitions.append("4")
    assert source.partition_ids() == ("0", "1", "2", "3", "4")  # asked again once it ended


def test_a_probe_asks_on_a_client_of_its_own_and_says_whether_the_hub_answered(
    source: EventHubsSource, hub: Hub, clients: Clients
) -> None:
    made = len(clients.made)
    source.probe()
    assert len(clients.made) == made + 1 and clients.made[-1].closed  # its own client, closed after
    hub.ids_error = ConnectError("Failed to initiate the connection due to exception: timed out")
    with pytest.raises(ConnectError):
        source.probe()
    assert clients.made[-1].closed
    assert source.partition_ids() == ("0", "1", "2", "3")  # the shared client's answer is untouched


def test_a_probe_of_the_real_sdk_gives_up_at_once() -> None:
    client = sdk_probe_client(CONNECTION_STRING, "sensors", "$Default")
    try:
        assert client._config.max_retries == 0  # type: ignore[attr-defined]
    finally:
        client.close()


def test_while_the_service_cannot_be_asked_the_last_partition_ids_are_used(
    source: EventHubsSource, hub: Hub, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    hub.ids_error = ConnectError("connection reset")
    for _ in range(3):
        clock.advance(5.0)
        assert source.partition_ids() == ("0", "1", "2", "3")
    assert len([r for r in caplog.records if "cannot refresh partition ids" in r.message]) == 1
    hub.ids_error, hub.partitions = None, [*hub.partitions, "4"]
    clock.advance(5.0)
    assert source.partition_ids()[-1] == "4"


def test_an_unknown_or_malformed_partition_id_is_refused(source: EventHubsSource) -> None:
    with pytest.raises(ValueError, match="has no partition '7'"):
        source.properties("7")
    with pytest.raises(TypeError):
        source.properties(3)  # type: ignore[arg-type]


# properties --------------------------------------------------------------------------------------


def test_properties_map_the_sdks_partition_properties(source: EventHubsSource, hub: Hub) -> None:
    hub.properties["2"] = sdk_properties("2", begin=17, last=4711, offset="471100", when=utc(T0_MS), empty=False)
    assert source.properties("2") == PartitionProperties(
        partition_id="2",
        begin_sequence_number=17,
        last_enqueued_sequence_number=4711,
        last_enqueued_offset="471100",
        last_enqueued_time=T0_MS / 1000,
        is_empty=False,
    )


def test_an_empty_partition_has_no_last_offset_or_time(source: EventHubsSource, hub: Hub) -> None:
    hub.properties["0"] = sdk_properties("0", begin=0, last=-1, offset="-1", when=utc(0), empty=True)
    props = source.properties("0")
    assert (props.is_empty, props.last_enqueued_sequence_number) == (True, -1)
    assert (props.last_enqueued_offset, props.last_enqueued_time) == (None, None)


def test_a_partition_emptied_by_retention_keeps_its_last_sequence_number(source: EventHubsSource, hub: Hub) -> None:
    hub.properties["1"] = sdk_properties("1", begin=100, last=99, offset="9900", when=utc(T0_MS), empty=True)
    props = source.properties("1")
    assert (props.is_empty, props.begin_sequence_number, props.last_enqueued_sequence_number) == (True, 100, 99)


def test_properties_the_service_cannot_give_raise_the_sdks_error(
    source: EventHubsSource, clients: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(partition_id: str) -> dict[str, object]:
        raise ConnectError("timed out")

    monkeypatch.setattr(clients.made[0], "get_partition_properties", fail)
    with pytest.raises(ConnectError, match="timed out"):
        source.properties("0")
