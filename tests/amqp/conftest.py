"""Fixtures: the AMQP hub in-process on a free port (one per test module), and helpers around the real SDK.

``served`` is the module's server; its hub directory holds ``sensors`` (4 partitions). Tests that
need a hub of their own create one under ``served.root`` with :func:`new_hub`, so they do not see
each other's events. Waiting is always polling with a deadline (``tests.support.waiting``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient, PartitionContext

from tests.support.waiting import until_sync
from workers.hub.amqp.auth import SasKey
from workers.hub.amqp.connection import Limits
from workers.hub.amqp.server import HubServer
from workers.hub.amqp.thread import ServerThread
from workers.hub.embedded import EmbeddedHub
from workers.sources.base import Position

T = TypeVar("T")
_names = itertools.count()


@dataclass
class Served:
    """A running AMQP hub, its hub directory and its key."""

    thread: ServerThread
    root: Path
    key: SasKey

    @property
    def server(self) -> HubServer:
        return self.thread.server

    @property
    def connection_string(self) -> str:
        return self.thread.connection_string

    @property
    def port(self) -> int:
        return self.thread.port

    def call(self, fn: Callable[[], T]) -> T:
        return self.thread.call(fn)

    def owner_levels(self, hub: str, partition_id: str) -> list[int | None]:
        """Owner levels of the receivers attached to a partition, as the server sees them."""

        def levels() -> list[int | None]:
            receivers = self.server.receivers.all()
            return [r.owner_level for r in receivers if r.hub.name == hub and r.partition_id == partition_id]

        return self.call(levels)


def serve(root: Path, limits: Limits | None = None, key: SasKey | None = None) -> Served:
    key = key or SasKey.generate()
    thread = ServerThread(HubServer(root, key, limits=limits or Limits(), poll_interval=0.01)).start()
    return Served(thread, root, key)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("amqp")
    EmbeddedHub(root, "sensors", partitions=4).close()
    running = serve(root)
    yield running
    running.thread.stop()


def new_hub(served: Served, partitions: int = 4) -> EmbeddedHub:
    """A fresh hub of the module's server, named uniquely."""
    return EmbeddedHub(served.root, f"hub{next(_names)}", partitions=partitions)


def producer(served: Served, hub: str, **kwargs: Any) -> EventHubProducerClient:
    return EventHubProducerClient.from_connection_string(served.connection_string, eventhub_name=hub, **kwargs)


def consumer(served: Served, hub: str, group: str = "$Default", **kwargs: Any) -> EventHubConsumerClient:
    return EventHubConsumerClient.from_connection_string(
        served.connection_string, consumer_group=group, eventhub_name=hub, **kwargs
    )


@dataclass
class Receiving:
    """A sync ``EventHubConsumerClient.receive`` running on a thread, collecting what it gets."""

    client: EventHubConsumerClient
    events: list[EventData] = field(default_factory=list)
    contexts: list[PartitionContext] = field(default_factory=list)
    errors: list[Exception] = field(default_factory=list)
    thread: threading.Thread | None = None

    def wait_for(self, count: int, timeout: float = 10.0) -> list[EventData]:
        until_sync(
            lambda: len(self.events) >= count, f"{count} events", timeout, detail=lambda: f"got {len(self.events)}"
        )
        return self.events

    def close(self) -> None:
        self.client.close()
        if self.thread is not None:
            self.thread.join(10)


def start_receiving(client: EventHubConsumerClient, **kwargs: Any) -> Receiving:
    receiving = Receiving(client)

    def on_event(context: PartitionContext, event: EventData | None) -> None:
        if event is not None:
            receiving.events.append(event)
            receiving.contexts.append(context)

    def on_error(context: PartitionContext | None, error: Exception) -> None:
        receiving.errors.append(error)

    receiving.thread = threading.Thread(
        target=client.receive, kwargs={"on_event": on_event, "on_error": on_error, **kwargs}, daemon=True
    )
    receiving.thread.start()
    return receiving


@pytest.fixture
def receivers() -> Iterator[list[Receiving]]:
    """Receivers a test started; closed at its end whatever happened."""
    started: list[Receiving] = []
    yield started
    closing = [threading.Thread(target=r.close) for r in started]  # each close takes the SDK a while
    for thread in closing:
        thread.start()
    for thread in closing:
        thread.join(15)


def body(event: EventData) -> bytes:
    """An event's data body as bytes (the SDK hands data sections out as an iterator)."""
    return b"".join(event.body)  # type: ignore[arg-type]


def bodies(events: list[EventData]) -> list[bytes]:
    return [body(e) for e in events]


def make_timed_hub(served: Served) -> EmbeddedHub:
    """A new hub with five events in partition 0 ("e0".."e4"), enqueued at 1000, 1001, ... 1004 s;
    later events get the real time."""
    clock = itertools.chain((float(t) for t in range(1000, 1005)), iter(time.time, None))
    hub = EmbeddedHub(served.root, f"timed{next(_names)}", partitions=1, clock=lambda: next(clock))
    for i in range(5):
        hub.send(f"e{i}".encode(), partition_id="0")
    return hub


def read_offsets(hub: EmbeddedHub, partition_id: str = "0") -> list[str]:
    reader = hub.reader(partition_id, Position())
    try:
        return [e.offset for e in reader.receive(10_000)]
    finally:
        reader.close()
