"""Microsoft's ``azure-eventhub`` (sync) against the embedded hub's AMQP server, unmodified and offline.

Events written through the SDK are read back through ``EmbeddedHub`` and the other way round:
the AMQP server and the embedded source share one log.
"""

from __future__ import annotations

import time

import pytest
from azure.eventhub import EventData, EventHubProducerClient
from azure.eventhub.exceptions import AuthenticationError, ConnectError, EventHubError

from tests.support.waiting import until_sync
from workers.hub.embedded import EmbeddedHub
from workers.sources.base import Position
from workers.sources.eventhubs import is_stolen

from .conftest import (
    Receiving,
    Served,
    bodies,
    body,
    consumer,
    make_timed_hub,
    new_hub,
    producer,
    start_receiving,
)


def read_all(hub: EmbeddedHub, partition_id: str) -> list[tuple[int, str | None, bytes]]:
    reader = hub.reader(partition_id, Position())
    try:
        return [(e.sequence_number, e.partition_key, e.body) for e in reader.receive(10_000)]
    finally:
        reader.close()


def test_hub_and_partition_properties_answer_as_event_hubs_does(served: Served) -> None:
    hub = new_hub(served, partitions=3)
    hub.send_batch([b"a", b"b"], partition_id="1")
    with producer(served, hub.name) as client:
        props = client.get_eventhub_properties()
        empty = client.get_partition_properties("0")
        filled = client.get_partition_properties("1")
    assert props["eventhub_name"] == hub.name and props["partition_ids"] == ["0", "1", "2"]
    assert abs(props["created_at"].timestamp() - time.time()) < 60
    assert empty["is_empty"] and empty["last_enqueued_sequence_number"] == -1
    assert empty["beginning_sequence_number"] == 0
    local = hub.properties("1")
    assert not filled["is_empty"]
    assert (filled["id"], filled["eventhub_name"]) == ("1", hub.name)
    assert filled["last_enqueued_sequence_number"] == local.last_enqueued_sequence_number == 1
    assert filled["last_enqueued_offset"] == local.last_enqueued_offset
    assert local.last_enqueued_time is not None
    assert abs(filled["last_enqueued_time_utc"].timestamp() - local.last_enqueued_time) < 0.001


def test_events_sent_by_partition_id_key_and_batch_land_where_the_embedded_hub_reads_them(served: Served) -> None:
    hub = new_hub(served, partitions=4)
    with producer(served, hub.name) as client:
        client.send_event(EventData(b"to-two"), partition_id="2")
        batch = client.create_batch(partition_key="home-7")
        for i in range(3):
            batch.add(EventData(f"keyed-{i}".encode()))
        client.send_batch(batch)
        client.send_batch([EventData(b"listed-0"), EventData(b"listed-1")], partition_id="3")
    keyed = hub.partition_for_key("home-7")
    assert read_all(hub, "2")[0] == (0, None, b"to-two")
    assert [(k, b) for _, k, b in read_all(hub, keyed) if k] == [("home-7", f"keyed-{i}".encode()) for i in range(3)]
    assert [b for _, _, b in read_all(hub, "3")][-2:] == [b"listed-0", b"listed-1"]
    sequences = [s for s, _, _ in read_all(hub, keyed)]
    assert sequences == list(range(len(sequences)))  # a batch is one append: contiguous numbers


def test_events_without_key_or_partition_are_spread_over_the_partitions(served: Served) -> None:
    hub = new_hub(served, partitions=4)
    with producer(served, hub.name) as client:
        for i in range(8):
            client.send_batch([EventData(f"rr-{i}".encode())])
    counts = [len(read_all(hub, p)) for p in hub.partition_ids()]
    assert sum(counts) == 8 and max(counts) - min(counts) <= 1


@pytest.fixture
def timed_hub(served: Served) -> EmbeddedHub:
    """Five events in partition 0, enqueued at 1000, 1001, ... 1004 s (a hub clock the test sets)."""
    return make_timed_hub(served)


