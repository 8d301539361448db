"""A worker cut off from the hub while it still reaches the store (issue 35): its readers fail nothing,
they only wait, so it asks the hub once they go quiet (``workers.runtime.hubwatch``). Silent for
``reader_stuck`` seconds it hands its partitions over (``Balancer.cannot_read``), and the first answer
after that takes it back into the plans (``Balancer.can_read``). Driven on a fake clock, one look at a
time; the probes are real threads."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from balancer.avoid import EVERY
from tests.support.waiting import until
from workers.runtime.hubwatch import MAX_IN_FLIGHT, HubGuard, HubWatch

from .conftest import metric


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Hub:
    """``probe()`` answers while up; while down it fails at once (``refuses``) or hangs until the heal."""

    def __init__(self) -> None:
        self.up = True
        self.refuses = True
        self.asked = 0
        self.hanging = 0  # probes waiting in the cut
        self._healed = threading.Event()
        self._healed.set()

    def cut(self, *, refuses: bool) -> None:
        self.up, self.refuses = False, refuses
        self._healed.clear()

    def heal(self, *, hanging_end: bool = True) -> None:
        """Up again; a request sent into the cut ends (fails) now, or later (``hanging_end=False``:
        at ``end_hanging``), as the SDK's retries give up on it."""
        self.up = True
        if hanging_end:
            self._healed.set()

    def end_hanging(self) -> None:
        self._healed.set()

    def probe(self) -> None:
        self.asked += 1
        if self.up:
            return
        if self.refuses:
            raise ConnectionError("the hub is cut off")
        self.hanging += 1
        self._healed.wait(30)  # a request sent into a cut: the SDK gives up after its own retries
        self.hanging -= 1
        raise TimeoutError("timed out")


@dataclass
class Worker:
    """The part of ``Balancer`` the guard uses."""

    clock: Clock
    owned: frozenset[str] = frozenset({"0", "1"})
    said: list[str] = field(default_factory=list)
    avoided: set[str] = field(default_factory=set)
    owner_id: str = "a"

    def monotonic(self) -> float:
        return self.clock()

    def avoiding(self) -> frozenset[str]:
        return frozenset(self.avoided)

    async def cannot_read(self, seconds: float) -> None:
        self.said.append(f"cannot read for {seconds:g}s")
        self.avoided.add(EVERY)

    async def can_read(self) -> None:
        self.said.append("can read")
        self.avoided.discard(EVERY)


def rig(quiet: float = 1.0, bound: float = 3.0) -> tuple[Clock, Hub, Worker, HubGuard, list[int]]:
    clock, hub = Clock(), Hub()
    worker = Worker(clock)
    progress = [0]
    watch = HubWatch(hub.probe, quiet=quiet, answer_within=1.0, clock=clock, most_apart=60.0)
    guard = HubGuard(watch, worker, bound=bound, seconds=300.0, progress=lambda: progress[0])  # type: ignore[arg-type]
    return clock, hub, worker, guard, progress


async def look(guard: HubGuard, clock: Clock, seconds: float, hub: Hub) -> None:
    """``seconds`` of the fake clock, one look every half second; each probe that is answered or refused
    (not one hanging in a cut) has its answer before the next look."""
    for _ in range(round(seconds / 0.5)):
        clock.now += 0.5
        guard.step()
        if hub.up or hub.refuses:  # those sent into a cut that hangs go on hanging
            await until(lambda: len(guard.watch._flying) <= hub.hanging, what="the probes' answers")
        else:
            await asyncio.sleep(0)  # a yield: the probe's task starts its thread


async def test_while_events_come_the_hub_is_never_asked() -> None:
    clock, hub, worker, guard, progress = rig()
    for _ in range(100):
        progress[0] += 5
        clock.now += 0.5
        guard.step()
    assert hub.asked == 0 and worker.said == []


async def test_an_idle_hub_that_answers_is_asked_less_and_less() -> None:
    clock, hub, worker, guard, _ = rig()
    await look(guard, clock, hub=hub, seconds=600.0)
    # gaps of 1, 2, 4, 8, 16, 32, then 60 s: 6 probes in the first 63 s, then one a minute
    assert 12 <= hub.asked <= 16, hub.asked
    assert worker.said == []


