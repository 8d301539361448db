"""Microsoft's ``azure-eventhub`` asyncio clients against the embedded hub's AMQP server."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from azure.eventhub import EventData
from azure.eventhub.aio import EventHubConsumerClient, EventHubProducerClient, PartitionContext
from azure.eventhub.exceptions import AuthenticationError

from tests.support.waiting import until
from workers.hub.embedded import EmbeddedHub
from workers.sources.base import Position
from workers.sources.eventhubs import is_stolen

from .conftest import Served, bodies, body, make_timed_hub, new_hub, read_offsets


def aproducer(served: Served, hub: str, **kwargs: Any) -> EventHubProducerClient:
    return EventHubProducerClient.from_connection_string(served.connection_string, eventhub_name=hub, **kwargs)


def aconsumer(served: Served, hub: str, **kwargs: Any) -> EventHubConsumerClient:
    return EventHubConsumerClient.from_connection_string(
        served.connection_string, consumer_group="$Default", eventhub_name=hub, **kwargs
    )


class Collector:
    """Callbacks for ``receive`` that keep what arrives."""

    def __init__(self) -> None:
        self.events: list[EventData] = []
        self.contexts: list[PartitionContext] = []
        self.errors: list[Exception] = []

    async def on_event(self, context: PartitionContext, event: EventData | None) -> None:
        if event is not None:
            self.events.append(event)
            self.contexts.append(context)

    async def on_error(self, context: PartitionContext | None, error: Exception) -> None:
        self.errors.append(error)

    def has(self, count: int) -> bool:
        return len(self.events) >= count


async def receiving(client: EventHubConsumerClient, collector: Collector, **kwargs: Any) -> asyncio.Task[None]:
    return asyncio.create_task(client.receive(collector.on_event, on_error=collector.on_error, **kwargs))


async def closing(client: EventHubConsumerClient, task: asyncio.Task[None]) -> None:
    await client.close()
    # The SDK's receive sleeps out its load-balancing interval after a close; nothing to wait for.
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_async_clients_read_properties_send_and_receive(served: Served) -> None:
    hub = new_hub(served, partitions=2)
    async with aproducer(served, hub.name) as producer:
        props = await producer.get_eventhub_properties()
        batch = await producer.create_batch(partition_key="home-3")
        for i in range(5):
            batch.add(EventData(f"k{i}".encode()))
        await producer.send_batch(batch)
        await producer.send_event(EventData(b"direct"), partition_id="0")
        partition = await producer.get_partition_properties(hub.partition_for_key("home-3"))
    assert props["partition_ids"] == ["0", "1"]
    keyed = hub.partition_for_key("home-3")
    expected = 5 + (1 if keyed == "0" else 0)
    assert partition["last_enqueued_sequence_number"] == expected - 1
    collector = Collector()
    client = aconsumer(served, hub.name)
    task = await receiving(client, collector, partition_id=keyed, starting_position="-1")
    await until(lambda: len(collector.events) >= expected, f"{expected} events")
    await closing(client, task)
    keyed_events = [e for e in collector.events if e.partition_key == b"home-3"]
    assert bodies(keyed_events) == [f"k{i}".encode() for i in range(5)]
    assert [e.sequence_number for e in collector.events] == list(range(expected))


AT_1002 = datetime.datetime.fromtimestamp(1002, datetime.UTC)
POSITIONS: dict[str, tuple[object, bool, list[int]]] = {
    "start": ("-1", False, [0, 1, 2, 3, 4]),
    "sequence": (1, False, [2, 3, 4]),
    "sequence-inclusive": (1, True, [1, 2, 3, 4]),
    "offset": ("offset of 2", False, [3, 4]),
    "offset-inclusive": ("offset of 2", True, [2, 3, 4]),
    "time": (AT_1002, False, [3, 4]),
    "time-inclusive": (AT_1002, True, [2, 3, 4]),
    "latest": ("@latest", False, [5]),
}


async def test_receivers_start_at_every_kind_of_position(served: Served) -> None:
    hub = make_timed_hub(served)  # e0..e4 enqueued at 1000..1004 s
    offsets = read_offsets(hub)
    started = {}
    for i, (name, (start, inclusive, _)) in enumerate(POSITIONS.items()):
        # A consumer group each: Event Hubs allows five receivers per partition and consumer group.
        client = EventHubConsumerClient.from_connection_string(
            served.connection_string, consumer_group=f"positions{i}", eventhub_name=hub.name
        )
        collector = Collector()
        position = offsets[2] if start == "offset of 2" else start
        task = await receiving(
            client, collector, partition_id="0", starting_position=position, starting_position_inclusive=inclusive
        )
        started[name] = (client, collector, task)
    # Eight clients, each its own connection, CBS handshake and attach: under ci-under-load they took
    # over the default 10 s once (the deadline guards against a hang, not a speed).
    attached = lambda: len(served.owner_levels(hub.name, "0")) == len(POSITIONS)  # noqa: E731
    await until(attached, "every receiver to attach", 60)
    hub.send(b"e5", partition_id="0")  # after every receiver attached: only "latest" starts with it
    try:
        for name, (_, collector, _) in started.items():
            expected = POSITIONS[name][2]
            await until(partial(collector.has, len(expected)), f"{name}: {expected}")
            events = collector.events[: len(expected)]
            assert [e.sequence_number for e in events] == expected, name
            assert bodies(events) == [f"e{s}".encode() for s in expected], name
            assert [e.offset for e in events] == [read_offsets(hub)[s] for s in expected], name
    finally:
        await asyncio.gather(*(closing(client, task) for client, _, task in started.values()))


async def test_a_higher_owner_level_cuts_off_an_async_receiver(served: Served) -> None:
    hub = new_hub(served, partitions=1)
    old, new = Collector(), Collector()
    old_client, new_client = aconsumer(served, hub.name), aconsumer(served, hub.name)
    old_task = await receiving(old_client, old, partition_id="0", owner_level=0, starting_position="-1")
    await until(lambda: served.owner_levels(hub.name, "0") == [0], "the first receiver to attach")
    new_task = await receiving(new_client, new, partition_id="0", owner_level=1, starting_position="-1")
    await until(lambda: old.errors, "the first receiver to be cut off")
    assert is_stolen(old.errors[0])
    hub.send(b"for the new owner", partition_id="0")
    await until(lambda: new.events, "the new owner to receive")
    assert bodies(new.events) == [b"for the new owner"] and old.events == []
    await closing(old_client, old_task)
    await closing(new_client, new_task)


async def test_the_processor_tracks_last_enqueued_properties_on_every_partition(served: Served) -> None:
    hub = new_hub(served, partitions=3)
    for p in hub.partition_ids():
        hub.send_batch([b"a", b"b"], partition_id=p)
    collector = Collector()
    client = aconsumer(served, hub.name)
    task = await receiving(client, collector, starting_position="-1", track_last_enqueued_event_properties=True)
    await until(lambda: len(collector.events) >= 6, "every event of every partition")
    await closing(client, task)
    for context in collector.contexts:
        last = context.last_enqueued_event_properties
        assert last is not None and last["sequence_number"] == 1
        assert last["offset"] == hub.properties(context.partition_id).last_enqueued_offset


async def test_many_links_at_once_lose_nothing(served: Served) -> None:
    hub = new_hub(served, partitions=4)
    producers = [aproducer(served, hub.name) for _ in range(6)]

    async def send(i: int, client: EventHubProducerClient) -> None:
        async with client:
            for p in hub.partition_ids():  # one sender link per partition on each client
                await client.send_batch([EventData(f"{i}-{p}-{n}".encode()) for n in range(3)], partition_id=p)

    receivers = [(aconsumer(served, hub.name), Collector()) for _ in range(2)]
    tasks = [await receiving(client, c, starting_position="-1") for client, c in receivers]
    await asyncio.gather(*(send(i, client) for i, client in enumerate(producers)))
    total = 6 * 4 * 3
    for _, collector in receivers:  # every receiver (a processor with in-memory ownership) sees everything
        await until(partial(collector.has, total), f"{total} events", timeout=30)
    for (client, _), task in zip(receivers, tasks, strict=True):
        await closing(client, task)
    stored = {p: hub.reader(p, Position()).receive(1000) for p in hub.partition_ids()}
    assert sum(len(events) for events in stored.values()) == total
    for p, events in stored.items():
        assert sorted(e.body for e in events) == sorted(f"{i}-{p}-{n}".encode() for i in range(6) for n in range(3))
    for _, collector in receivers:
        assert sorted(body(e) for e in collector.events) == sorted(e.body for es in stored.values() for e in es)


async def test_a_wrong_key_is_refused_for_async_clients(served: Served) -> None:
    wrong = served.connection_string.replace(served.key.key, "bm90LXRoZS1rZXk=")
    client = EventHubProducerClient.from_connection_string(wrong, eventhub_name="sensors", retry_total=0)
    refused: Callable[[], Awaitable[object]] = client.get_eventhub_properties
    try:
        await refused()
    except AuthenticationError as exc:
        assert "401" in str(exc) or "InvalidSignature" in str(exc)
    else:
        raise AssertionError("a wrong key was accepted")
    finally:
        await client.close()
    assert EmbeddedHub.exists(served.root, "sensors")
