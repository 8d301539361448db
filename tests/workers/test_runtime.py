"""The worker runtime on a real embedded hub and a real store, driven by a fake clock.

Cycles are run by calling ``step()`` (or by ``run()`` with a sleep that only yields); time moves
only when a test advances the clock. Waiting is polling a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from prometheus_client import REGISTRY

from balancer.coordinator import Coordinator
from balancer.model import BalancerEvent, Checkpoint, EventKind
from balancer.strategies import get_strategy
from workers.handlers import HandlerNotFound, PartitionContext, batch_handler, count_sensor_events, resolve_handler
from workers.runtime.sink import EventSink
from workers.sensors import SensorEvent
from workers.sources.base import PartitionReader, Position, ReceivedEvent

from .conftest import REF, FakeClock, Recorder, Rig, own_all, until


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class RecordingCheckpoints:
    """The rig's store, recording the sequence number of every checkpoint it accepted."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.written: list[tuple[str, int]] = []

    async def list_checkpoints(self, ref: Any) -> list[Checkpoint]:
        return list(await self.store.list_checkpoints(ref))

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        stored: Checkpoint = await self.store.update_checkpoint(checkpoint, owner_id)
        self.written.append((checkpoint.partition_id, checkpoint.sequence_number))
        return stored


async def checkpoints(rig: Rig) -> dict[str, int]:
    return {c.partition_id: c.sequence_number for c in await rig.store.list_checkpoints(REF)}


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
    b = Coordinator(REF, "b", any_rig.store, a.coordinator.partitions, get_strategy("balanced"), expiry=30.0,
                    clock=any_rig.clock, monotonic=any_rig.clock)  # fmt: skip
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


async def test_a_pump_stops_at_the_lease_deadline_when_the_store_is_down_and_the_outage_is_logged_once(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.send("0", 2)
    recorder = Recorder()
    a = rig.worker("a", recorder, expiry=30.0, checkpoint_events=1)
    await own_all(a, 4)
    await until(lambda: a.stats()["0"].checkpointed == 1, what="the first events")

    rig.store.down = True
    caplog.set_level(logging.DEBUG, logger="leaseboard.worker")
    for _ in range(3):
        rig.clock.advance(9)
        assert await a.step() is None
    assert a.pumping == frozenset("0123")  # 30 s not yet over: still held, still pumping
    rig.send("0", 1)
    await until(lambda: recorder.count() == 3, what="an event handled during the outage")

    rig.clock.advance(4)  # 31 s since the last renewal: past the local deadline
    rig.send("0", 1)
    assert await a.step() is None
    assert a.pumping == frozenset()
    await until(lambda: all(s.ended for s in a.stats().values()), what="every pump to end")
    assert recorder.sequences("0") == [0, 1, 2]  # not one event after the deadline

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "cycle failed" in r.getMessage()]
    assert len(warnings) == 1 and "StoreUnavailable" in warnings[0].getMessage()
    assert warnings[0].exc_info is None  # a known store error: one line, no traceback

    rig.store.down = False
    await own_all(a, 4)
    # The event handled during the outage could not be checkpointed: at least once, it comes again.
    await until(lambda: recorder.sequences("0") == [0, 1, 2, 2, 3], what="the pump restarted from its checkpoint")
    assert any("works again" in r.getMessage() for r in caplog.records)
    await a.shutdown()


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
    assert {e.partition_id for e in releases} == moved and all(e.reason == "handed off" for e in releases)
    await a.shutdown()
    await b.shutdown()


# checkpoints ----------------------------------------------------------------------------------------


async def test_a_checkpoint_is_written_every_n_events_and_once_more_on_stop(any_rig: Rig) -> None:
    any_rig.send("0", 12)
    recorder = Recorder()
    a = any_rig.worker("a", recorder, checkpoint_events=5)
    recording = RecordingCheckpoints(any_rig.store)
    a._checkpoints = recording  # type: ignore[assignment]
    await own_all(a, 4)
    await until(lambda: recorder.count() == 12, what="12 events handled")
    await until(lambda: len(recording.written) == 2, what="two checkpoints")
    assert recording.written == [("0", 4), ("0", 9)]
    before = metric("leaseboard_checkpoints_total")
    await a.shutdown()
    assert recording.written == [("0", 4), ("0", 9), ("0", 11)]
    assert metric("leaseboard_checkpoints_total") == before + 1


