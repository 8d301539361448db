"""The worker runtime (the processor: ownership, pumps, stopping, waking) on a real embedded hub and
a real store, driven by a fake clock.

Cycles are run by calling ``step()`` (or by ``run()`` with a sleep that only yields); time moves
only when a test advances the clock. Waiting is polling a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from balancer.lease import Coordinator
from balancer.model import EventKind, OwnershipRecord
from balancer.stores.memory import MemoryStore
from balancer.strategies import get_strategy
from tests.support.clock import FakeClock
from tests.support.waiting import until
from workers.handlers import PartitionContext
from workers.hub.embedded import EmbeddedHub
from workers.hub.reader import HubReader
from workers.runtime.pump import PartitionPump
from workers.runtime.waiting import _resolve
from workers.sources.base import ReceivedEvent

from .conftest import REF, Recorder, Rig, checkpoints, metric, own_all, quick_sleep

# ownership and pumps -------------------------------------------------------------------------------


async def test_pumps_run_exactly_for_the_partitions_the_worker_holds_and_stop_when_one_is_stolen(any_rig: Rig) -> None:
    for pid in "0123":
        any_rig.send(pid, 10)
    recorder = Recorder()
    a = any_rig.worker("a", recorder)
    for n in range(1, 5):  # balanced claims one partition per cycle
        await a.step()
        assert a.pumping == a.coordinator.owned
        assert len(a.pumping) == n
    await until(lambda: recorder.count() == 40, what="all 40 events handled")

    # A second worker joins and steals one partition (a is above the maximum of 2).
    assert isinstance(a.coordinator, Coordinator)
    b = Coordinator(
        REF,
        "b",
        any_rig.store,
        a.coordinator.partitions,
        get_strategy("balanced"),
        expiry=30.0,
        clock=any_rig.clock,
        monotonic=any_rig.clock,
    )
    await b.cycle()
    (stolen,) = b.owned
    report = await a.step()
    assert report is not None and [e.kind for e in report.lost] == [EventKind.LOST]
    assert stolen not in a.pumping and a.pumping == a.coordinator.owned
    await until(lambda: stolen in a.stats() and a.stats()[stolen].ended is not None, what="the pump to end")

    any_rig.send(stolen, 3)
    for pid in set("0123") - {stolen}:
        any_rig.send(pid, 1)
    await until(lambda: recorder.count() == 43, what="new events of the partitions a kept")
    assert recorder.sequences(stolen) == list(range(10))  # nothing after the steal
    await a.shutdown()


async def test_past_the_lease_deadline_in_an_outage_pumps_pause_then_resume_after_the_renewal_handling_nothing_twice(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.send("0", 2)
    recorder = Recorder()
    a = rig.worker("a", recorder, expiry=30.0, checkpoint_events=1)
    await own_all(a, 4)
    await until(lambda: a.stats()["0"].checkpointed == 1, what="the first events")
    paused_before = metric("leaseboard_paused_partitions")

    rig.store.down = True
    caplog.set_level(logging.DEBUG, logger="leaseboard")
    for _ in range(3):
        rig.clock.advance(9)
        assert await a.step() is None
    assert a.pumping == frozenset("0123") and a.paused == frozenset()  # 30 s not yet over: still held
    rig.send("0", 1)
    await until(lambda: recorder.count() == 3, what="an event handled during the outage (its checkpoint fails)")

    rig.clock.advance(4)  # 31 s since the last renewal: past the local deadline
    rig.send("0", 1)
    assert await a.step() is None
    await until(lambda: a.paused == frozenset("0123"), what="every pump to pause")
    assert a.pumping == frozenset("0123")  # paused, not stopped: still owned
    assert metric("leaseboard_paused_partitions") == paused_before + 4
    for _ in range(3):  # more failed cycles wake the pumps: they look, and stay paused
        rig.clock.advance(9)
        assert await a.step() is None
    assert a.paused == frozenset("0123")
    assert recorder.sequences("0") == [0, 1, 2]  # not one event after the deadline
    assert a.stats()["0"].checkpointed == 1

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "cycle failed" in r.getMessage()]
    assert len(warnings) == 1 and "StoreUnavailable" in warnings[0].getMessage()
    assert warnings[0].exc_info is None  # a known store error: one line, no traceback

    rig.store.down = False
    assert await checkpoints(rig) == {"0": 1}  # nothing written while paused
    report = await a.step()  # renews every lease with the ETag it wrote: nobody could claim meanwhile
    assert report is not None and a.coordinator.owned == frozenset("0123") and not report.lost
    await until(lambda: a.paused == frozenset(), what="every pump to resume")
    # The event handled during the outage is checkpointed now, not handled again; the next one follows.
    await until(lambda: a.stats()["0"].checkpointed == 3, what="the checkpoints after the renewal")
    assert recorder.sequences("0") == [0, 1, 2, 3]
    assert await checkpoints(rig) == {"0": 3}
    assert metric("leaseboard_paused_partitions") == paused_before
    assert any("works again" in r.getMessage() for r in caplog.records)
    pause_lines = [r.getMessage() for r in caplog.records if r.name == "leaseboard.pump" and "pause" in r.getMessage()]
    assert len(pause_lines) == 2, pause_lines  # one for the worker's pumps pausing, one for their resuming
    assert "its pump pauses" in pause_lines[0] and "4 resumed where they were" in pause_lines[1]
    await a.shutdown()


async def test_idle_pumps_do_not_wake_at_their_leases_old_deadlines_and_pause_when_one_passes_unrenewed(
    rig: Rig,
) -> None:
    # Real time here: the processor's one timer for its pumps' deadlines sleeps for real. Nothing but
    # that timer (no cycle, no event) can pause an idle pump in this test.
    a = rig.worker("a", Recorder(), monotonic=time.monotonic, sleep=asyncio.sleep, expiry=1.0, interval=0.5)
    await own_all(a, 4)
    await until(lambda: len(a.stats()) == 4 and all(s.idle_waits == 1 for s in a.stats().values()), what="4 idle pumps")
    for _ in range(2):  # renewed in time: no pump wakes at the deadline it had before
        old = max(a.coordinator.deadline(p) for p in "0123")
        due = a.coordinator.next_renewal()
        assert due is not None

        def renewal_due(due: float = due) -> bool:
            return time.monotonic() >= due

        await until(renewal_due, what="the renewal to fall due")
        report = await a.renew()
        assert report is not None and not report.lost
        assert min(a.coordinator.deadline(p) for p in "0123") > old

        def old_deadlines_passed(old: float = old) -> bool:
            return time.monotonic() > old + 0.05

        await until(old_deadlines_passed, what="the old deadlines to pass")
        assert a.paused == frozenset() and all(s.idle_waits == 1 for s in a.stats().values())
    told: list[str] = []  # what the timer tells the pumps

    def telling(pump: PartitionPump) -> Callable[[], None]:
        def deadline_passed() -> None:
            told.append(pump.partition_id)
            PartitionPump.deadline_passed(pump)

        return deadline_passed

    for pump, _ in a._pumps.values():
        pump.deadline_passed = telling(pump)  # type: ignore[method-assign]
    rig.store.down = True  # renewals fail from now on: the deadlines pass unrenewed
    deadline = max(a.coordinator.deadline(p) for p in "0123")
    await until(lambda: a.paused == frozenset("0123"), what="every idle pump to pause at its lease's deadline")
    assert time.monotonic() >= deadline
    assert all(s.idle_waits == 1 and s.processed == 0 for s in a.stats().values())  # paused without reading
    # Each told once, though the loop turned many times while polling above: a deadline that passed
    # arms no timer again.
    assert sorted(told) == list("0123")
    rig.store.down = False
    await a.shutdown()


async def test_the_processor_does_its_idle_pumps_safety_reads_after_a_cycle_so_no_pump_keeps_a_timer_for_it(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The safety read covers a lost wake-up from the hub's files: here every one is lost.
    monkeypatch.setattr(HubReader, "notify", lambda self, wake: None)
    asked: list[float] = []

    async def sleep(seconds: float) -> None:  # the rig's injected sleep, recording what it is asked
        asked.append(seconds)
        await quick_sleep(seconds)

    handled = Recorder()
    a = rig.worker("a", handled, sleep=sleep, expiry=100.0, idle_seconds=30.0)
    await own_all(a, 4)
    await until(lambda: len(a.stats()) == 4 and all(s.idle_waits == 1 for s in a.stats().values()), what="4 idle pumps")
    assert 30.0 not in asked  # no pump sleeps until its safety read
    rig.send("2", 3)  # its wake-up is lost
    rig.clock.advance(29.0)
    await a.step()  # idle_seconds have not gone by: nobody looks
    assert a.stats()["2"].idle_waits == 1 and handled.count() == 0
    rig.clock.advance(2.0)
    await a.step()  # they have: the processor looks at every idle pump, and pump 2 finds its events
    await until(lambda: handled.sequences("2") == [0, 1, 2], what="the events found by the safety read")
    assert all(a.stats()[p].idle_waits == 1 for p in "013")  # nothing came there: not read
    await a.shutdown()


async def test_a_paused_pump_whose_partition_another_worker_took_ends_without_a_checkpoint(rig: Rig) -> None:
    rig.send("0", 2)
    recorder, other = Recorder(), Recorder()
    a = rig.worker("a", recorder, expiry=30.0, checkpoint_events=1)
    await own_all(a, 4)
    await until(lambda: a.stats()["0"].checkpointed == 1, what="the first events")
    paused_before = metric("leaseboard_paused_partitions")

    rig.store.down = True
    rig.clock.advance(20)
    assert await a.step() is None
    rig.send("0", 1)
    await until(lambda: recorder.count() == 3, what="an event handled during the outage (its checkpoint fails)")
    rig.clock.advance(100)  # far past the expiry: a's leases are free for anyone once the store is back
    assert await a.step() is None
    await until(lambda: a.paused == frozenset("0123"), what="every pump to pause")

    rig.store.down = False
    b = rig.worker("b", other, expiry=30.0, checkpoint_events=1)
    await own_all(b, 4)
    await until(lambda: other.sequences("0") == [2], what="b's events")  # after a's last stored checkpoint
    report = await a.step()  # a's cycle finds its partitions in b's hands: the paused pumps are stopped
    assert report is not None and {e.partition_id for e in report.lost} == set("0123")
    # (balanced also takes one back from b at once: a new lease, so the old pump's position is stale too)
    await until(lambda: all(s.ended for s in a.stats().values()), what="a's paused pumps to end")
    assert {s.ended for s in a.stats().values()} == {"expired"}
    assert a.stats()["0"].checkpointed == 1  # no checkpoint on the way out
    assert recorder.sequences("0") == [0, 1, 2] and a.paused == frozenset()
    assert metric("leaseboard_paused_partitions") == paused_before
    await a.shutdown()
    await b.shutdown()


async def test_renewal_goes_on_while_a_handler_blocks(rig: Rig) -> None:
    rig.send("0", 1)
    entered, release = threading.Event(), threading.Event()

    def blocking(event: ReceivedEvent, ctx: PartitionContext) -> None:
        entered.set()
        release.wait(30)

    a = rig.worker("a", blocking, interval=5.0)
    runner = asyncio.create_task(a.run())
    await until(entered.is_set, what="the handler to block")
    etags = set()
    cycles = a.cycles

    def renewed() -> bool:
        record = next(r for r in rig.store._ownership.values() if r.partition_id == "0")
        etags.add(record.etag)
        if len(etags) < 5:
            rig.clock.advance(0.5)  # a lease is renewed once 65 % of its 30 s have passed: let time go on
        return a.cycles >= cycles + 5 and len(etags) >= 5

    await until(renewed, what="five renewals while the handler blocks")
    assert not release.is_set() and a.coordinator.holds("0")
    release.set()
    a.stop()
    await asyncio.wait_for(runner, 10)


async def test_a_planned_move_checkpoints_before_the_release_so_no_event_is_handled_twice(rig: Rig) -> None:
    # cooperative: a second worker joins, the first hands two partitions over: pump stopped after
    # the event in hand, final checkpoint, release; the newcomer starts right after that checkpoint.
    for pid in "0123":
        rig.send(pid, 30)
    recorder = Recorder()
    a = rig.worker("a", recorder, strategy="cooperative", checkpoint_events=1000)
    await own_all(a, 4)
    await until(lambda: recorder.count() >= 40, what="a busy on every partition")
    b = rig.worker("b", recorder, strategy="cooperative", checkpoint_events=1000)

    async def two_each() -> bool:
        await a.step()
        await b.step()
        return len(a.coordinator.owned) == 2 and len(b.coordinator.owned) == 2

    for _ in range(200):  # the handoff finishes in its own task, between cycles
        if await two_each():
            break
        await asyncio.sleep(0.005)
    assert len(a.coordinator.owned) == 2 and len(b.coordinator.owned) == 2
    moved = b.coordinator.owned
    for pid in "0123":
        rig.send(pid, 5)
    await until(lambda: recorder.count() == 4 * 35, what="every event, once")
    for pid in moved:
        handled_by_a, handled_by_b = recorder.sequences(pid, "a"), recorder.sequences(pid, "b")
        assert handled_by_a + handled_by_b == list(range(35))  # b began right after a's last event
        assert handled_by_b, "the moved partition got no new events: the test proved nothing"
    releases = [e for e in rig.sinks["a"].seen if e.kind is EventKind.RELEASE]
    assert {e.partition_id for e in releases} == moved and all(e.handoff for e in releases)
    assert all(e.reason == "handed off" for e in releases)  # the text is unchanged; the field tells a handoff
    await a.shutdown()
    await b.shutdown()


async def test_handoffs_that_finish_together_are_released_in_one_request(tmp_path: Path, clock: FakeClock) -> None:
    """A worker handing many partitions over (a cold start, a scale-out) releases them in a batch: one
    by one, each release took the lock in turn, the renewals queued behind them, and under load leases
    lapsed (a 1024/64 fleet's first holder lost 99 of 144 partitions to expiry)."""
    hub = EmbeddedHub(tmp_path / "hub", "sensors", partitions=16)
    store = MemoryStore(clock=clock)
    rig = Rig(hub, store, clock, tmp_path / "deadletter")
    try:
        a = rig.worker("a", Recorder(), strategy="cooperative")
        await own_all(a, 16, steps=3)
        others = [rig.worker(w, Recorder(), strategy="cooperative") for w in "bcd"]
        for worker in others:
            await worker.step()  # announced
        for worker in others:
            await worker.step()  # ready (a second heartbeat): a's next plan hands 12 partitions over
        gate, in_flight, requests = asyncio.Event(), [0], []
        claim = store.claim_ownership

        async def gated(records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
            if records and all(r.owner_id == "" for r in records):
                requests.append(len(records))
                in_flight[0] = len(records)
                await gate.wait()  # a store round trip, long enough for the other pumps to stop meanwhile
            return await claim(records)

        store.claim_ownership = gated  # type: ignore[method-assign]
        await a.step()

        def ready() -> bool:  # every handoff in the first release, or ready for the next
            return in_flight[0] + len(getattr(a, "_to_release", ())) == 12

        await until(ready, what="the other handoffs ready while the first release is in flight")
        gate.set()
        await until(lambda: len(a.coordinator.owned) == 4, what="a down to its share")
        assert len(requests) == 2 and sum(requests) == 12  # the first handoff's, then all the others'
        released = [e for e in rig.sinks["a"].seen if e.kind is EventKind.RELEASE]
        assert len(released) == 12 and all(e.handoff for e in released)
        await a.shutdown()
        for worker in others:
            await worker.shutdown()
    finally:
        hub.close()


# stopping -----------------------------------------------------------------------------------------


async def test_stop_checkpoints_every_partition_then_releases_them_all(any_rig: Rig) -> None:
    for pid in "0123":
        any_rig.send(pid, int(pid) + 2)
    recorder = Recorder()
    a = any_rig.worker("a", recorder, checkpoint_events=100)
    runner = asyncio.create_task(a.run())
    await until(lambda: recorder.count() == 2 + 3 + 4 + 5, what="every event")
    releases = metric("leaseboard_ownership_changes_total", kind="release")
    a.stop()
    await asyncio.wait_for(runner, 10)

    assert await checkpoints(any_rig) == {"0": 1, "1": 2, "2": 3, "3": 4}
    records = await any_rig.store.list_ownership(REF)
    assert sorted(r.partition_id for r in records) == list("0123")
    assert all(r.owner_id == "" for r in records)
    assert [e.kind for e in any_rig.sinks["a"].seen[-4:]] == [EventKind.RELEASE] * 4
    assert metric("leaseboard_ownership_changes_total", kind="release") == releases + 4
    assert a.coordinator.owned == frozenset()


async def test_stop_gives_up_on_a_handler_that_never_returns_and_releases_anyway(rig: Rig) -> None:
    rig.send("0", 2)
    entered, release = threading.Event(), threading.Event()

    def stuck(event: ReceivedEvent, ctx: PartitionContext) -> None:
        entered.set()
        release.wait(30)

    a = rig.worker("a", stuck)
    a.shutdown_timeout = 0.2
    await own_all(a, 4)
    await until(entered.is_set, what="the handler to hang")
    await asyncio.wait_for(a.shutdown(), 5)
    assert all(r.owner_id == "" for r in await rig.store.list_ownership(REF))
    assert await checkpoints(rig) == {}  # the event in hand was never finished: no checkpoint past it
    release.set()


async def test_a_handoff_past_its_wait_says_so_in_the_release_reason(rig: Rig) -> None:
    # A pump still busy when the handoff's wait runs out is released anyway: the next owner handles the
    # event in hand again, and the release's reason says why (the chaos checkers count it as the cause).
    rig.send("0", 1)
    entered, release = threading.Event(), threading.Event()

    def stuck(event: ReceivedEvent, ctx: PartitionContext) -> None:
        entered.set()
        release.wait(30)

    a = rig.worker("a", stuck)
    a.shutdown_timeout = 0.2  # the handoff's wait
    await own_all(a, 4)
    await until(entered.is_set, what="the handler to hang")
    busy = next(p for p, (pump, _) in a._pumpset.running.items() if pump.calling() is not None)
    a._handoffs.start(busy)
    await until(lambda: busy not in a.coordinator.owned, what="the busy partition released")
    (released,) = [e for e in rig.sinks["a"].seen if e.kind is EventKind.RELEASE]
    assert (released.partition_id, released.reason, released.handoff) == (busy, "handed off while busy: 0.2 s", True)
    release.set()
    await a.shutdown()


def test_a_handoff_waits_for_the_event_in_hand_no_longer_than_the_receivers_patience(rig: Rig) -> None:
    # The receiver takes over after the handoff timeout (the expiry), counted from its own first cycle
    # waiting, up to two late cycles before the holder saw the move: the holder releases before that.
    tight = rig.worker("a", Recorder(), expiry=3.0, interval=0.5)
    tight.shutdown_timeout = 5.0
    assert tight._handoff_wait() == pytest.approx(3.0 - 2 * 0.5 * 1.1)
    roomy = rig.worker("b", Recorder(), expiry=30.0, interval=2.0)
    roomy.shutdown_timeout = 5.0
    assert roomy._handoff_wait() == 5.0  # the shutdown timeout, when the receiver waits longer anyway


def test_an_expiry_not_longer_than_the_interval_is_refused(rig: Rig) -> None:
    with pytest.raises(ValueError, match="must be longer than the interval"):
        rig.worker("a", Recorder(), expiry=10.0, interval=10.0)


# waking -------------------------------------------------------------------------------------------


async def _sleep_forever(seconds: float) -> None:
    await asyncio.Event().wait()


async def test_wake_runs_the_next_cycle_at_once_instead_of_after_the_interval(rig: Rig) -> None:
    worker = rig.worker("w", lambda event, ctx: None, sleep=_sleep_forever, strategy="cooperative")
    task = asyncio.create_task(worker.run())
    try:
        await until(lambda: worker.cycles == 1, what="the first cycle")
        assert worker.cycles == 1  # and now waiting out an interval that never ends
        worker.wake()
        await until(lambda: worker.cycles == 2, what="a cycle right after wake()")
    finally:
        worker.stop()
        await asyncio.wait_for(task, timeout=10)


async def test_on_the_loops_own_sleep_a_wait_ends_at_its_time_or_at_once_on_wake_or_stop(rig: Rig) -> None:
    # With asyncio.sleep (as deployed) a wait is one future that a timer, wake() or stop() resolves.
    worker = rig.worker("w", lambda event, ctx: None, sleep=asyncio.sleep, monotonic=time.monotonic)
    started = time.monotonic()
    assert await worker._wait(0.05) is False  # slept its time, nobody woke it
    assert time.monotonic() - started >= 0.05
    for end in (worker.wake, worker.stop):
        waiting = asyncio.create_task(worker._wait(3600.0))
        await until(lambda: worker._waiting is not None, what="the wait to start")
        end()
        assert await asyncio.wait_for(waiting, 10) is True
        assert worker._waiting is None
    assert await asyncio.wait_for(worker._wait(3600.0), 10) is True  # stopped: no wait at all
    timers = getattr(asyncio.get_running_loop(), "_scheduled", [])  # the loop's pending timers
    assert not [t for t in timers if getattr(t, "_callback", None) is _resolve and not t.cancelled()]  # none left


async def test_a_worker_that_sees_a_rebalance_request_wakes_every_worker_of_its_process(rig: Rig) -> None:
    from balancer.model import Control, ControlKind
    from workers.runtime.runner import run_workers

    workers = [rig.worker(w, lambda event, ctx: None, sleep=_sleep_forever, strategy="cooperative") for w in "ab"]
    task = asyncio.create_task(run_workers(workers, signals=False))
    try:
        await until(lambda: all(w.cycles == 1 for w in workers), what="first cycles")
        workers[0].wake()  # a's second cycle: nothing to report yet
        await until(lambda: workers[0].cycles == 2, what="a's second cycle")
        assert workers[1].cycles == 1
        await rig.store.put_control(Control(REF, ControlKind.REBALANCE, "*", "operator-1"))
        workers[0].wake()  # a sees the new token and wakes b, whose interval never ends
        await until(lambda: workers[1].cycles >= 2, what="b woken by a's rebalance")
    finally:
        for w in workers:
            w.stop()
        await asyncio.wait_for(task, timeout=10)


async def test_a_wake_message_on_the_channel_layer_wakes_the_workers() -> None:
    from channels.layers import get_channel_layer

    from workers.runtime.runner import WAKE_GROUP, listen_for_wakeups

    woken = asyncio.Event()
    listener = asyncio.create_task(listen_for_wakeups(woken.set))
    try:
        layer = get_channel_layer()
        assert layer is not None
        deadline = asyncio.get_running_loop().time() + 10
        while not woken.is_set():  # resend until the listener has joined the group
            await layer.group_send(WAKE_GROUP, {"type": "worker.wake", "reason": "rebalance"})
            await asyncio.wait([asyncio.ensure_future(woken.wait())], timeout=0.05)
            assert asyncio.get_running_loop().time() < deadline, "no wake-up"
    finally:
        listener.cancel()


async def test_a_steady_cycle_is_counted_in_the_metrics(rig: Rig) -> None:
    # cooperative on a store whose change feed leaves renewals out: once the plan is empty with every
    # partition held, a cycle that reads nothing new skips it and says so.
    a = rig.worker("a", Recorder(), strategy="cooperative", expiry=10.0, interval=2.0)
    steady = metric("leaseboard_steady_cycles_total")
    reports = []
    for _ in range(6):
        reports.append(await a.step())
        rig.clock.advance(2.0)
    assert a.coordinator.owned == {"0", "1", "2", "3"}
    skipped = [r for r in reports if r is not None and not r.planned]
    assert skipped and all(r.rows == 0 for r in skipped)
    assert metric("leaseboard_steady_cycles_total") == steady + len(skipped)
    await a.shutdown()


async def test_where_notices_cross_processes_a_steady_worker_waits_quietly_and_news_ends_the_wait(rig: Rig) -> None:
    # As the steady-cycle test: cooperative, expiry 10 s, interval 2 s, on a store whose change feed
    # leaves renewals out. Polling (no notices across processes) it cycles every interval.
    a = rig.worker("a", Recorder(), strategy="cooperative", expiry=10.0, interval=2.0)
    for _ in range(12):  # until a cycle is steady (every 10 s one reads the whole table, and plans)
        rig.clock.advance(2.0)
        report = await a.step()
        if report is not None and not report.planned:
            break
    assert report is not None and not report.planned
    assert 1.8 <= a._next_delay() <= 2.2  # the interval, give or take the jitter
    a.poll_waiting = False  # notices cross processes: joins, releases and controls wake it
    delays = [a._next_delay() for _ in range(20)]
    # Until the coordinator's quiet_until: 3.5 s after the read, less up to the jitter, never later.
    assert all(3.5 * 0.9 - 0.01 <= d <= 3.5 for d in delays) and max(delays) > 3.3
    a.news()  # a join heard since the read: no quiet wait after it
    assert 1.8 <= a._next_delay() <= 2.2
    await a.step()
    assert a._next_delay() > 3.0  # the next cycle read after the news (still steady): quiet again
    await a.shutdown()


async def test_news_ends_a_quiet_wait_but_not_a_waits_of_one_interval(rig: Rig) -> None:
    a = rig.worker("a", Recorder(), sleep=_sleep_forever, strategy="cooperative", expiry=10.0, interval=2.0)
    a.poll_waiting = False
    task = asyncio.create_task(a.run())
    try:
        for n in range(2, 14):  # wake it cycle after cycle until one is steady

            def waiting_after(cycles: int = n - 1) -> bool:
                return a._waiting is not None and a.cycles == cycles

            await until(waiting_after, what=f"cycle {n - 1} and its wait")
            if a._quiet:
                break
            rig.clock.advance(2.0)
            a.wake()
        assert a._quiet  # a steady cycle's wait: until quiet_until, ended by news
        cycles = a.cycles
        a.news()
        await until(lambda: a.cycles == cycles + 1, what="a cycle right after the news")
        await until(lambda: a._waiting is not None, what="the next wait")
        a.poll_waiting = True  # waiting one interval: news does not end it (the cycle reads soon anyway)
        rig.clock.advance(2.0)
        a.wake()
        await until(lambda: a.cycles == cycles + 2 and a._waiting is not None, what="a wait of one interval")
        assert not a._quiet
        a.news()
        assert a._waiting is not None and not a._waiting.done()
    finally:
        a.stop()
        await asyncio.wait_for(task, timeout=10)