def test_a_sync_receiver_starts_after_a_sequence_number(
    served: Served, timed_hub: EmbeddedHub, receivers: list[Receiving]
) -> None:
    # Every kind of starting position is in test_sdk_async (concurrent async clients are quicker).
    receiving = start_receiving(consumer(served, timed_hub.name), partition_id="0", starting_position=2)
    receivers.append(receiving)
    events = receiving.wait_for(2)
    assert [e.sequence_number for e in events] == [3, 4] and bodies(events) == [b"e3", b"e4"]


def test_a_receiver_at_latest_gets_only_what_is_sent_after_it_attached(
    served: Served, timed_hub: EmbeddedHub, receivers: list[Receiving]
) -> None:
    receiving = start_receiving(consumer(served, timed_hub.name), partition_id="0", starting_position="@latest")
    receivers.append(receiving)
    until_sync(lambda: served.owner_levels(timed_hub.name, "0"), "the receiver to attach")
    with producer(served, timed_hub.name) as client:
        client.send_event(EventData(b"fresh"), partition_id="0")
    [event] = receiving.wait_for(1)
    assert (event.sequence_number, body(event)) == (5, b"fresh")
    assert event.enqueued_time is not None and event.offset == timed_hub.properties("0").last_enqueued_offset


def test_a_higher_owner_level_takes_the_partition_and_the_old_receiver_is_told_it_was_stolen(
    served: Served, receivers: list[Receiving]
) -> None:
    hub = new_hub(served, partitions=1)
    old = start_receiving(consumer(served, hub.name), partition_id="0", owner_level=1, starting_position="-1")
    receivers.append(old)
    until_sync(lambda: served.owner_levels(hub.name, "0") == [1], "the first receiver to attach")
    new = start_receiving(consumer(served, hub.name), partition_id="0", owner_level=2, starting_position="-1")
    receivers.append(new)
    until_sync(lambda: old.errors, "the first receiver to be cut off")
    assert is_stolen(old.errors[0]), old.errors
    assert "amqp:link:stolen" in str(old.errors[0]) or "stolen" in repr(old.errors[0])
    assert served.owner_levels(hub.name, "0") == [2]
    hub.send(b"after", partition_id="0")
    assert bodies(new.wait_for(1)) == [b"after"]
    assert old.events == []


def test_equal_owner_levels_the_newest_receiver_wins(served: Served, receivers: list[Receiving]) -> None:
    hub = new_hub(served, partitions=1)
    first = start_receiving(consumer(served, hub.name), partition_id="0", owner_level=0)
    receivers.append(first)
    until_sync(lambda: served.owner_levels(hub.name, "0") == [0], "the first receiver to attach")
    second = start_receiving(consumer(served, hub.name), partition_id="0", owner_level=0)
    receivers.append(second)
    until_sync(lambda: first.errors, "the first receiver to be cut off")
    assert is_stolen(first.errors[0])
    hub.send(b"x", partition_id="0")
    assert bodies(second.wait_for(1)) == [b"x"]


def test_a_lower_owner_level_is_refused_and_the_holder_keeps_reading(
    served: Served, receivers: list[Receiving]
) -> None:
    hub = new_hub(served, partitions=1)
    holder = start_receiving(consumer(served, hub.name), partition_id="0", owner_level=5)
    receivers.append(holder)
    until_sync(lambda: served.owner_levels(hub.name, "0") == [5], "the holder to attach")
    lower = start_receiving(consumer(served, hub.name, retry_total=0), partition_id="0", owner_level=4)
    receivers.append(lower)
    until_sync(lambda: lower.errors, "the lower receiver to be refused")
    assert is_stolen(lower.errors[0]) and "epoch" in str(lower.errors[0])
    non_exclusive = start_receiving(consumer(served, hub.name, retry_total=0), partition_id="0")
    receivers.append(non_exclusive)
    until_sync(lambda: non_exclusive.errors, "the receiver without owner level to be refused")
    assert served.owner_levels(hub.name, "0") == [5] and holder.errors == []
    hub.send(b"still mine", partition_id="0")
    assert bodies(holder.wait_for(1)) == [b"still mine"]
    assert lower.events == [] and non_exclusive.events == []