async def test_a_checkpoint_is_written_after_t_seconds_when_events_are_few(rig: Rig) -> None:
    rig.send("2", 3)
    recorder = Recorder()
    a = rig.worker("a", recorder, checkpoint_events=100, checkpoint_seconds=1.0)
    await own_all(a, 4)
    await until(lambda: recorder.count() == 3, what="3 events handled")
    assert await checkpoints(rig) == {}
    rig.clock.advance(1.5)
    await until(lambda: a.stats()["2"].checkpointed == 2, what="the time-based checkpoint")
    assert await checkpoints(rig) == {"2": 2}
    await a.shutdown()


async def test_a_new_owner_resumes_after_the_checkpoint_without_skipping_or_repeating(any_rig: Rig) -> None:
    for pid in "0123":
        any_rig.send(pid, 7)
    recorder = Recorder()
    a = any_rig.worker("a", recorder)
    await own_all(a, 4)
    await until(lambda: recorder.count() == 28, what="a's events")
    await a.shutdown()
    assert await checkpoints(any_rig) == dict.fromkeys("0123", 6)

    for pid in "0123":
        any_rig.send(pid, 4)
    b = any_rig.worker("b", recorder)
    await own_all(b, 4)  # released by a: b claims them at once, no expiry needed
    await until(lambda: recorder.count() == 44, what="b's events")
    for pid in "0123":
        assert recorder.sequences(pid, "a") == list(range(7))
        assert recorder.sequences(pid, "b") == list(range(7, 11))
    await b.shutdown()


async def test_after_a_crash_the_next_owner_repeats_only_the_uncheckpointed_tail(rig: Rig) -> None:
    rig.send("1", 13)
    recorder = Recorder()
    a = rig.worker("a", recorder, checkpoint_events=5)
    await own_all(a, 4)
    await until(lambda: recorder.count() == 13 and a.stats()["1"].checkpointed == 9, what="a's events")
    await a.abort()  # no final checkpoint, no release: the leases stay until they expire

    b = rig.worker("b", recorder)
    rig.clock.advance(31)
    rig.send("1", 2)
    await own_all(b, 4)
    await until(lambda: len(recorder.sequences("1", "b")) == 5, what="b's events")
    assert recorder.sequences("1", "a") == list(range(13))
    assert recorder.sequences("1", "b") == [10, 11, 12, 13, 14]  # 10..12 again: a's tail after checkpoint 9
    assert [e.kind for e in rig.sinks["b"].seen] == [EventKind.EXPIRE] * 4
    await b.shutdown()


async def test_a_checkpoint_refused_by_the_store_stops_the_pump_until_a_cycle_settles_ownership(rig: Rig) -> None:
    rig.send("0", 3)
    recorder, other = Recorder(), Recorder()
    frozen = FakeClock()  # a's own clock stands still (a long pause): it believes it still holds
    a = rig.worker("a", recorder, monotonic=frozen, checkpoint_events=1)
    await own_all(a, 4)
    await until(lambda: a.stats()["0"].checkpointed == 2, what="a's checkpoints")

    rig.clock.advance(31)
    b = rig.worker("b", other, checkpoint_events=1)
    await own_all(b, 4)  # took every partition after expiry, by the store's clock
    rig.send("0", 1)
    await until(lambda: a.stats()["0"].ended == "lost", what="a's pump to be refused its checkpoint")
    await until(lambda: b.stats()["0"].checkpointed == 3, what="b's checkpoint")
    assert recorder.sequences("0") == [0, 1, 2, 3]  # the one event in flight: at least once
    assert other.sequences("0") == [3]
    assert a.stats()["0"].checkpointed == 2 and await checkpoints(rig) == {"0": 3}

    report = await a.step()  # the cycle sees b's records: every lease lost, no pump restarted
    assert report is not None and {e.partition_id for e in report.lost} == set("0123")
    assert a.pumping == frozenset()
    await a.shutdown()
    await b.shutdown()


async def test_checkpoints_never_go_backwards_when_ownership_moves_back_and_forth(rig: Rig) -> None:
    rig.send("0", 20)
    recorder = Recorder()
    seen: list[int] = []
    for round_, owner in enumerate(["a", "b", "a2", "b2"]):
        worker = rig.worker(owner, recorder, checkpoint_events=3)
        await own_all(worker, 4)
        rig.send("0", 5)
        total = 25 + 5 * round_
        await until(lambda total=total: len(set(recorder.sequences("0"))) == total, what=f"{owner}'s events")
        await worker.shutdown()
        seen.append((await checkpoints(rig))["0"])
    assert seen == sorted(seen) and seen[-1] == 39
    assert sorted(set(recorder.sequences("0"))) == list(range(40))
    assert len(recorder.sequences("0")) == 40  # graceful hand-overs repeat nothing


