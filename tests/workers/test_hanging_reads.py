"""A read that hangs (a silent hub, a starved machine) does not hold back the checkpoint of what was
handled before it: the pump writes it when it comes due by time, while the read is still waiting.

Seen in the Redis netsplit suite on a busy machine: a pump handled 919, its next read
waited 3.4 s on the hub, its lease then ran out, and the next owner handled 919 again because its
checkpoint (due after 1 s) waited for the read. A fake lease on a fake clock; the reader's hang is a
``threading.Event``; waits poll with a deadline.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from tests.support.clock import FakeClock
from tests.support.waiting import until
from workers.sources.base import ReceivedEvent

from .conftest import REF
from .test_pump_lane import ListReader, events, owned_store, pump


class HangingReader(ListReader):
    """Hands out its events, then hangs in ``receive`` until ``release`` is set."""

    def __init__(self, count: int) -> None:
        super().__init__(events(count))
        self.release = threading.Event()
        self.hanging = threading.Event()

    def receive(self, max_events: int) -> list[ReceivedEvent]:
        if self.events:
            return super().receive(max_events)
        self.hanging.set()
        self.release.wait(30)
        return []


def sync_handler(handled: list[int]) -> Any:
    return lambda event, ctx: handled.append(event.sequence_number)


def async_handler(handled: list[int]) -> Any:
    async def handle(event: ReceivedEvent, ctx: Any) -> None:
        handled.append(event.sequence_number)

    return handle


@pytest.mark.parametrize("make", [sync_handler, async_handler], ids=["sync", "async"])
async def test_what_was_handled_is_checkpointed_on_time_while_the_next_read_hangs(make: Any) -> None:
    store, clock, reader = await owned_store(), FakeClock(), HangingReader(5)
    handled: list[int] = []
    p = pump(store, reader, make(handled), clock, clock() + 60, checkpoint_events=100, checkpoint_seconds=1.0)
    task = asyncio.create_task(p.run())
    try:
        await until(lambda: handled == [0, 1, 2, 3, 4] and reader.hanging.is_set(), what="5 events, then a hang")
        assert await store.list_checkpoints(REF) == []  # not due yet: 1 s has not gone by
        clock.advance(1.5)
        await until(lambda: p.stats.checkpointed == 4, what="the checkpoint of 4 while the read hangs")
        assert [c.sequence_number for c in await store.list_checkpoints(REF)] == [4]
        assert not task.done() and not reader.release.is_set()
    finally:
        reader.release.set()
        p.stop()
        stats = await asyncio.wait_for(task, 10)
    assert stats.ended == "stopped" and stats.checkpoints == 1  # nothing new to write at the stop


async def test_a_read_that_hangs_with_nothing_handled_writes_nothing() -> None:
    store, clock, reader = await owned_store(), FakeClock(), HangingReader(0)
    p = pump(store, reader, sync_handler([]), clock, clock() + 60, checkpoint_seconds=1.0)
    task = asyncio.create_task(p.run())
    try:
        await until(reader.hanging.is_set, what="the read to hang")
        clock.advance(5)  # well past checkpoint_seconds while the read hangs
    finally:
        reader.release.set()
        p.stop()
        stats = await asyncio.wait_for(task, 10)
    assert await store.list_checkpoints(REF) == [] and stats.checkpoints == 0
