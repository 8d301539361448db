"""Handler calls of the worker runtime: retries and dead letters, batches, async handlers, gaps in
sequence numbers and a reader cut off by its source; on a real embedded hub and store."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.waiting import until
from workers.handlers import PartitionContext, batch_handler, count_sensor_events
from workers.sensors import SensorEvent
from workers.sources.base import PartitionReader, Position, ReceivedEvent

from .conftest import REF, Recorder, Rig, checkpoints, metric, own_all

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

    @batch_handler(max_events=3)  # type: ignore[untyped-decorator]  # batch_handler(...) is typed as Any
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
    a._source = DroppingSource(rig.hub, drop=3)
    gaps = metric("leaseboard_sequence_gaps_total")
    await own_all(a, 4)
    await until(lambda: recorder.count() == 5, what="the five events that came")
    assert recorder.sequences("0") == [0, 1, 2, 4, 5]
    assert a.stats()["0"].gaps == 1 and metric("leaseboard_sequence_gaps_total") == gaps + 1
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR and "lost data" in r.getMessage()]
    assert "jump from 2 to 4: 1 events" in error.getMessage()
    await a.shutdown()


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


# a reader cut off ---------------------------------------------------------------------------------


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
    from workers.runtime.config import PumpConfig
    from workers.runtime.deadletters import DeadLetters
    from workers.runtime.pump import PartitionPump
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
        ref=REF,
        partition_id="0",
        owner_id="w",
        holds=lambda pid: True,
        checkpoints=store,
        source=Source(),  # type: ignore[arg-type]
        handler=lambda event, ctx: handled.append(event.sequence_number),
        config=PumpConfig(checkpoint_events=1, checkpoint_seconds=60.0, dead_letter_dir=None),
        dead_letters=DeadLetters(None),
    )
    stats = await asyncio.wait_for(pump.run(), timeout=10)
    assert stats.ended == "lost" and handled == [0]