# handler errors ------------------------------------------------------------------------------------


async def test_an_event_that_keeps_failing_is_set_aside_and_processing_goes_on(any_rig: Rig) -> None:
    bodies = [f'{{"n": {i}}}'.encode() for i in range(8)]
    any_rig.hub.send_batch(bodies, partition_id="3")
    recorder = Recorder()
    calls: list[int] = []

    def failing_on_5(event: ReceivedEvent, ctx: PartitionContext) -> None:
        calls.append(event.sequence_number)
        if event.sequence_number == 5:
            raise RuntimeError("cannot handle five")
        recorder(event, ctx)

    errors = metric("leaseboard_handler_errors_total")
    dead = metric("leaseboard_dead_letters_total")
    a = any_rig.worker("a", failing_on_5, retries=2)
    await own_all(a, 4)
    await until(lambda: recorder.count() == 7, what="the other seven events")
    assert recorder.sequences("3") == [0, 1, 2, 3, 4, 6, 7]
    assert calls.count(5) == 3  # the first try and two retries
    assert metric("leaseboard_handler_errors_total") == errors + 3
    assert metric("leaseboard_dead_letters_total") == dead + 1
    assert a.stats()["3"].errors == 3 and a.stats()["3"].dead_lettered == 1

    lines = (any_rig.dead_dir / "sensors" / "3.jsonl").read_text().splitlines()
    (entry,) = [json.loads(line) for line in lines]
    assert entry["partition_id"] == "3" and entry["sequence_number"] == 5 and entry["attempts"] == 3
    assert entry["error"] == "RuntimeError: cannot handle five"
    assert base64.b64decode(entry["body_base64"]) == b'{"n": 5}'
    reader = any_rig.hub.reader("3", Position.after(4))
    assert entry["offset"] == reader.receive(1)[0].offset
    reader.close()
    await a.shutdown()
    assert (await checkpoints(any_rig))["3"] == 7  # past the event set aside


async def test_a_handler_that_fails_then_succeeds_is_retried_and_nothing_is_set_aside(rig: Rig) -> None:
    rig.send("1", 3)
    recorder = Recorder()
    failures = {1: 2}

    def flaky(event: ReceivedEvent, ctx: PartitionContext) -> None:
        if failures.get(event.sequence_number, 0) > 0:
            failures[event.sequence_number] -= 1
            raise ConnectionError("downstream hiccup")
        recorder(event, ctx)

    a = rig.worker("a", flaky, retries=3)
    await own_all(a, 4)
    await until(lambda: recorder.count() == 3, what="all three events")
    assert recorder.sequences("1") == [0, 1, 2]
    assert a.stats()["1"].errors == 2 and a.stats()["1"].dead_lettered == 0
    assert not (rig.dead_dir / "sensors" / "1.jsonl").exists()
    await a.shutdown()


async def test_the_demo_handler_sets_malformed_bodies_aside_at_once(rig: Rig) -> None:
    good = SensorEvent("e1", "home-00001", "door", "door-1", "opened", False, 1.0).to_json()
    rig.hub.send_batch([good, b"not json", b'{"home": "h"}', good], partition_id="2")
    a = rig.worker("a", count_sensor_events, retries=5)
    before = count_sensor_events.snapshot().get("2", {}).get("door", 0)
    await own_all(a, 4)
    await until(lambda: a.stats()["2"].processed == 4, what="all four events")
    assert count_sensor_events.snapshot()["2"]["door"] == before + 2
    entries = [json.loads(x) for x in (rig.dead_dir / "sensors" / "2.jsonl").read_text().splitlines()]
    assert [(e["sequence_number"], e["attempts"]) for e in entries] == [(1, 1), (2, 1)]
    assert all(e["error"].startswith("MalformedEvent") for e in entries)
    await a.shutdown()


async def test_a_stop_during_retries_leaves_the_failing_event_to_the_next_owner(rig: Rig) -> None:
    rig.send("0", 3)
    failing = threading.Event()

    def always_failing_on_1(event: ReceivedEvent, ctx: PartitionContext) -> None:
        if event.sequence_number == 1:
            failing.set()
            raise RuntimeError("still broken")

    a = rig.worker("a", always_failing_on_1, retries=1000)
    await own_all(a, 4)
    await until(failing.is_set, what="the failing event")
    await a.shutdown()
    assert (await checkpoints(rig))["0"] == 0  # before the failing event: it is not lost
    assert not (rig.dead_dir / "sensors" / "0.jsonl").exists()