async def test_a_hub_that_refuses_for_the_bound_hands_everything_over_until_it_answers() -> None:
    clock, hub, worker, guard, progress = rig()
    handed = metric("leaseboard_stuck_heals_total", cause="hub", step="hand_over")
    await look(guard, clock, hub=hub, seconds=5.0)
    hub.cut(refuses=True)
    await look(guard, clock, hub=hub, seconds=3.0)  # quiet 1 s, then silent 2 s: not yet
    assert worker.said == []
    await look(guard, clock, hub=hub, seconds=2.5)
    await until(lambda: worker.said == ["cannot read for 300s"], what="the worker to say it cannot read")
    assert metric("leaseboard_stuck_heals_total", cause="hub", step="hand_over") == handed + 1
    held = sorted(worker.owned)
    assert held and all(metric("leaseboard_partition_stuck", partition=p, cause="hub") == 1 for p in held)
    worker.owned = frozenset()  # its next cycles hand them over: it keeps asking meanwhile
    await look(guard, clock, hub=hub, seconds=10.0)
    assert worker.said == ["cannot read for 300s"]
    hub.heal()
    await look(guard, clock, hub=hub, seconds=1.5)
    await until(lambda: worker.said[-1:] == ["can read"], what="the worker to say it can read again")
    assert worker.avoiding() == frozenset()
    assert all(metric("leaseboard_partition_stuck", partition=p, cause="hub") == 0 for p in held)
    worker.owned = frozenset({"0"})
    progress[0] += 10
    await look(guard, clock, hub=hub, seconds=20.0)
    assert worker.said == ["cannot read for 300s", "can read"]


async def test_a_probe_hanging_in_the_cut_counts_as_silence_and_does_not_hide_the_heal() -> None:
    clock, hub, worker, guard, _ = rig()
    hub.cut(refuses=False)
    try:
        await look(guard, clock, hub=hub, seconds=6.0)
        await until(lambda: worker.said == ["cannot read for 300s"], what="the worker to say it cannot read")
        assert len(guard.watch._flying) <= MAX_IN_FLIGHT
        hub.heal(hanging_end=False)  # a new probe is answered while those sent into the cut still hang
        await look(guard, clock, hub=hub, seconds=3.0)
        await until(lambda: worker.said[-1:] == ["can read"], what="the worker to say it can read again")
        hub.end_hanging()  # and fail only now
        await until(lambda: not guard.watch._flying, what="the hanging probes to end")
        assert guard.watch.silent_for() == 0.0, "a probe that hung in the healed cut counted again"
    finally:
        hub.heal()
        guard.stop()


async def test_a_worker_that_holds_nothing_asks_nothing() -> None:
    clock, hub, worker, guard, _ = rig()
    worker.owned = frozenset()
    hub.cut(refuses=True)
    await look(guard, clock, hub=hub, seconds=30.0)
    assert hub.asked == 0 and worker.said == []


async def test_time_the_worker_did_not_run_is_not_the_hub_s_silence() -> None:
    # CI, every core taken: a probe answered in time, whose answer the worker's loop got to seconds
    # later, counted as seconds of silence and handed partitions over. The guard's loop measures how
    # late it woke and discounts it (``HubWatch.discount``); a hub really silent still counts.
    clock, hub, worker, guard, _ = rig()
    hub.cut(refuses=False)  # the probe's answer comes only when the worker runs again
    try:
        await look(guard, clock, hub=hub, seconds=1.5)  # quiet 1 s: a probe in flight
        assert len(guard.watch._flying) == 1
        clock.now += 4.0  # the worker's process did not run for 4 s, more than the 3 s bound
        guard.watch.discount(4.0)
        guard.step()
        assert worker.said == [] and guard.watch.silent_for() == 0.0
        hub.heal()
        await look(guard, clock, hub=hub, seconds=5.0)
        assert worker.said == [] and guard.watch.silent_for() == 0.0
        # the same stall not discounted is silence: the worker hands its partitions over
        clock, hub, worker, guard, _ = rig()
        hub.cut(refuses=False)
        await look(guard, clock, hub=hub, seconds=1.5)
        clock.now += 4.0
        guard.step()
        await until(lambda: worker.said == ["cannot read for 300s"], what="the worker to say it cannot read")
    finally:
        hub.heal()
        guard.stop()
