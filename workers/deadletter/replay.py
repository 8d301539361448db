"""Sending dead letters to the hub again: each to the partition it came from, with the application
property ``leaseboard-replayed-from`` = ``"<partition>:<sequence number>"`` naming where it was,
its body, key and other properties as they were. The workers then handle it as a new event.

Each replay is marked beside the dead-letter file (``files.markers_locked``), under a lock held
from the check to the last mark: a dead letter already replayed is refused (``AlreadyReplayed``)
unless forced, even when two operators replay it at once. A crash between a send and its mark
leaves that one event sent and unmarked: replayed at least once, never silently dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from workers.hub.embedded import EmbeddedHub

from .decode import properties_of, with_property
from .files import Entry, add_marker, b64, markers_locked

REPLAYED_FROM = "leaseboard-replayed-from"


@dataclass(frozen=True, slots=True)
class Letter:
    """One dead letter as it is sent again."""

    partition_id: str
    sequence_number: int
    body: bytes
    amqp: bytes  # its AMQP sections but the body (``ReceivedEvent.amqp``); b"" when none were kept
    partition_key: str | None

    @property
    def position(self) -> str:
        return f"{self.partition_id}:{self.sequence_number}"

    @classmethod
    def of(cls, entry: Entry) -> Letter:
        """The letter of a dead-letter file's entry. Raises ValueError for an entry without a body."""
        try:
            body, amqp = b64(entry["body_base64"]), b64(entry.get("amqp_base64"))
            partition, sequence = str(entry["partition_id"]), int(entry["sequence_number"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"dead letter {entry.get('sequence_number')} has no readable body") from None
        key = entry.get("partition_key")
        return cls(partition, sequence, body, amqp, str(key) if key else None)


class Sender(Protocol):
    def send(self, letter: Letter) -> str | None:
        """Send ``letter`` again; the new event's ``"<partition>:<sequence>"`` when the hub says it."""

    def close(self) -> None: ...


class EmbeddedSender:
    """Appends to the embedded hub (the caller's ``EmbeddedHub``, left open)."""

    def __init__(self, hub: EmbeddedHub) -> None:
        self.hub = hub

    def send(self, letter: Letter) -> str | None:
        amqp = with_property(letter.amqp, REPLAYED_FROM, letter.position)
        (sent,) = self.hub.send_batch(
            [letter.body], partition_key=letter.partition_key, partition_id=letter.partition_id, amqp=[amqp]
        )
        return f"{sent.partition_id}:{sent.sequence_number}"

    def close(self) -> None:
        pass


class EventHubsSender:
    """Sends to Azure Event Hubs with the SDK's producer (its properties are the ones the dead letter
    kept, which the SDK encodes anew). The service does not say a sent event's sequence number."""

    def __init__(self, connection_string: str, hub: str) -> None:
        from azure.eventhub import EventHubProducerClient

        self.client = EventHubProducerClient.from_connection_string(connection_string, eventhub_name=hub)

    def send(self, letter: Letter) -> str | None:
        from azure.eventhub import EventData

        event = EventData(letter.body)
        properties: dict[str | bytes, Any] = {k: v for k, v in properties_of(letter.amqp).items() if k != REPLAYED_FROM}
        properties[REPLAYED_FROM] = letter.position
        event.properties = properties
        batch = self.client.create_batch(partition_id=letter.partition_id)
        batch.add(event)
        self.client.send_batch(batch)
        return None

    def close(self) -> None:
        self.client.close()


class AlreadyReplayed(Exception):
    """Some of the dead letters were replayed before; ``markers`` says when, by whom and as what."""

    def __init__(self, markers: dict[int, Entry]) -> None:
        super().__init__(", ".join(describe(m) for m in markers.values()))
        self.markers = markers


def describe(marker: Entry) -> str:
    """``"0:7 already replayed at 2026-11-30 10:40:00 UTC by ops (as 0:15)"``."""
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(marker.get("replayed_at") or 0)))
    text = f"{marker.get('partition_id')}:{marker.get('sequence_number')} already replayed at {at}"
    if marker.get("user"):
        text += f" by {marker['user']}"
    return text + (f" (as {marker['to']})" if marker.get("to") else "")


def replay(
    folder: Path,
    consumer_group: str,
    letters: Sequence[Letter],
    sender: Sender,
    *,
    user: str,
    force: bool = False,
    clock: Callable[[], float] = time.time,
) -> list[dict[str, Any]]:
    """Send ``letters`` (of one partition) again and mark each; the marks. Raises AlreadyReplayed
    (nothing sent) when one was replayed before and ``force`` is off; the sender's error after
    marking those sent before it."""
    if not letters:
        return []
    partition = letters[0].partition_id
    with markers_locked(folder, partition, consumer_group) as (markers, f):
        before = {n: markers[n] for n in (letter.sequence_number for letter in letters) if n in markers}
        if before and not force:
            raise AlreadyReplayed(before)
        done = []
        for letter in letters:
            to = sender.send(letter)
            mark = {
                "consumer_group": consumer_group,
                "partition_id": letter.partition_id,
                "sequence_number": letter.sequence_number,
                "replayed_at": clock(),
                "user": user,
                "to": to,
                "again": letter.sequence_number in before,
            }
            add_marker(f, mark)
            done.append(mark)
        return done