# batches, gaps, release ----------------------------------------------------------------------------


async def test_a_batch_handler_gets_each_partition_in_order_in_batches_of_its_size(rig: Rig) -> None:
    rig.send("0", 7)
    batches: list[list[int]] = []

    @batch_handler(max_events=3)
    def batches_of_three(events: list[ReceivedEvent], ctx: PartitionContext) -> None:
        batches.append([e.sequence_number for e in events])

    a = rig.worker("a", batches_of_three, checkpoint_events=3)
    await own_all(a, 4)
    await until(lambda: sum(map(len, batches)) == 7, what="seven events in batches")
    assert batches == [[0, 1, 2], [3, 4, 5], [6]]
    assert a.stats()["0"].checkpointed == 5
    await a.shutdown()
    assert (await checkpoints(rig))["0"] == 6


class DroppingSource:
    """The rig's hub, except that readers never return the event with sequence number ``drop``."""

    def __init__(self, hub: Any, drop: int) -> None:
        self.hub = hub
        self.drop = drop

    def partition_ids(self) -> tuple[str, ...]:
        return tuple(self.hub.partition_ids())

    def properties(self, partition_id: str) -> Any:
        return self.hub.properties(partition_id)

    def reader(self, partition_id: str, position: Position) -> PartitionReader:
        inner = self.hub.reader(partition_id, position)
        drop = self.drop

        class Reader:
            def receive(self, max_events: int) -> list[ReceivedEvent]:
                return [e for e in inner.receive(max_events) if e.sequence_number != drop]

            def close(self) -> None:
                inner.close()

        return Reader()

    def close(self) -> None:
        self.hub.close()


async def test_a_jump_in_sequence_numbers_is_logged_as_lost_data(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    rig.send("0", 6)
    recorder = Recorder()
    a = rig.worker("a", recorder)
    a._source = DroppingSource(rig.hub, drop=3)  # type: ignore[assignment]
    gaps = metric("leaseboard_sequence_gaps_total")
    await own_all(a, 4)
    await until(lambda: recorder.count() == 5, what="the five events that came")
    assert recorder.sequences("0") == [0, 1, 2, 4, 5]
    assert a.stats()["0"].gaps == 1 and metric("leaseboard_sequence_gaps_total") == gaps + 1
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR and "lost data" in r.getMessage()]
    assert "jump from 2 to 4: 1 events" in error.getMessage()
    await a.shutdown()


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


async def test_an_async_handler_runs_on_the_loop_one_event_at_a_time_per_partition(rig: Rig) -> None:
    for pid in "01":
        rig.send(pid, 5)
    active: dict[str, int] = {"0": 0, "1": 0}
    most: dict[str, int] = {"0": 0, "1": 0}
    done: list[tuple[str, int]] = []

    async def handler(event: ReceivedEvent, ctx: PartitionContext) -> None:
        active[event.partition_id] += 1
        most[event.partition_id] = max(most[event.partition_id], active[event.partition_id])
        await asyncio.sleep(0.001)
        active[event.partition_id] -= 1
        done.append((event.partition_id, event.sequence_number))

    a = rig.worker("a", handler)
    await own_all(a, 4)
    await until(lambda: len(done) == 10, what="ten events")
    assert most == {"0": 1, "1": 1}
    assert [s for p, s in done if p == "0"] == list(range(5))
    await a.shutdown()


def test_an_expiry_not_longer_than_the_interval_is_refused(rig: Rig) -> None:
    with pytest.raises(ValueError, match="must be longer than the interval"):
        rig.worker("a", Recorder(), expiry=10.0, interval=10.0)


async def test_dead_letter_files_of_two_partitions_are_separate(rig: Rig, tmp_path: Path) -> None:
    rig.send("0", 1, b"x")
    rig.send("1", 1, b"y")
    a = rig.worker("a", count_sensor_events)
    await own_all(a, 4)
    await until(lambda: sum(s.dead_lettered for s in a.stats().values()) == 2, what="two dead letters")
    for pid, body in (("0", b"x"), ("1", b"y")):
        (line,) = (rig.dead_dir / "sensors" / f"{pid}.jsonl").read_text().splitlines()
        assert base64.b64decode(json.loads(line)["body_base64"]) == body
    await a.shutdown()


# the sink ----------------------------------------------------------------------------------------


def _event(pid: str) -> BalancerEvent:
    return BalancerEvent(EventKind.CLAIM, REF, pid, "a", None, "a", "never owned", 1.0)


