"""A reader that hangs without failing (issue 35, the wedged reader): the hub stops answering one
partition's link and keeps it open, so the pump waits in its read for ever while its lease is
renewed. Once the read has handed nothing over for ``reader_wedged`` seconds and the hub holds events
behind it, the pump is restarted as a failing reader, and released for another worker once it has
kept failing for ``reader_stuck``. A read with nothing waiting behind it is left alone. Driven on the
fake clock, one cycle at a time (the watch asks the hub on a thread of its own)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from balancer.model import EventKind
from tests.support.waiting import until
from workers.hub.embedded import EmbeddedHub
from workers.runtime.processor import EventProcessor
from workers.runtime.wedged import WedgeWatch
from workers.sources.base import PartitionProperties

from .conftest import Recorder, Rig, metric
from .test_stuck_readers import settled

WEDGED = 5.0  # reader_wedged, seconds
STUCK = 20.0  # reader_stuck, seconds


class HangingLink:
    """A reader whose reads hang until ``gone`` is set (then give nothing), as a wedged link does."""

    def __init__(self, reader: Any, gone: threading.Event) -> None:
        self._reader, self._gone = reader, gone

    def receive(self, max_events: int) -> list[Any]:
        self._gone.wait()
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


class SilentLink:
    """A reader whose reads give nothing, whatever waits: a link the hub stopped answering, behind a
    reader whose read returns what its long poll queued (the Event Hubs reader)."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader

    def receive(self, max_events: int) -> list[Any]:
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


class HangingOn:
    """The hub, except that the readers of the partitions in ``hung`` hang on every read (or, with
    ``silent``, give nothing)."""

    def __init__(self, hub: EmbeddedHub) -> None:
        self._hub = hub
        self.hung: set[str] = set()
        self.silent = False
        self.gone = threading.Event()  # set at the end: the hung reads' threads end

    def reader(self, partition_id: str, position: Any) -> Any:
        reader = self._hub.reader(partition_id, position)
        if partition_id not in self.hung:
            return reader
        return SilentLink(reader) if self.silent else HangingLink(reader, self.gone)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hub, name)


async def answered(worker: EventProcessor) -> None:
    watch = worker._pumpset.wedges
    assert watch is not None
    await until(lambda: not watch._asking, what="the hub's answer")


async def until_abandoned(rig: Rig, worker: EventProcessor, task: Any) -> None:
    """Look every ``WEDGED`` seconds (a cycle each, waiting for the hub's answers) until ``task``'s pump
    is abandoned: found within a few looks (the watch asks one question at a time, the idle healthy
    partition's maybe first, and confirms at the next look)."""
    for _ in range(6):
        rig.clock.advance(WEDGED)
        await worker.step()
        await answered(worker)
        if task.done():
            return
    raise AssertionError("the wedged pump was not abandoned within 6 looks")


async def wedge(
    rig: Rig, waiting: int, silent: bool = False
) -> tuple[HangingOn, Recorder, EventProcessor, EventProcessor, str]:
    """``a`` (reading through a ``HangingOn``) and ``b`` settled on two partitions each; one of ``a``'s
    partitions (returned) then hangs in a new read (``silent``: idles on reads that give nothing) with
    ``waiting`` events behind it."""
    for pid in "0123":
        rig.send(pid, 3)
    source = HangingOn(rig.hub)
    handled = Recorder()
    a = rig.worker("a", handled, strategy="cooperative", source=source, reader_stuck=STUCK, reader_wedged=WEDGED)
    b = rig.worker("b", handled, strategy="cooperative")
    await settled(rig, a, b)
    stuck = min(a.coordinator.owned)
    await until(lambda: len(handled.sequences(stuck)) == 3, what="the partition's first events handled")
    source.hung.add(stuck)
    source.silent = silent
    if waiting:
        rig.send(stuck, waiting)
    pump, task = a._pumpset.running[stuck]
    pump.stop()  # ends after its checkpoint (at 2): the next pump's reader hangs
    await until(task.done, what="the partition's pump to stop")
    await a.step()
    if silent:
        await until(lambda: a._pumpset.running[stuck][0].stats.idle_waits > 0, what="the new pump to idle")
    else:
        await until(lambda: a._pumpset.running[stuck][0].reading_since is not None, what="the new pump to hang")
    return source, handled, a, b, stuck


