"""Reading an embedded hub's partitions and finding their log files, for the hub's tests."""

from __future__ import annotations

from pathlib import Path

from workers.hub.embedded import EmbeddedHub
from workers.sources.base import Position, ReceivedEvent


def read_all(hub: EmbeddedHub, partition_id: str, position: Position | None = None) -> list[ReceivedEvent]:
    """Every event of ``partition_id`` from ``position`` (the earliest by default), read in small batches."""
    reader = hub.reader(partition_id, position or Position.earliest())
    events: list[ReceivedEvent] = []
    while batch := reader.receive(7):  # small batches cross buffer refills
        events.extend(batch)
    reader.close()
    return events


def log_path(hub: EmbeddedHub, partition_id: str) -> Path:
    return hub.path / f"{partition_id}.log"
