"""Dead letters for the dashboard's tests: real events of the embedded hub, set aside by the
workers' own ``DeadLetters`` into the configured folder."""

from __future__ import annotations

from pathlib import Path

from django.conf import LazySettings
from proton import Message

from balancer.model import HubRef
from workers.hub.amqp.messages import parse
from workers.hub.embedded import EmbeddedHub
from workers.runtime.deadletters import DeadLetters
from workers.sources.base import Position, ReceivedEvent


def with_properties(body: bytes, properties: dict[str, object]) -> bytes:
    """The AMQP sections the embedded hub keeps of a message sent with ``properties``."""
    return parse(bytes(Message(body=body, properties=properties).encode()), 0).amqp[0]


def set_aside(
    settings: LazySettings,
    ref: HubRef,
    hub: EmbeddedHub,
    bodies: list[bytes],
    partition: str = "0",
    amqp: list[bytes] | None = None,
) -> list[ReceivedEvent]:
    """Send ``bodies`` to ``partition`` and set each aside as a worker of ``ref`` whose handler failed."""
    events = hub.send_batch(bodies, partition_id=partition, partition_key="home-7", amqp=amqp)
    letters = DeadLetters(Path(settings.LEASEBOARD_DEADLETTER_DIR))
    for event in events:
        letters.add(ref, "w1", event, ValueError(f"cannot handle {event.body[:12]!r}"), 3)
    return events


def read_after(hub: EmbeddedHub, partition: str, sequence: int) -> list[ReceivedEvent]:
    """The events of ``partition`` after ``sequence`` (all there are now)."""
    reader = hub.reader(partition, Position.after(sequence))
    try:
        found: list[ReceivedEvent] = []
        while batch := reader.receive(100):
            found += batch
        return found
    finally:
        reader.close()