async def test_a_read_hanging_while_events_wait_is_restarted_then_released_to_another_worker(rig: Rig) -> None:
    source, handled, a, b, stuck = await wedge(rig, waiting=2)
    try:
        restarts = metric("leaseboard_stuck_heals_total", cause="reader", step="restart")
        first = a._pumpset.running[stuck][1]
        rig.clock.advance(WEDGED - 1.0)
        await a.step()  # seen hanging: not for the bound yet
        assert not first.done() and not a._pumpset.readers.failing(stuck)
        # From the bound on it may be asked about and confirmed in one step: the watch's own timer looks
        # too once the clock has passed its moment (a look between the test's advance and its step).
        await until_abandoned(rig, a, first)  # asked (one question at a time), then confirmed
        assert first.cancelled() and a._pumpset.readers.failing(stuck)
        assert metric("leaseboard_partition_stuck", partition=stuck, cause="reader") == 1
        await a.step()  # restarted: its new read hangs too
        assert metric("leaseboard_stuck_heals_total", cause="reader", step="restart") == restarts + 1
        assert stuck in a.coordinator.owned
        for _ in range(6):  # restarted, wedged again, ... until failing for STUCK: released
            if stuck not in a.coordinator.owned or stuck in a._pumpset._giving_up:
                break
            rig.clock.advance(WEDGED)
            await a.step()
            await answered(a)
        await until(lambda: stuck not in a.coordinator.owned, what="the wedged partition to be released")
        released = [e for e in rig.sinks["a"].seen if e.kind is EventKind.RELEASE and e.partition_id == stuck]
        assert [e.reason for e in released] == [f"stuck: reader failing {STUCK:.0f} s"]
        await b.step()  # the other worker takes it at once and handles what waited
        assert stuck in b.coordinator.owned
        await until(lambda: handled.sequences(stuck, "b") == [3, 4], what="b to handle what waited")
        assert handled.sequences(stuck, "a") == [0, 1, 2]  # nothing handled twice
    finally:
        source.gone.set()
        await a.shutdown()
        await b.shutdown()


async def test_a_read_hanging_with_nothing_behind_it_is_left_alone(rig: Rig) -> None:
    source, _, a, b, stuck = await wedge(rig, waiting=0)
    try:
        pump, task = a._pumpset.running[stuck]
        for _ in range(4):  # 4 bounds: asked about each time, nothing waits
            rig.clock.advance(WEDGED)
            await a.step()
            await answered(a)
        assert not task.done() and a._pumpset.running[stuck][0] is pump
        assert not a._pumpset.readers.failing(stuck) and stuck in a.coordinator.owned
    finally:
        source.gone.set()
        await a.shutdown()
        await b.shutdown()


async def test_a_reader_that_gives_nothing_while_events_wait_is_restarted(rig: Rig) -> None:
    _, _, a, b, stuck = await wedge(rig, waiting=2, silent=True)
    try:
        first = a._pumpset.running[stuck][1]
        await until_abandoned(rig, a, first)
        assert a._pumpset.readers.failing(stuck)
        await a.step()  # restarted
        assert not a._pumpset.running[stuck][1].done()
    finally:
        await a.shutdown()
        await b.shutdown()


class StillPump:
    """What the wedge watch reads of a pump: ``handed`` moves only when the test says so."""

    def __init__(self) -> None:
        self.handed_over = 0
        self.reading_since: float | None = 1.0  # in a read
        self.stopping = False
        self.paused = False

    def calling(self) -> None:
        return None

    def handed(self) -> int:
        return self.handed_over


async def test_a_pump_that_stops_moving_while_events_wait_is_found_by_the_watchs_own_timer() -> None:
    """Between the worker's looks (seconds apart in a quiet fleet) the watch looks on a timer of its
    own: a pump seen handing events over that then stops, with events waiting, is found wedged with no
    further look from the worker, from the question to its confirmation; a pump never seen moving is
    not what the timer is for, so with only that one the watch sets no timer at all."""
    bound = 0.3
    pumps = {"0": StillPump()}
    asked: list[str] = []
    found: list[tuple[str, float]] = []

    def properties(pid: str) -> PartitionProperties:
        asked.append(pid)
        return PartitionProperties(pid, 0, 100, None, None, False)  # events wait: up to 100

    watch = WedgeWatch(
        bound,
        properties,
        time.monotonic,
        lambda pid, since: found.append((pid, since)),
        sleep=asyncio.sleep,
        pumps=lambda: pumps,
    )
    try:
        watch.look(pumps)  # first seen: not moving yet, so no timer
        assert watch._timer is not None and not watch._timer.armed
        pumps["0"].handed_over = 5
        watch.look(pumps)  # it moved: from here it stands still, and the worker looks no more
        moved = time.monotonic()
        await until(lambda: bool(found), what="the still pump to be found wedged on the watch's timer")
        assert [pid for pid, _ in found] == ["0"] and asked == ["0"]
        assert found[0][1] == pytest.approx(moved, abs=bound)  # still since the look that saw it move
    finally:
        watch.cancel()
