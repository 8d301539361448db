"""A partition whose reader keeps failing (issue 35, the reader's part): restarted at every cycle,
then, still failing after ``reader_stuck`` seconds (``LEASEBOARD_READER_STUCK``), released with its
reason for another worker, which takes it at once; the worker it was stuck on does not take it back
(``Balancer.give_up``). Driven on the fake clock, one cycle at a time."""

from __future__ import annotations

from typing import Any

from balancer.model import EventKind
from tests.support.waiting import until
from workers.hub.embedded import EmbeddedHub
from workers.runtime.processor import EventProcessor
from workers.runtime.stuck import GIVE_UP_FOR, ReaderWatch

from .conftest import Recorder, Rig, metric


class BrokenLink:
    """A reader whose every read fails, as one cut from the hub does."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader

    def receive(self, max_events: int) -> list[Any]:
        raise ConnectionError("the hub's link for this partition is down")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


class FailingOn:
    """The hub, except that the readers of the partitions in ``broken`` fail on every read."""

    def __init__(self, hub: EmbeddedHub) -> None:
        self._hub = hub
        self.broken: set[str] = set()

    def reader(self, partition_id: str, position: Any) -> Any:
        reader = self._hub.reader(partition_id, position)
        return BrokenLink(reader) if partition_id in self.broken else reader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hub, name)


def test_the_watch_counts_failures_in_a_row_until_a_read() -> None:
    watch = ReaderWatch()
    assert watch.failed("0", 10.0) and not watch.failed("0", 15.0)  # the first in a row only
    assert watch.due(39.0, 30.0, frozenset({"0"})) == []
    assert watch.due(40.0, 30.0, frozenset({"0"})) == [("0", 30.0)]
    assert watch.due(40.0, 30.0, frozenset()) == []  # not held: nothing to give up
    assert watch.due(1e9, 0.0, frozenset({"0"})) == []  # 0: never
    watch.read("0")
    assert watch.due(1e9, 30.0, frozenset({"0"})) == [] and watch.reason(30.4) == "stuck: reader failing 30 s"


async def settled(rig: Rig, *workers: EventProcessor) -> None:
    for _ in range(10):
        for w in workers:
            await w.step()
        rig.clock.advance(1.0)
        owned = [len(w.coordinator.owned) for w in workers]
        if sum(owned) == 4 and max(owned) - min(owned) <= 1:
            return
    raise AssertionError(f"not settled: {[sorted(w.coordinator.owned) for w in workers]}")


async def two_workers(rig: Rig) -> tuple[FailingOn, Recorder, EventProcessor, EventProcessor]:
    """Three events on each of four partitions; ``a`` (reading through ``source``, reader_stuck 20 s)
    and ``b``, both cooperative, settled on two partitions each."""
    for pid in "0123":
        rig.send(pid, 3)
    source = FailingOn(rig.hub)
    handled = Recorder()
    a = rig.worker("a", handled, strategy="cooperative", source=source, reader_stuck=20.0)
    b = rig.worker("b", handled, strategy="cooperative")
    await settled(rig, a, b)
    return source, handled, a, b


async def test_a_partition_whose_reader_keeps_failing_is_restarted_then_released_to_another_worker(rig: Rig) -> None:
    source, handled, a, b = await two_workers(rig)
    stuck = min(a.coordinator.owned)
    await until(lambda: len(handled.sequences(stuck)) == 3, what="the partition's first events handled")
    restarts = metric("leaseboard_stuck_heals_total", cause="reader", step="restart")
    releases = metric("leaseboard_stuck_heals_total", cause="reader", step="release")
    source.broken.add(stuck)
    rig.send(stuck, 2)  # waiting behind the broken link
    pump, task = a._pumpset.running[stuck]
    pump.stop()  # its pump ends (checkpoint at 2): the next one gets the broken link
    await until(task.done, what="the partition's pump to stop")
    for _ in range(3):  # started again (the first time, and twice as a restart): it fails each time
        await a.step()
        await until(lambda: a._pumpset.running[stuck][1].done(), what="the pump on the broken link to fail")
        rig.clock.advance(9.0)
    assert metric("leaseboard_stuck_heals_total", cause="reader", step="restart") >= restarts + 2
    heals = [e for e in rig.sinks["a"].seen if e.kind is EventKind.HEAL]  # said to the console, with why
    assert [(e.partition_id, e.owner_id, e.previous_owner) for e in heals] == [(stuck, "a", "a")] * len(heals)
    assert [e.reason for e in heals][:2] == ["restarted: reader failing 0 s", "restarted: reader failing 9 s"]
    assert metric("leaseboard_partition_stuck", partition=stuck, cause="reader") == 1
    assert stuck in a.coordinator.owned, "given up before reader_stuck"
    await a.step()  # 18 s since the first failure: restarted once more
    await until(lambda: a._pumpset.running[stuck][1].done(), what="the pump on the broken link to fail")
    rig.clock.advance(2.0)  # 20 s
    await a.step()
    await until(lambda: stuck not in a.coordinator.owned, what="the stuck partition to be released")
    assert metric("leaseboard_stuck_heals_total", cause="reader", step="release") == releases + 1
    assert metric("leaseboard_partition_stuck", partition=stuck, cause="reader") == 0
    assert not a._pumpset.readers.failing(stuck)  # taken afresh later, it gets its restart first again
    released = [e for e in rig.sinks["a"].seen if e.kind is EventKind.RELEASE and e.partition_id == stuck]
    assert [e.reason for e in released] == ["stuck: reader failing 20 s"]
    assert a.coordinator.avoiding() == {stuck}
    await b.step()  # the other worker takes it at once
    assert stuck in b.coordinator.owned
    await until(lambda: handled.sequences(stuck, "b") == [3, 4], what="b to handle what waited")

    async def rebalanced() -> bool:  # a, one short now, is handed another partition, never the stuck one
        await a.step()
        await b.step()
        return sorted(len(w.coordinator.owned) for w in (a, b)) == [2, 2]

    await until(rebalanced, what="a to be handed another partition")
    assert stuck in b.coordinator.owned and stuck not in a.coordinator.owned
    moved = [e for e in rig.sinks["b"].seen if e.kind is EventKind.CLAIM and e.partition_id == stuck]
    assert len(moved) == 1, "the stuck partition moved more than once"
    assert GIVE_UP_FOR >= 60
    await a.shutdown()
    await b.shutdown()


async def test_a_worker_whose_every_reader_fails_hands_all_over_and_claims_none(rig: Rig) -> None:
    source, handled, a, b = await two_workers(rig)
    mine = sorted(a.coordinator.owned)
    await until(lambda: all(len(handled.sequences(p)) == 3 for p in mine), what="a's first events handled")
    hand_overs = metric("leaseboard_stuck_heals_total", cause="reader", step="hand_over")
    source.broken.update("0123")  # a is cut from the hub
    for pid in mine:
        a._pumpset.running[pid][0].stop()
    await until(lambda: not a.pumping, what="a's pumps to stop")
    for _ in range(5):  # started again, failing each time (a failure is seen at the next cycle)
        await a.step()
        await b.step()
        await until(lambda: all(a._pumpset.running[p][1].done() for p in mine), what="a's pumps to fail")
        rig.clock.advance(9.0)
    await a.step()  # every reader failing for 27 s: past the bound
    await b.step()
    await until(lambda: "*" in a.coordinator.avoiding(), what="a to say it cannot read")
    assert metric("leaseboard_stuck_heals_total", cause="reader", step="hand_over") == hand_overs + 1
    released = [e for e in rig.sinks["a"].seen if e.kind is EventKind.RELEASE and e.reason.startswith("stuck")]
    assert released == [], "given up one by one instead of handed over"

    async def handed_over() -> bool:
        await a.step()
        await b.step()
        return not a.coordinator.owned and len(b.coordinator.owned) == 4

    await until(handed_over, what="a to hand every partition to b")
    for _ in range(3):  # a claims nothing meanwhile
        rig.clock.advance(10.0)
        await a.step()
        await b.step()
    assert not a.coordinator.owned and len(b.coordinator.owned) == 4
    await a.shutdown()
    await b.shutdown()
