"""A pump whose lease may have run out (a store outage longer than the expiry) pauses: it handles
nothing, writes no checkpoint and keeps its reader, its position and its pending checkpoint. Renewed,
it writes that checkpoint first and goes on where it was (no event handled twice); lost, it is
stopped and ends "expired" without a checkpoint. For sync, async and batch handlers; a fake lease
on a fake clock, waiting by polling with a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from balancer.model import Checkpoint, OwnershipRecord
from balancer.stores.memory import MemoryStore
from tests.support.clock import FakeClock
from tests.support.waiting import until
from workers.handlers import NotHeld, PartitionContext, batch_handler
from workers.runtime.config import PumpConfig
from workers.runtime.deadletters import DeadLetters
from workers.runtime.pump import PartitionPump
from workers.sources.base import PartitionReader, Position, ReceivedEvent

from .conftest import REF, metric, quick_sleep
from .test_pump_lane import ListReader, events

TOTAL = 30
LAPSE_AT = 10  # the handler of this event sees the lease run out (the clock jumps past the deadline)


class Lease:
    """A coordinator's view of one lease: held until ``until`` on ``clock``; ``renew`` as a cycle would."""

    def __init__(self, clock: FakeClock, expiry: float = 10.0) -> None:
        self.clock = clock
        self.expiry = expiry
        self.until = clock() + expiry
        self.looks = 0  # holds() calls: how often the pump looked at its lease

    def holds(self, partition_id: str) -> bool:
        self.looks += 1
        return self.clock() < self.until

    def deadline(self, partition_id: str) -> float:
        return self.until

    def lapse(self) -> None:
        self.clock.advance(self.until - self.clock() + 1)

    def renew(self) -> None:
        self.until = self.clock() + self.expiry