def test_receivers_without_owner_level_share_a_partition(served: Served, receivers: list[Receiving]) -> None:
    hub = new_hub(served, partitions=1)
    hub.send(b"shared", partition_id="0")
    both = [start_receiving(consumer(served, hub.name), partition_id="0", starting_position="-1") for _ in range(2)]
    receivers.extend(both)
    assert [bodies(r.wait_for(1)) for r in both] == [[b"shared"], [b"shared"]]


def test_last_enqueued_properties_arrive_with_every_event(served: Served, receivers: list[Receiving]) -> None:
    hub = new_hub(served, partitions=1)
    hub.send_batch([b"1", b"2", b"3"], partition_id="0")
    receiving = start_receiving(
        consumer(served, hub.name), partition_id="0", starting_position="-1", track_last_enqueued_event_properties=True
    )
    receivers.append(receiving)
    receiving.wait_for(3)
    last = receiving.contexts[-1].last_enqueued_event_properties
    local = hub.properties("0")
    assert last is not None and local.last_enqueued_time is not None
    assert (last["sequence_number"], last["offset"]) == (2, local.last_enqueued_offset)
    assert abs(last["enqueued_time"].timestamp() - local.last_enqueued_time) < 0.001
    assert abs(last["retrieval_time"].timestamp() - time.time()) < 60
    hub.send(b"4", partition_id="0")
    receiving.wait_for(4)
    last = receiving.contexts[-1].last_enqueued_event_properties
    assert last is not None and last["sequence_number"] == 3


def test_a_wrong_key_is_refused_with_an_authentication_error(served: Served) -> None:
    wrong = served.connection_string.replace(served.key.key, "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk=")
    client = EventHubProducerClient.from_connection_string(wrong, eventhub_name="sensors", retry_total=0)
    with client, pytest.raises(AuthenticationError) as refused:
        client.get_eventhub_properties()
    assert "401" in str(refused.value) or "InvalidSignature" in str(refused.value)
    client = EventHubProducerClient.from_connection_string(wrong, eventhub_name="sensors", retry_total=0)
    with client, pytest.raises(EventHubError):
        client.send_event(EventData(b"never"), partition_id="0")
    assert EmbeddedHub(served.root, "sensors").properties("0").is_empty


def test_an_unknown_hub_is_refused(served: Served) -> None:
    with producer(served, "no-such-hub", retry_total=0) as client, pytest.raises(ConnectError) as refused:
        client.get_eventhub_properties()
    assert "404" in str(refused.value) and "no-such-hub" in str(refused.value)
    with producer(served, "no-such-hub", retry_total=0) as client, pytest.raises(EventHubError) as refused_link:
        client.send_event(EventData(b"lost"), partition_id="0")
    assert "not-found" in str(refused_link.value) or "could not be found" in str(refused_link.value)
    assert not EmbeddedHub.exists(served.root, "no-such-hub")


def test_a_large_event_goes_through_intact(served: Served, receivers: list[Receiving]) -> None:
    hub = new_hub(served, partitions=1)
    payload = bytes(range(256)) * 3600  # 900 KiB: many frames each way
    with producer(served, hub.name) as client:
        client.send_event(EventData(payload), partition_id="0")
        batch = client.create_batch(partition_id="0")
        with pytest.raises(ValueError):  # the SDK sizes batches by the link's max-message-size (1 MiB)
            batch.add(EventData(b"x" * (1024 * 1024)))
    assert read_all(hub, "0") == [(0, None, payload)]
    receiving = start_receiving(consumer(served, hub.name), partition_id="0", starting_position="-1")
    receivers.append(receiving)
    [event] = receiving.wait_for(1)
    assert body(event) == payload
