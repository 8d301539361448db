"""A quiet wait looks at the hub's partitions every interval (issue 34, item 3): no store's channel
tells of partitions added, so without the look a fleet waiting quietly found them only at its next
read (53 s at 30 s / 180 s). The schedule (``balancer.schedule.next_due``) puts a look one interval
into a quiet wait; a change ends the wait, as news does.

Driven by a fake clock: the injected sleep moves it by what was asked, and the loop between two
cycles (``_until_cycle``) is run directly.
"""

from __future__ import annotations

import pytest

from workers.runtime.processor import EventProcessor

from .conftest import Recorder, Rig
from .test_renewal_steps import ticking


async def steady(rig: Rig, asked: list[float]) -> EventProcessor:
    """A worker (interval 2 s, expiry 10 s) whose last cycle was steady, where notices cross processes;
    no pump started (its coordinator cycled directly, as a step's cycle)."""
    a = rig.worker("a", Recorder(), strategy="cooperative", expiry=10.0, interval=2.0, sleep=ticking(rig, asked))  # type: ignore[arg-type]
    a.poll_waiting = False
    for _ in range(12):  # until a cycle is steady (as in test_runtime's quiet waits)
        rig.clock.advance(2.0)
        report = a._last = await a.coordinator.cycle()
        a.cycles += 1
        if not report.planned:
            return a
    raise AssertionError("no steady cycle")


async def test_a_quiet_wait_looks_at_the_partitions_once_an_interval_and_goes_on_while_they_stay(rig: Rig) -> None:
    asked: list[float] = []
    a = await steady(rig, asked)
    delay = a._next_delay()
    assert a._quiet and delay > 3.0  # until quiet_until: 3.5 s less up to the jitter
    asked.clear()
    await a._until_cycle(delay)
    assert asked == pytest.approx([2.0, delay - 2.0])  # a look one interval in, then on to the read
    await a.shutdown()


async def test_partitions_added_during_a_quiet_wait_end_it_at_the_next_look(rig: Rig) -> None:
    asked: list[float] = []
    a = await steady(rig, asked)
    delay = a._next_delay()
    assert a._quiet
    hub = rig.hub

    async def grown() -> tuple[str, ...]:
        return (*hub.partition_ids(), "4")

    a.coordinator.partitions = grown  # type: ignore[attr-defined]
    asked.clear()
    await a._until_cycle(delay)
    assert asked == pytest.approx([2.0])  # the look saw a fifth partition: read now
    await a.shutdown()


async def test_a_wait_of_one_interval_does_not_look(rig: Rig) -> None:
    asked: list[float] = []
    a = await steady(rig, asked)
    a.poll_waiting = True  # polling: no quiet wait, so no look either
    delay = a._next_delay()
    assert not a._quiet
    asked.clear()
    await a._until_cycle(delay)
    assert asked == pytest.approx([delay])
    await a.shutdown()
