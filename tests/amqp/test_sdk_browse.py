"""``EventHubsSource.browse`` through the real azure-eventhub SDK against the embedded AMQP hub: the
positions (sequence number, offset, time), the bounds, application properties, and a browse that never
cuts a worker's exclusive reader off (Event Hubs refuses it in the worker's consumer group; as a group
of its own it reads beside it). And ``/api/partitions/<id>/events`` with ``--source eventhubs``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.eventhub import EventData
from django.conf import LazySettings
from django.test import Client

from tests.support.waiting import until_sync
from workers.deadletter.decode import json_safe
from workers.hub.embedded import EmbeddedHub
from workers.sources.base import Start
from workers.sources.eventhubs import EventHubsSource

from .conftest import Receiving, Served, consumer, make_timed_hub, new_hub, producer, read_offsets, start_receiving


@pytest.fixture
def hub(served: Served) -> Iterator[EmbeddedHub]:
    """A new hub with ten events in partition 0 ("e0".."e9"), sent through the SDK with a property each."""
    made = new_hub(served, partitions=2)
    with producer(served, made.name) as sending:
        batch = sending.create_batch(partition_id="0")
        for i in range(10):
            event = EventData(f"e{i}".encode())
            event.properties = {"n": i, "kind": "reading"}
            batch.add(event)
        sending.send_batch(batch)
    yield made
    made.close()


def source(served: Served, hub: str) -> EventHubsSource:
    return EventHubsSource(hub, connection_string=served.connection_string)


def test_a_browse_reads_from_a_sequence_number_an_offset_or_a_time_within_its_bounds(
    served: Served, hub: EmbeddedHub
) -> None:
    with source(served, hub.name) as hubs:
        got = hubs.browse("0", Start(sequence_number=3), 4, 1 << 20)
        assert [(b.event.sequence_number, b.event.body) for b in got] == [(i, f"e{i}".encode()) for i in range(3, 7)]
        assert got[0].properties is not None and json_safe(got[0].properties) == {"n": 3, "kind": "reading"}
        assert [b.event.sequence_number for b in hubs.browse("0", Start(sequence_number=0), 100, 1 << 20)] == list(
            range(10)
        )
        assert [b.event.sequence_number for b in hubs.browse("0", Start(sequence_number=8), 100, 1 << 20, until=8)] == [
            8
        ]
        assert [b.event.sequence_number for b in hubs.browse("0", Start(sequence_number=0), 100, 5)] == [0, 1, 2]
        offset = read_offsets(hub)[6]
        assert [b.event.sequence_number for b in hubs.browse("0", Start(offset=offset), 2, 1 << 20)] == [6, 7]
        assert hubs.browse("1", Start(sequence_number=0), 5, 1 << 20) == []  # an empty partition: nothing
    timed = make_timed_hub(served)  # e0..e4 enqueued at 1000..1004 s
    try:
        with source(served, timed.name) as hubs:
            at = hubs.browse("0", Start(enqueued_time=1002.0), 10, 1 << 20, until=4)
            assert [b.event.body for b in at] == [b"e2", b"e3", b"e4"]
    finally:
        timed.close()


def test_a_browse_never_cuts_a_workers_exclusive_reader_off(
    served: Served, hub: EmbeddedHub, receivers: list[Receiving]
) -> None:
    worker = start_receiving(consumer(served, hub.name), partition_id="0", owner_level=1, starting_position="-1")
    receivers.append(worker)
    worker.wait_for(10)
    assert served.owner_levels(hub.name, "0") == [1]

    with source(served, hub.name) as hubs:
        with pytest.raises(ConnectionError, match="non-epoch receiver is not allowed"):
            hubs.browse("0", Start(sequence_number=0), 5, 1 << 20)
        beside = hubs.browse("0", Start(sequence_number=0), 5, 1 << 20, consumer_group="browser")

    assert [b.event.sequence_number for b in beside] == [0, 1, 2, 3, 4]
    # The browse's link goes as its client closes; the worker's stays, never told to stop.
    until_sync(lambda: served.owner_levels(hub.name, "0") == [1], "the browse's link closed", 10.0)
    assert worker.errors == []


@pytest.mark.django_db
def test_the_api_browses_event_hubs_as_the_browse_consumer_group(
    settings: LazySettings, served: Served, hub: EmbeddedHub, receivers: list[Receiving]
) -> None:
    settings.LEASEBOARD_SOURCE = "eventhubs"
    settings.EVENTHUB_CONNECTION_STRING = served.connection_string
    settings.LEASEBOARD_HUB = hub.name
    settings.LEASEBOARD_CONSUMER_GROUP = "$Default"
    settings.LEASEBOARD_EVENT_BODIES = "readers"
    worker = start_receiving(consumer(served, hub.name), partition_id="0", owner_level=1, starting_position="-1")
    receivers.append(worker)
    worker.wait_for(10)
    client = Client()

    refused = client.get("/api/partitions/0/events?count=3")
    assert refused.status_code == 503 and "non-epoch receiver is not allowed" in refused.json()["error"]

    settings.LEASEBOARD_BROWSE_CONSUMER_GROUP = "browser"
    page = client.get("/api/partitions/0/events?count=3")
    assert page.status_code == 200, page.content
    found = page.json()
    assert [e["sequence_number"] for e in found["events"]] == [9, 8, 7] and found["source"] == "eventhubs"
    assert found["events"][0]["properties"] == {"n": 9, "kind": "reading"}
    assert found["events"][0]["body"] == {"encoding": "text", "value": "e9", "size": 2, "truncated": False}
    assert found["older"] == 7 and found["newer"] is None
    until_sync(lambda: served.owner_levels(hub.name, "0") == [1], "the browse's link closed", 10.0)
    assert worker.errors == []
