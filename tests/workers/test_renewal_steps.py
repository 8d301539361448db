"""The runtime's renewal steps (issue 15, item 2): between two cycles the worker's loop wakes when a
lease falls due (``Coordinator.next_renewal``: 65 % of the expiry after its last renewal) and renews
it without a listing; a failed renewal is tried again after a short backoff while the lease holds.

Driven by a fake clock: the injected sleep moves it by what was asked (or not at all), and the loop
between two cycles (``_until_cycle``) is run directly, so no pump sleeps on that clock meanwhile.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from balancer.lease import RENEW_SHARE, Coordinator
from balancer.protocol import CYCLES_ONLY, CycleReport, Driver
from tests.support.waiting import until
from workers.runtime.processor import EventProcessor

from .conftest import REF, Recorder, Rig, own_all


def ticking(rig: Rig, asked: list[float]) -> object:
    """A sleep that records what it was asked and moves the fake clock by that much."""

    async def sleep(seconds: float) -> None:
        asked.append(seconds)
        rig.clock.advance(seconds)
        await asyncio.sleep(0)

    return sleep


async def holding(rig: Rig, asked: list[float]) -> EventProcessor:
    """A worker (interval 2 s, expiry 10 s) holding all four partitions, its loop renewing between
    cycles; no pump started (its coordinator cycled directly)."""
    # greedy renews at a quarter of the expiry by default (it judges by its own clock): told the
    # default strategy's 65 % here, which these tests follow
    sleep = ticking(rig, asked)
    a = rig.worker("a", Recorder(), interval=2.0, expiry=10.0, strategy="greedy", sleep=sleep, renew_share=RENEW_SHARE)  # type: ignore[arg-type]
    await a.coordinator.cycle()
    assert a.coordinator.owned == frozenset("0123")
    a.renewal_steps = True  # as run() sets it
    return a


async def last_modified(rig: Rig) -> dict[str, float | None]:
    return {r.partition_id: r.last_modified for r in await rig.store.list_ownership(REF)}


async def test_between_cycles_the_loop_wakes_at_65_percent_of_the_expiry_and_renews_without_a_listing(
    rig: Rig,
) -> None:
    asked: list[float] = []
    a = await holding(rig, asked)
    claimed = rig.clock()
    requests = rig.store.requests
    await a._until_cycle(8.0)  # a cycle 8 s away: the leases fall due at 6.5 s, before it
    assert asked == pytest.approx([6.5, 1.5])
    assert rig.store.requests - requests == 1  # one write of the four renewals, no listing
    assert list((await last_modified(rig)).values()) == pytest.approx([claimed + 6.5] * 4)
    assert a.coordinator.deadline("0") == pytest.approx(claimed + 16.5)

    asked.clear()
    requests = rig.store.requests
    await a._until_cycle(2.0)  # next due at 13 s: after this cycle, so no step now
    assert asked == pytest.approx([2.0]) and rig.store.requests == requests


async def test_a_failed_renewal_is_tried_again_after_a_backoff_until_the_lease_would_lapse(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    asked: list[float] = []
    a = await holding(rig, asked)
    claimed = rig.clock()
    rig.store.down = True
    caplog.set_level(logging.DEBUG, logger="leaseboard")
    await a._until_cycle(12.0)
    # at 6.5 s, then 0.5 s and 1 s later; the next would be at 10 s, when the leases no longer hold:
    # the cycles try from then on (and the pumps pause until one works)
    assert asked == pytest.approx([6.5, 0.5, 1.0, 4.0])
    assert a.coordinator.owned == frozenset("0123") and not a.coordinator.holds("0")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "lease renewal failed: StoreUnavailable" in warnings[0], warnings

    rig.store.down = False
    asked.clear()
    await a.step()  # nobody took them: the cycle renews them
    assert a.coordinator.holds("0") and a.coordinator.next_renewal() == pytest.approx(rig.clock() + 6.5)
    assert claimed + 12.0 == pytest.approx(rig.clock())
    await a.shutdown()


async def test_a_renewal_that_works_on_its_retry_moves_the_deadline_and_logs_that_it_works_again(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    asked: list[float] = []
    a = await holding(rig, asked)
    claimed = rig.clock()
    rig.store.down = True
    renew = a.coordinator.renew

    async def heal_after_the_first(driver: Driver = CYCLES_ONLY) -> CycleReport:
        try:
            return await renew(driver)
        finally:
            rig.store.down = False

    a.coordinator.renew = heal_after_the_first  # type: ignore[method-assign]
    await a._until_cycle(8.0)
    assert asked == pytest.approx([6.5, 0.5, 1.0])
    assert a.coordinator.deadline("0") == pytest.approx(claimed + 17.0)
    assert any("lease renewal works again" in r.getMessage() for r in caplog.records)


async def test_wake_during_the_wait_for_a_renewal_runs_the_cycle_at_once(rig: Rig) -> None:
    asked: list[float] = []
    a = await holding(rig, asked)
    forever = asyncio.Event()

    async def never(seconds: float) -> None:
        asked.append(seconds)
        await forever.wait()

    a._sleep = never
    requests = rig.store.requests
    waiting = asyncio.create_task(a._until_cycle(8.0))
    await until(lambda: asked, what="the loop to wait for the renewal")
    a.wake()
    await asyncio.wait_for(waiting, 5.0)
    assert asked == pytest.approx([6.5]) and rig.store.requests == requests  # no renewal: a cycle is next


async def test_a_renewal_step_that_lost_a_partition_stops_its_pump(rig: Rig) -> None:
    a = rig.worker("a", Recorder(), interval=2.0, expiry=10.0)
    await own_all(a, 4)
    a.renewal_steps = True
    record = next(r for r in await rig.store.list_ownership(REF) if r.partition_id == "2")
    assert await rig.store.claim_ownership([record.claimed_by("b")])  # taken behind a's back
    due = a.coordinator.next_renewal()
    assert due is not None
    rig.clock.advance(due - rig.clock())
    report = await a.renew()
    assert report is not None and [e.partition_id for e in report.lost] == ["2"]
    await until(lambda: a.pumping == frozenset("013"), what="the pump of the lost partition to stop")
    assert a.coordinator.owned == frozenset("013")
    await a.shutdown()


async def test_run_has_the_coordinator_renew_between_cycles(rig: Rig) -> None:
    a = rig.worker("a", Recorder(), interval=2.0, expiry=10.0)
    assert not a.renewal_steps  # cycles alone renew until a loop renews between them
    assert isinstance(a.coordinator, Coordinator)
    assert not a.coordinator.renewal_steps  # told with each call, never set on the coordinator
    a.stop()
    await a.run()
    assert a.renewal_steps and not a.coordinator.renewal_steps