async def test_the_sink_broadcasts_in_order_and_a_failing_dashboard_is_logged_once_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    published: list[str] = []

    async def publish(event: BalancerEvent) -> None:
        await asyncio.sleep(0.001 * (3 - int(event.partition_id) % 3))  # later events would overtake
        if event.partition_id in ("2", "3"):
            raise ConnectionError("dashboard database is locked")
        published.append(event.partition_id)

    sink = EventSink(publish=publish, is_async=True)
    errors = metric("leaseboard_broadcast_errors_total")
    for pid in "012345":
        sink(_event(pid))  # called inside a cycle: must return at once
    assert published == []
    assert await sink.flush(5)
    assert published == ["0", "1", "4", "5"]
    assert metric("leaseboard_broadcast_errors_total") == errors + 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("failed: ConnectionError" in m for m in warnings) == 1
    assert sum("works again" in m for m in warnings) == 1


@pytest.mark.django_db(transaction=True)
async def test_the_sink_records_each_event_in_the_dashboards_event_log() -> None:
    from asgiref.sync import sync_to_async

    from dashboard.models import EventLog

    sink = EventSink()
    sink(_event("7"))
    assert await sink.flush(10)
    rows = await sync_to_async(lambda: [(r.kind, r.partition_id, r.owner_id) for r in EventLog.objects.all()])()
    assert rows == [("claim", "7", "a")]


# handlers and commands ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("nodots", "must be a dotted path"),
        ("no_such_module.handler", "cannot import module 'no_such_module'"),
        ("workers.handlers.nope", "module 'workers.handlers' has no attribute 'nope'"),
        ("workers.handlers.DEFAULT_HANDLER", "is a str, not a callable"),
    ],
)
def test_a_wrong_handler_path_is_refused_with_a_clear_message(path: str, message: str) -> None:
    with pytest.raises(HandlerNotFound, match=message):
        resolve_handler(path)


def test_a_handler_class_is_instantiated_once() -> None:
    handler = resolve_handler("tests.workers.conftest.Recorder")
    assert isinstance(handler, Recorder)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--interval", "2", "--expiry", "2"], r"--expiry \(2s\) must be longer than --interval \(2s\)"),
        (["--strategy", "fastest"], "unknown strategy 'fastest'; choose one of: "),
        (["--handler", "workers.handlers.nope"], "has no attribute 'nope'"),
        (["--count", "0"], "--count must be at least 1"),
    ],
)
def test_runworkers_refuses_bad_options_in_one_line(options: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message) as refused:
        call_command("runworkers", *options, "--store", "memory")
    assert "\n" not in str(refused.value)



class _CutOffReader:
    """A reader whose source handed the partition to another receiver after one event."""

    def __init__(self) -> None:
        self.calls = 0

    def receive(self, max_events: int) -> list[ReceivedEvent]:
        from workers.sources.base import PartitionTaken

        self.calls += 1
        if self.calls == 1:
            return [ReceivedEvent("0", 0, "0", 1.0, None, b"{}")]
        raise PartitionTaken("link stolen by a receiver with a higher owner level")

    def close(self) -> None:
        pass


async def test_a_reader_cut_off_by_the_source_ends_its_pump_as_lost_not_failed() -> None:
    from balancer.model import OwnershipRecord
    from balancer.stores.memory import MemoryStore
    from workers.runtime.pump import DeadLetters, PartitionPump, PumpConfig
    from workers.sources.base import PartitionTaken
    from workers.sources.eventhubs import PartitionStolen

    assert issubclass(PartitionStolen, PartitionTaken)
    store = MemoryStore()
    await store.claim_ownership([OwnershipRecord(REF, "0", "w")])
    reader = _CutOffReader()

    class Source:
        def reader(self, partition_id: str, position: Position) -> PartitionReader:
            return reader

    handled: list[int] = []
    pump = PartitionPump(
        ref=REF, partition_id="0", owner_id="w", holds=lambda pid: True, checkpoints=store,
        source=Source(),  # type: ignore[arg-type]
        handler=lambda event, ctx: handled.append(event.sequence_number),
        config=PumpConfig(checkpoint_events=1, checkpoint_seconds=60.0, dead_letter_dir=None),
        dead_letters=DeadLetters(None),
    )
    stats = await asyncio.wait_for(pump.run(), timeout=10)
    assert stats.ended == "lost" and handled == [0]


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


async def test_a_worker_that_sees_a_rebalance_request_wakes_every_worker_of_its_process(rig: Rig) -> None:
    from balancer.model import Control, ControlKind
    from workers.runtime.processor import run_workers

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

    from workers.runtime.processor import WAKE_GROUP, listen_for_wakeups

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