class Journal:
    """What happened, in order: ("event", n) per event handled, ("checkpoint", n) per checkpoint written."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, int]] = []

    def handled(self) -> list[int]:
        return [n for kind, n in self.entries if kind == "event"]

    def checkpoints(self) -> list[int]:
        return [n for kind, n in self.entries if kind == "checkpoint"]


class JournalStore(MemoryStore):
    def __init__(self, journal: Journal) -> None:
        super().__init__()
        self.journal = journal

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        stored = await super().update_checkpoint(checkpoint, owner_id)
        self.journal.entries.append(("checkpoint", checkpoint.sequence_number))
        return stored


class CountingSource:
    def __init__(self, reader: ListReader) -> None:
        self.reader_calls = 0
        self._reader = reader

    def reader(self, partition_id: str, position: Position) -> PartitionReader:
        self.reader_calls += 1
        return self._reader


def make_handler(kind: str, journal: Journal, lease: Lease, fail_once_at: int | None = None) -> Any:
    """A handler of ``kind`` (sync, async, sync-batch, async-batch) journaling what it handled; at
    ``LAPSE_AT`` the lease runs out; at ``fail_once_at`` the first try raises (after the lapse)."""
    failed: set[int] = set()
    lapsed: list[int] = []

    def one(event: ReceivedEvent) -> None:
        n = event.sequence_number
        if n == LAPSE_AT and not lapsed:
            lapsed.append(n)
            lease.lapse()
        if n == fail_once_at and n not in failed:
            failed.add(n)
            raise RuntimeError(f"first try of {n} fails")
        journal.entries.append(("event", n))

    if kind == "sync":

        def sync(event: ReceivedEvent, ctx: PartitionContext) -> None:
            one(event)

        return sync
    if kind == "async":

        async def on_loop(event: ReceivedEvent, ctx: PartitionContext) -> None:
            one(event)

        return on_loop

    def batch(events: Sequence[ReceivedEvent], ctx: PartitionContext) -> None:
        for event in events:
            one(event)

    async def async_batch(events: Sequence[ReceivedEvent], ctx: PartitionContext) -> None:
        batch(events, ctx)

    return batch_handler(batch if kind == "sync-batch" else async_batch, max_events=4)


HANDLERS = ["sync", "async", "sync-batch", "async-batch"]


class Rig:
    def __init__(self, kind: str, fail_once_at: int | None = None, sleep: Any = quick_sleep, make: Any = None) -> None:
        self.clock = FakeClock()
        self.lease = Lease(self.clock)
        self.journal = Journal()
        self.store = JournalStore(self.journal)
        self.source = CountingSource(ListReader(events(TOTAL)))
        self.pump = PartitionPump(
            ref=REF,
            partition_id="0",
            owner_id="w",
            holds=self.lease.holds,
            checkpoints=self.store,
            source=self.source,  # type: ignore[arg-type]
            handler=(make or make_handler)(kind, self.journal, self.lease, fail_once_at),
            config=PumpConfig(
                checkpoint_events=5, checkpoint_seconds=1e9, max_events=10, backoff_seconds=0.01, dead_letter_dir=None
            ),
            dead_letters=DeadLetters(None),
            monotonic=self.clock,
            sleep=sleep,
            deadline=self.lease.deadline,
        )
        self.task: asyncio.Task[Any] | None = None

    async def start(self) -> None:
        await self.store.claim_ownership([OwnershipRecord(REF, "0", "w")])
        self.task = asyncio.create_task(self.pump.run())

    async def paused(self) -> tuple[list[int], list[int]]:
        """Wait for the pause, check that nothing happens while it lasts; (handled, checkpoints) then."""
        await until(lambda: self.pump.paused, what="the pump to pause")
        handled, written = self.journal.handled(), self.journal.checkpoints()
        assert handled == list(range(len(handled))) and LAPSE_AT < len(handled) < TOTAL
        looks = self.lease.looks
        await until(lambda: self.lease.looks > looks + 20, what="the paused pump to look at its lease again")
        assert self.pump.paused and self.task is not None and not self.task.done()
        # nothing handled, not even a checkpoint written
        assert self.journal.handled() == handled and self.journal.checkpoints() == written
        return handled, written

    async def paused_without_polls(self) -> tuple[list[int], list[int]]:
        """Wait for the pause of a pump whose sleep never ends; (handled, checkpoints) then."""
        await until(lambda: self.pump.paused, what="the pump to pause")
        return self.journal.handled(), self.journal.checkpoints()


@pytest.mark.parametrize("kind", HANDLERS)
async def test_a_pump_whose_lease_lapses_pauses_then_checkpoints_and_resumes_where_it_was_once_renewed(
    kind: str,
) -> None:
    rig = Rig(kind)
    paused_before = metric("leaseboard_paused_partitions")
    await rig.start()
    handled, written = await rig.paused()
    assert written and written[-1] < handled[-1]  # a checkpoint pending: events handled since the last one
    assert metric("leaseboard_paused_partitions") == paused_before + 1

    rig.lease.renew()
    rig.pump.wake()  # what the processor does after every cycle
    await until(lambda: rig.journal.handled() == list(range(TOTAL)), what="every event, once")
    assert not rig.pump.paused and metric("leaseboard_paused_partitions") == paused_before
    first_after_pause = rig.journal.entries[len(handled) + len(written) :][0]
    assert first_after_pause == ("checkpoint", handled[-1]), "the pending checkpoint first, then new events"
    assert rig.source.reader_calls == 1  # the same reader: nothing read again

    rig.pump.stop()
    assert rig.task is not None
    stats = await asyncio.wait_for(rig.task, 10)
    assert stats.ended == "stopped" and stats.processed == TOTAL and stats.checkpointed == TOTAL - 1


@pytest.mark.parametrize("kind", HANDLERS)
async def test_a_paused_pump_whose_lease_is_lost_ends_expired_without_a_checkpoint(kind: str) -> None:
    rig = Rig(kind)
    paused_before = metric("leaseboard_paused_partitions")
    await rig.start()
    handled, written = await rig.paused()

    rig.pump.stop()  # the processor's cycle found the partition in another worker's hands
    assert rig.task is not None
    stats = await asyncio.wait_for(rig.task, 10)
    assert stats.ended == "expired"
    assert rig.journal.handled() == handled and rig.journal.checkpoints() == written  # no checkpoint on the way out
    assert [c.sequence_number for c in await rig.store.list_checkpoints(REF)] == [written[-1]]
    assert metric("leaseboard_paused_partitions") == paused_before


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_pump_paused_between_retries_retries_once_renewed_and_loses_nothing(kind: str) -> None:
    rig = Rig(kind, fail_once_at=LAPSE_AT)  # the lease lapses in the handler call that fails
    await rig.start()
    await until(lambda: rig.pump.paused, what="the pump to pause before its retry")
    assert rig.journal.handled() == list(range(LAPSE_AT)) and rig.pump.stats.errors == 1
    rig.lease.renew()
    rig.pump.wake()
    await until(lambda: rig.journal.handled() == list(range(TOTAL)), what="every event, once")
    assert rig.pump.stats.dead_lettered == 0 and rig.pump.stats.errors == 1
    rig.pump.stop()
    assert rig.task is not None
    assert (await asyncio.wait_for(rig.task, 10)).ended == "stopped"


async def _sleep_forever(seconds: float) -> None:
    await asyncio.Event().wait()


async def test_a_paused_pump_waits_for_a_wake_up_instead_of_polling() -> None:
    rig = Rig("sync", sleep=_sleep_forever)  # a sleep that never ends: only wake() or stop() moves the pump
    await rig.start()
    await rig.paused_without_polls()
    looks = rig.lease.looks
    for _ in range(20):
        await asyncio.sleep(0)
    assert rig.lease.looks == looks  # not spinning on the lease
    rig.pump.wake()  # a cycle that renewed nothing
    await until(lambda: rig.lease.looks > looks, what="one look after wake()")
    assert rig.pump.paused
    rig.lease.renew()
    rig.pump.wake()
    await until(lambda: not rig.pump.paused, what="the pump to resume after wake()")
    rig.pump.stop()
    assert rig.task is not None
    rig.task.cancel()  # its idle polls use the never-ending sleep too
    with pytest.raises(asyncio.CancelledError):
        await rig.task


@pytest.mark.parametrize("lost", [False, True])
async def test_a_paused_pump_stopped_once_renewed_checkpoints_unless_its_partition_was_lost_meanwhile(
    lost: bool,
) -> None:
    # Renewed but stopped before it looked again: a handoff or a shutdown writes the final checkpoint;
    # a partition lost and claimed back in one cycle (a new lease: this pump's position is stale) does not.
    rig = Rig("sync", sleep=_sleep_forever)
    await rig.start()
    handled, written = await rig.paused_without_polls()
    rig.lease.renew()
    rig.pump.stop(lost=lost)
    assert rig.task is not None
    stats = await asyncio.wait_for(rig.task, 10)
    assert rig.journal.handled() == handled
    if lost:
        assert stats.ended == "expired" and rig.journal.checkpoints() == written
    else:
        assert stats.ended == "stopped" and rig.journal.checkpoints() == [*written, handled[-1]]


@pytest.mark.parametrize("then", ["renewed", "lost"])
async def test_a_paused_pump_handed_off_waits_for_its_leases_renewal_to_checkpoint_or_for_its_loss(then: str) -> None:
    # CI (Blob netsplit, seed 322902): a worker under load saw the hub late and handed its partitions
    # over; one pump's lease deadline had just passed unrenewed, so it ended "expired" without its
    # final checkpoint, and the release (its lease was still its own) let the next owner handle 20
    # events again with no fault to explain them. A handoff's lease is renewed until its release.
    rig = Rig("sync", sleep=_sleep_forever)
    paused_before = metric("leaseboard_paused_partitions")
    await rig.start()
    handled, written = await rig.paused_without_polls()
    rig.pump.stop(handoff=True)
    for _ in range(20):
        await asyncio.sleep(0)
    assert rig.task is not None and not rig.task.done()  # waits, paused, writing nothing
    assert rig.journal.checkpoints() == written
    if then == "renewed":
        rig.lease.renew()
        rig.pump.wake()  # the cycle that renewed it
    else:
        rig.pump.stop(lost=True)  # released after the handoff's wait, or taken: what reconcile() does
    stats = await asyncio.wait_for(rig.task, 10)
    assert rig.journal.handled() == handled  # not one event more
    assert metric("leaseboard_paused_partitions") == paused_before
    if then == "renewed":
        assert stats.ended == "stopped" and rig.journal.checkpoints() == [*written, handled[-1]]
    else:
        assert stats.ended == "expired" and rig.journal.checkpoints() == written


async def test_a_paused_pump_stopped_for_a_shutdown_after_its_handoff_began_does_not_wait() -> None:
    rig = Rig("sync", sleep=_sleep_forever)
    await rig.start()
    _, written = await rig.paused_without_polls()
    rig.pump.stop(handoff=True)
    rig.pump.stop()  # the worker stops: its own bound is short, a lease that may have run out is not waited for
    assert rig.task is not None
    assert (await asyncio.wait_for(rig.task, 10)).ended == "expired" and rig.journal.checkpoints() == written


def make_careful_handler(kind: str, journal: Journal, lease: Lease, fail_once_at: int | None = None) -> Any:
    """A handler of ``kind`` that makes its work visible (journals it) only after asking ``ctx.holds()``,
    as ``LandingHandler`` does: the call that holds ``LAPSE_AT`` sees the lease run out in the middle
    (the first time) and raises ``NotHeld`` with nothing journaled."""
    lapsed: list[int] = []

    def commit(events: Sequence[ReceivedEvent], ctx: PartitionContext) -> None:
        if any(e.sequence_number == LAPSE_AT for e in events) and not lapsed:
            lapsed.append(LAPSE_AT)
            lease.lapse()
        if not ctx.holds():
            raise NotHeld("the lease ran out before the work was visible")
        journal.entries.extend(("event", e.sequence_number) for e in events)

    if kind == "sync":

        def sync(event: ReceivedEvent, ctx: PartitionContext) -> None:
            commit([event], ctx)

        return sync
    if kind == "async":

        async def on_loop(event: ReceivedEvent, ctx: PartitionContext) -> None:
            commit([event], ctx)

        return on_loop

    async def async_batch(events: Sequence[ReceivedEvent], ctx: PartitionContext) -> None:
        commit(events, ctx)

    return batch_handler(commit if kind == "sync-batch" else async_batch, max_events=4)


@pytest.mark.parametrize("kind", HANDLERS)
async def test_a_handler_that_finds_its_lease_gone_keeps_its_events_for_after_the_pause(kind: str) -> None:
    rig = Rig(kind, make=make_careful_handler)
    await rig.start()
    await until(lambda: rig.pump.paused, what="the pump to pause")
    handled = rig.journal.handled()
    assert handled == list(range(len(handled))) and len(handled) <= LAPSE_AT  # nothing visible after the lapse
    assert rig.pump.stats.errors == 0 and rig.pump.stats.dead_lettered == 0  # neither a failure nor set aside

    rig.lease.renew()
    rig.pump.wake()
    await until(lambda: rig.journal.handled() == list(range(TOTAL)), what="every event, once")
    assert rig.pump.stats.errors == 0 and rig.pump.stats.dead_lettered == 0
    rig.pump.stop()
    assert rig.task is not None
    assert (await asyncio.wait_for(rig.task, 10)).ended == "stopped"


def _not_held_at(n: int, event: ReceivedEvent, journal: Journal) -> None:
    if event.sequence_number == n:
        raise NotHeld("not true: the lease is held")
    journal.entries.append(("event", event.sequence_number))


async def test_a_handler_that_raises_not_held_while_the_lease_is_held_fails_like_any_other() -> None:
    """Raised while held, NotHeld is a failure (retried, then set aside), so it cannot spin the pump."""
    rig = Rig("sync", make=lambda kind, journal, lease, _: lambda event, ctx: _not_held_at(3, event, journal))
    await rig.start()
    await until(lambda: rig.pump.stats.dead_lettered == 1, what="the event to be set aside")
    await until(lambda: len(rig.journal.handled()) == TOTAL - 1, what="the rest")
    assert 3 not in rig.journal.handled() and rig.pump.stats.errors >= 1
    rig.pump.stop()
    assert rig.task is not None
    await asyncio.wait_for(rig.task, 10)


class GatedReader(ListReader):
    """A reader whose link could take the partition from another reader: it offers ``gate``."""

    def __init__(self, items: list[ReceivedEvent]) -> None:
        super().__init__(items)
        self.may_open: Any = None

    def gate(self, may_open: Any) -> None:
        self.may_open = may_open


async def test_a_readers_link_may_open_only_while_the_pumps_lease_holds() -> None:
    # Event Hubs' readers reconnect on their own: a worker cut off from everything must not take the
    # partition back from its new owner when the network heals (workers.sources.eventhubs.reader).
    rig = Rig("sync")
    reader = GatedReader(events(TOTAL))
    rig.source = CountingSource(reader)
    rig.pump._source = rig.source  # type: ignore[assignment]
    await rig.start()
    await until(lambda: reader.may_open is not None, what="the pump to gate its reader")
    await rig.paused()  # its handler saw the lease run out at event LAPSE_AT
    assert reader.may_open() is False  # the lease ran out: the link stays shut
    rig.lease.renew()
    assert reader.may_open() is True
    rig.pump.wake()
    await until(lambda: rig.journal.handled() == list(range(TOTAL)), what="every event, once")
    rig.pump.stop()
    assert rig.task is not None
    await asyncio.wait_for(rig.task, 10)
