"""A browse ends at the partition's end, not at the first quiet moment of a slow hub.

Seen on a starved machine: ``test_sdk_browse`` asked for partition 0 from sequence number 0 (ten
events there) and got nothing, because the hub sent no batch within the SDK's ``max_wait_time`` (0.5 s)
and an empty batch counted as the end. The browse now asks the partition's properties first: before
the last event enqueued then, an empty batch is a slow hub. A client scripted by the test stands in
for the SDK's (the real SDK on the embedded hub: ``tests/amqp/test_sdk_browse.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from workers.sources.base import ReceivedEvent, Start
from workers.sources.eventhubs import browse


class ScriptedClient:
    """Batches handed to ``receive_batch`` in order (``[]``: an empty one), then empty ones until closed."""

    def __init__(self, batches: list[list[int]], last: int | None) -> None:
        self.batches = batches
        self.last = last  # the properties' last enqueued sequence number; None: the properties fail
        self.closed = threading.Event()
        self.received = 0

    def get_partition_ids(self) -> list[str]:
        return ["0"]

    def get_partition_properties(self, partition_id: str) -> dict[str, Any]:
        if self.last is None:
            raise ConnectionError("no management link")
        return {
            "beginning_sequence_number": 0,
            "last_enqueued_sequence_number": self.last,
            "last_enqueued_offset": str(self.last * 100) if self.last >= 0 else "-1",
            "last_enqueued_time_utc": None,
            "is_empty": self.last < 0,
        }

    def receive_batch(self, on_event_batch: Callable[[Any, list[Any]], None], **kwargs: Any) -> None:
        self.received += 1
        for numbers in self.batches:
            if self.closed.is_set():
                return
            on_event_batch(None, [SimpleNamespace(sequence_number=n, properties={}) for n in numbers])
        while not self.closed.wait(0.05):
            on_event_batch(None, [])

    def close(self) -> None:
        self.closed.set()


@pytest.fixture(autouse=True)
def plain_events(monkeypatch: pytest.MonkeyPatch) -> None:
    def received(partition_id: str, event: Any) -> ReceivedEvent:
        n = event.sequence_number
        return ReceivedEvent(partition_id, n, str(n * 100), 1000.0 + n, None, b"e%d" % n)

    monkeypatch.setattr(browse, "received", received)


def numbers(client: ScriptedClient, start: Start, max_events: int = 100) -> list[int]:
    got = browse.browse_with(client, "0", start, max_events, 1 << 20, None)
    return [b.event.sequence_number for b in got]


def test_an_empty_batch_before_the_last_event_enqueued_is_a_slow_hub_not_the_end() -> None:
    client = ScriptedClient([[], [], [0, 1, 2], [], [3, 4, 5, 6, 7, 8, 9]], last=9)
    assert numbers(client, Start(sequence_number=0)) == list(range(10))
    assert client.closed.is_set()


def test_the_last_event_enqueued_then_an_empty_batch_ends_the_read() -> None:
    client = ScriptedClient([[0, 1, 2]], last=2)  # then empty batches for ever: the end
    assert numbers(client, Start(sequence_number=0)) == [0, 1, 2]


def test_a_start_past_the_end_or_an_empty_partition_reads_nothing_at_once() -> None:
    for client, start in (
        (ScriptedClient([], last=9), Start(sequence_number=10)),
        (ScriptedClient([], last=9), Start(offset="1000")),
        (ScriptedClient([], last=-1), Start(sequence_number=0)),
    ):
        assert numbers(client, start) == [] and client.received == 0 and client.closed.is_set()


def test_without_the_properties_the_first_empty_batch_ends_the_read_as_before() -> None:
    client = ScriptedClient([[0, 1], [], [2, 3]], last=None)
    assert numbers(client, Start(sequence_number=0)) == [0, 1]
