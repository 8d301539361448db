"""The pump's hand-off to its thread: one trip per checkpoint, the lease deadline checked per event,
and a read error held back until the events before it are checkpointed."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from balancer.model import Checkpoint, OwnershipRecord
from balancer.stores.memory import MemoryStore
from tests.support.clock import FakeClock
from tests.support.waiting import until
from workers.hub import log as hublog
from workers.hub.log import event_factory, make_event
from workers.runtime.config import PumpConfig
from workers.runtime.deadletters import DeadLetters
from workers.runtime.lane import ThreadLane
from workers.runtime.pump import PartitionPump
from workers.sources.base import PartitionReader, Position, ReceivedEvent

from .conftest import REF


class ListReader:
    """Hands out ``events`` in reads of at most ``max_events``, then ``error`` (if any), then nothing."""

    def __init__(self, events: list[ReceivedEvent], error: Exception | None = None, empty_reads: int = 0) -> None:
        self.events = events
        self.error = error
        self.empty_reads = empty_reads  # reads that find nothing between the events and the error
        self.reads = 0

    def receive(self, max_events: int) -> list[ReceivedEvent]:
        self.reads += 1
        if not self.events and self.empty_reads:
            self.empty_reads -= 1
            return []
        if not self.events and self.error is not None:
            error, self.error = self.error, None
            raise error
        out, self.events = self.events[:max_events], self.events[max_events:]
        return out

    def close(self) -> None:
        pass


class Source:
    def __init__(self, reader: ListReader) -> None:
        self._reader = reader

    def reader(self, partition_id: str, position: Position) -> PartitionReader:
        return self._reader


def events(count: int) -> list[ReceivedEvent]:
    return [ReceivedEvent("0", s, str(s * 10), 1.0, None, b"{}") for s in range(count)]


async def owned_store() -> MemoryStore:
    store = MemoryStore()
    await store.claim_ownership([OwnershipRecord(REF, "0", "w")])
    return store


def pump(
    store: MemoryStore, reader: ListReader, handler: Any, clock: FakeClock, deadline: float, **config: Any
) -> PartitionPump:
    return PartitionPump(
        ref=REF,
        partition_id="0",
        owner_id="w",
        holds=lambda pid: clock() < deadline,
        checkpoints=store,
        source=Source(reader),  # type: ignore[arg-type]
        handler=handler,
        config=PumpConfig(dead_letter_dir=None, **config),
        dead_letters=DeadLetters(None),
        monotonic=clock,
        deadline=lambda pid: deadline,
    )


async def test_a_sync_pump_goes_to_its_thread_once_per_checkpoint_not_twice_per_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trips = 0
    call = ThreadLane.call

    async def counted(self: ThreadLane, fn: Any, *args: Any) -> Any:
        nonlocal trips
        trips += 1
        return await call(self, fn, *args)

    monkeypatch.setattr(ThreadLane, "call", counted)
    store, clock, reader = await owned_store(), FakeClock(), ListReader(events(1000))
    handled: list[int] = []
    p = pump(
        store,
        reader,
        lambda e, ctx: handled.append(e.sequence_number),
        clock,
        clock() + 60,
        checkpoint_events=100,
        checkpoint_seconds=1e9,
        max_events=10,
    )
    task = asyncio.create_task(p.run())
    while len(handled) < 1000 or p.stats.checkpointed != 999:
        await asyncio.sleep(0.001)
    p.stop()
    await task
    assert handled == list(range(1000)) and p.stats.checkpoints == 10
    assert reader.reads >= 100  # reads of 10 events each...
    assert trips <= 10 + 1 + reader.reads - 100  # ...yet one trip per checkpoint (plus opening, idle polls)


async def test_no_event_is_handled_once_the_lease_deadline_passed_even_in_the_middle_of_a_read() -> None:
    store, clock, reader = await owned_store(), FakeClock(), ListReader(events(50))
    handled: list[int] = []
    deadline = clock() + 10

    def handler(event: ReceivedEvent, ctx: Any) -> None:
        handled.append(event.sequence_number)
        if event.sequence_number == 6:
            clock.advance(10)  # as if the process had been stopped here (SIGSTOP) past the deadline

    p = pump(store, reader, handler, clock, deadline, checkpoint_events=1000, max_events=50)
    task = asyncio.create_task(p.run())
    await until(lambda: p.paused, what="the pump to pause at the deadline")
    assert handled == list(range(7)) and not task.done()
    p.stop()  # the lease was lost: the paused pump ends without a checkpoint
    stats = await asyncio.wait_for(task, 10)
    assert handled == list(range(7)) and stats.ended == "expired"
    assert await store.list_checkpoints(REF) == []  # not held: no checkpoint either


async def test_a_read_error_after_handled_events_is_raised_once_they_are_checkpointed() -> None:
    store, clock = await owned_store(), FakeClock()
    reader = ListReader(events(5), error=OSError("disk gone"))
    p = pump(store, reader, lambda e, ctx: None, clock, clock() + 60, checkpoint_events=1000, max_events=3)
    with pytest.raises(OSError, match="disk gone"):
        await asyncio.wait_for(p.run(), 10)
    [checkpoint] = await store.list_checkpoints(REF)
    assert (checkpoint.sequence_number, checkpoint.offset) == (4, "40") and p.stats.ended == "failed"


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync handler", "async handler"])
async def test_a_read_error_after_a_quiet_read_still_checkpoints_what_was_handled_before_it(asynchronous: bool) -> None:
    # As in the chaos suite's failing reader: events handled, a read that found nothing (the pump
    # waited, its checkpoint not yet due), then a read that fails. The next owner must resume after
    # the handled events, not handle them again.
    store, clock = await owned_store(), FakeClock()
    reader = ListReader(events(5), error=OSError("link refused"), empty_reads=1)

    async def async_handler(event: ReceivedEvent, ctx: Any) -> None:
        pass

    handler = async_handler if asynchronous else (lambda e, ctx: None)
    p = pump(store, reader, handler, clock, clock() + 60, checkpoint_events=1000, checkpoint_seconds=1e9)
    with pytest.raises(OSError, match="link refused"):
        await asyncio.wait_for(p.run(), 10)
    [checkpoint] = await store.list_checkpoints(REF)
    assert checkpoint.sequence_number == 4 and p.stats.ended == "failed"


def test_the_fast_event_constructor_makes_equal_frozen_events() -> None:
    made = make_event("3", 7, "700", 1.5, "home-1", b"{}", b"")
    built = ReceivedEvent("3", 7, "700", 1.5, "home-1", b"{}")
    assert made == built and hash(made) == hash(built) and type(made) is ReceivedEvent
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.sequence_number = 8  # type: ignore[misc]


def test_the_fast_event_constructor_steps_aside_when_the_event_class_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        partition_id: str
        sequence_number: int
        offset: str
        enqueued_time: float
        partition_key: str | None
        body: bytes

        def __post_init__(self) -> None:
            if self.sequence_number < 0:
                raise ValueError("negative")

    monkeypatch.setattr(hublog, "ReceivedEvent", Checked)
    factory: object = event_factory()  # (whatever its declared type: the class itself)
    assert factory is Checked  # validation in __post_init__ must not be skipped


async def test_checkpoints_land_on_every_nth_event_across_reads_of_another_size() -> None:
    store, clock, reader = await owned_store(), FakeClock(), ListReader(events(25))
    written: list[int] = []

    async def update(checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        written.append(checkpoint.sequence_number)
        return await MemoryStore.update_checkpoint(store, checkpoint, owner_id)

    store.update_checkpoint = update  # type: ignore[method-assign]
    p = pump(store, reader, lambda e, ctx: None, clock, clock() + 60, checkpoint_events=10, max_events=7)
    task = asyncio.create_task(p.run())
    while p.stats.processed < 25:
        await asyncio.sleep(0.001)
    p.stop()
    await task
    assert written == [9, 19, 24]


def test_a_checkpoint_store_outage_is_logged_once_per_worker_not_once_per_partition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from balancer.errors import StoreUnavailable
    from workers.runtime.checkpoints import CheckpointOutage

    outage = CheckpointOutage("w")
    down = StoreUnavailable("cannot reach the service")
    with caplog.at_level("WARNING", logger="leaseboard.pump"):
        for pid in "012":
            outage.failed(pid, down)
        outage.ok("0")  # one back, two still failing: not over
        outage.failed("1", down)
        outage.forget("2")  # its pump ended (lease expired)
        outage.ok("1")
    assert [r.getMessage() for r in caplog.records] == [
        "worker w: checkpoint store failed: StoreUnavailable: cannot reach the service; retrying; events handled "
        "meanwhile are checkpointed when it answers (or handled again by the next owner)",
        "worker w: checkpoint store works again after 4 failed attempts",
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="leaseboard.pump"):
        outage.failed("3", down)  # one partition failing on its own while the others checkpoint
        for _ in range(3):
            outage.ok("4")
            outage.failed("3", down)
    assert len(caplog.records) == 1
