"""A handler call that never returns (issue 35, the handler's part): the worker gives up on it after
``handler_timeout`` (``LEASEBOARD_HANDLER_TIMEOUT``), abandons its thread, restarts the partition
from its checkpoint on a new one, fences whatever the old call does later, and stops after
``abandon_max`` abandoned threads. Driven on the fake clock, one cycle at a time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from balancer.model import EventKind
from tests.support.waiting import until
from workers.handlers import PartitionContext
from workers.runtime.config import PumpConfig
from workers.runtime.processor import EventProcessor
from workers.sources.base import ReceivedEvent

from .conftest import REF, Rig, metric, own_all


class Hanging:
    """Handles events, except that the first ``hangs`` calls on partition 0 block until ``release``;
    each blocked call, once released, notes whether its context still held the lease."""

    def __init__(self, hangs: int) -> None:
        self.hangs = hangs
        self.calls_on_0 = 0
        self.blocked = 0
        self.release = threading.Event()
        self.handled: list[tuple[str, int]] = []
        self.held_after_release: list[bool] = []
        self._lock = threading.Lock()

    def __call__(self, event: ReceivedEvent, ctx: PartitionContext) -> None:
        if ctx.partition_id == "0":
            with self._lock:
                self.calls_on_0 += 1
                hang = self.calls_on_0 <= self.hangs
                if hang:
                    self.blocked += 1
            if hang:
                self.release.wait(60)
                self.held_after_release.append(ctx.holds())
                return
        with self._lock:
            self.handled.append((ctx.partition_id, event.sequence_number))


async def stuck_on_0(rig: Rig, handler: Hanging, *, handler_timeout: float, abandon_max: int = 3) -> EventProcessor:
    """A worker ``a`` holding all four partitions, its handler blocked on partition 0."""
    a = rig.worker("a", handler, handler_timeout=handler_timeout, abandon_max=abandon_max)
    await own_all(a, 4)
    await until(lambda: handler.blocked >= 1, what="the handler to hang on partition 0")
    return a


async def step_until(a: EventProcessor, condition: Callable[[], bool], what: str) -> None:
    """Cycle ``a`` (the fake clock standing still) until ``condition``, yielding to its pumps between cycles."""

    async def stepped() -> bool:
        await a.step()
        return condition()

    await until(stepped, what=what)


async def test_a_handler_call_over_the_timeout_is_abandoned_and_its_partition_restarted_from_the_checkpoint(
    rig: Rig,
) -> None:
    for pid in "0123":
        rig.send(pid, 3)
    handler = Hanging(hangs=1)
    restarts = metric("leaseboard_stuck_heals_total", cause="handler", step="restart")
    a = await stuck_on_0(rig, handler, handler_timeout=5.0)
    await a.step()  # the watch sees the call: the timeout runs from here
    rig.clock.advance(4.9)
    await a.step()
    assert "0" in a.pumping and handler.calls_on_0 == 1, "given up on before its timeout"
    rig.clock.advance(0.1)
    await a.step()  # 5 s with the same event in hand: abandoned
    assert metric("leaseboard_stuck_heals_total", cause="handler", step="restart") == restarts + 1
    heals = [(e.partition_id, e.reason) for e in rig.sinks["a"].seen if e.kind is EventKind.HEAL]
    assert heals == [("0", "restarted: handler running 5 s")]  # said to the console, with why
    assert metric("leaseboard_partition_stuck", partition="0", cause="handler") == 1
    await step_until(a, lambda: sorted(handler.handled).count(("0", 2)) == 1, "partition 0 handled on a new thread")
    await a.step()
    assert metric("leaseboard_partition_stuck", partition="0", cause="handler") == 0  # past the event it stuck on
    assert sorted(s for p, s in handler.handled if p == "0") == [0, 1, 2]  # from the start: no checkpoint yet
    assert handler.calls_on_0 == 4 and a.failure is None and "0" in a.coordinator.owned
    handler.release.set()  # the abandoned call returns at last: fenced
    await until(lambda: handler.held_after_release == [False], what="the abandoned call to see it holds nothing")
    await a.shutdown()
    checkpoints = {c.partition_id: c.sequence_number for c in await rig.store.list_checkpoints(REF)}
    assert checkpoints == {"0": 2, "1": 2, "2": 2, "3": 2}


async def test_a_partition_whose_handler_sticks_again_on_the_same_event_is_released_to_another_worker(
    rig: Rig,
) -> None:
    rig.send("0", 3)
    handler = Hanging(hangs=2)  # the restarted call sticks on the same event too
    releases = metric("leaseboard_stuck_heals_total", cause="handler", step="release")
    a = await stuck_on_0(rig, handler, handler_timeout=5.0, abandon_max=5)
    await a.step()
    rig.clock.advance(5.0)
    await a.step()  # abandoned, restarted from the checkpoint: step one
    await step_until(a, lambda: handler.blocked >= 2, "the restarted call to hang on the same event")
    assert "0" in a.coordinator.owned
    assert metric("leaseboard_partition_stuck", partition="0", cause="handler") == 1  # the same event again
    await a.step()
    rig.clock.advance(5.0)
    await a.step()  # stuck again on event 0: step two, released for another worker
    await until(lambda: "0" not in a.coordinator.owned, what="the partition to be released")
    assert metric("leaseboard_stuck_heals_total", cause="handler", step="release") == releases + 1
    assert metric("leaseboard_partition_stuck", partition="0", cause="handler") == 0  # not held here any more
    released = [e for e in rig.sinks["a"].seen if e.kind is EventKind.RELEASE and e.partition_id == "0"]
    assert [e.reason for e in released] == ["stuck: handler running 5 s"]
    assert a.coordinator.avoiding() == {"0"} and a.failure is None
    b = rig.worker("b", handler, handler_timeout=5.0)
    await step_until(b, lambda: ("0", 2) in handler.handled, "b to take partition 0 and handle what waited")
    assert sorted(s for p, s in handler.handled if p == "0") == [0, 1, 2]
    handler.release.set()
    await until(lambda: handler.held_after_release == [False, False], what="the abandoned calls to be fenced")
    await a.shutdown()
    await b.shutdown()


async def test_a_call_is_timed_from_its_start_not_from_when_a_look_first_saw_it(rig: Rig) -> None:
    # A quiet worker looks every few seconds: a call first seen 2 s after it began was given 2 s more.
    rig.send("0", 3)
    handler = Hanging(hangs=1)
    a = await stuck_on_0(rig, handler, handler_timeout=4.0)  # the call began at the clock's time now
    rig.clock.advance(2.0)
    await a.step()  # the first look at it
    assert "0" in a.pumping and handler.calls_on_0 == 1
    rig.clock.advance(2.5)
    await a.step()  # 4.5 s since the call began, 2.5 s since the look
    await step_until(a, lambda: handler.calls_on_0 >= 2, "partition 0 to be restarted on a new thread")
    assert a._pumpset.abandoned == 1
    handler.release.set()
    await a.shutdown()


async def test_a_worker_stops_after_abandoning_abandon_max_handler_threads(rig: Rig) -> None:
    rig.send("0", 3)
    handler = Hanging(hangs=100)
    stops = metric("leaseboard_stuck_heals_total", cause="handler", step="stop")
    a = await stuck_on_0(rig, handler, handler_timeout=5.0, abandon_max=2)
    a.shutdown_timeout = 0.2
    for blocked in (1, 2):
        await step_until(a, lambda n=blocked: handler.blocked >= n, f"call {blocked} to hang")  # type: ignore[misc]
        await a.step()
        rig.clock.advance(5.0)
        await a.step()
    assert a.stopping and a.failure is not None
    assert "2 handler calls stuck past LEASEBOARD_HANDLER_TIMEOUT (5s) were abandoned" in a.failure
    assert metric("leaseboard_stuck_heals_total", cause="handler", step="stop") == stops + 1
    await a.shutdown()
    assert all(r.owner_id == "" for r in await rig.store.list_ownership(REF))  # released for the others
    handler.release.set()


async def test_with_no_timeout_a_handler_call_is_never_given_up_on(rig: Rig) -> None:
    rig.send("0", 1)
    handler = Hanging(hangs=1)
    a = await stuck_on_0(rig, handler, handler_timeout=0.0)
    for _ in range(3):
        rig.clock.advance(1000.0)
        await a.step()
    assert handler.calls_on_0 == 1 and "0" in a.pumping and a.failure is None
    handler.release.set()
    await a.shutdown()


@pytest.mark.parametrize(("timeout", "most"), [(-1.0, 3), (float("nan"), 3), (5.0, 0)])
def test_a_negative_timeout_or_no_abandoned_thread_allowed_is_refused(timeout: float, most: int) -> None:
    with pytest.raises(ValueError, match="handler_timeout must be >= 0 seconds"):
        PumpConfig(handler_timeout=timeout, abandon_max=most)


async def test_an_async_handler_call_over_the_timeout_is_cancelled_and_its_partition_restarted(rig: Rig) -> None:
    rig.send("0", 2)
    calls: list[int] = []
    cancelled: list[int] = []

    async def handler(event: ReceivedEvent, ctx: PartitionContext) -> None:
        if ctx.partition_id != "0":
            return
        calls.append(event.sequence_number)
        if len(calls) == 1:
            try:
                await asyncio.Event().wait()  # never set
            except asyncio.CancelledError:
                cancelled.append(event.sequence_number)
                raise

    a = rig.worker("a", handler, handler_timeout=5.0)
    await own_all(a, 4)
    await until(lambda: calls == [0], what="the async handler to hang")
    await a.step()
    rig.clock.advance(5.0)
    await a.step()
    await step_until(a, lambda: calls == [0, 0, 1], "partition 0 handled again from its start")
    assert cancelled == [0] and a.failure is None
    await a.shutdown()
