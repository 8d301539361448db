"""The sink of balancer events: logged, counted and broadcast in order, never raising into a cycle."""

from __future__ import annotations

import asyncio
import logging

import pytest

from balancer.model import BalancerEvent, EventKind
from workers.runtime.sink import EventSink
from workers.wiring import build_sink

from .conftest import REF, metric


def _event(pid: str) -> BalancerEvent:
    return BalancerEvent(EventKind.CLAIM, REF, pid, "a", None, "a", "never owned", 1.0)


async def test_the_sink_broadcasts_in_order_and_a_failing_dashboard_is_logged_once_not_raised_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    published: list[str] = []
    failures = {"2": 2, "3": 1}  # the dashboard's database fails twice on event 2, once on event 3
    waits: list[float] = []

    async def publish(event: BalancerEvent) -> None:
        await asyncio.sleep(0.001 * (3 - int(event.partition_id) % 3))  # later events would overtake
        if failures.get(event.partition_id, 0) > 0:
            failures[event.partition_id] -= 1
            raise ConnectionError("dashboard database is locked")
        published.append(event.partition_id)

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    sink = EventSink(publish=publish, is_async=True, retry=0.5, retry_max=0.75, sleep=sleep)
    errors = metric("leaseboard_broadcast_errors_total")
    for pid in "012345":
        sink(_event(pid))  # called inside a cycle: must return at once
    assert published == [] and sink.unsent == 6
    assert await sink.flush(5)
    assert published == ["0", "1", "2", "3", "4", "5"] and sink.unsent == 0  # late, never lost, in order
    assert waits == [0.5, 0.75, 0.5]  # doubling up to retry_max, from the start again after a success
    assert metric("leaseboard_broadcast_errors_total") == errors + 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("failed: ConnectionError" in m and "tried again" in m for m in warnings) == 2
    assert sum("works again" in m for m in warnings) == 2


async def test_while_the_dashboard_is_unreachable_the_sink_keeps_the_newest_events_up_to_its_backlog(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reachable = asyncio.Event()
    published: list[str] = []

    async def publish(event: BalancerEvent) -> None:
        if not reachable.is_set():
            raise ConnectionError("no route to host")
        published.append(event.partition_id)

    async def sleep(seconds: float) -> None:
        await asyncio.sleep(0)  # hand the loop back, as a real wait would

    sink = EventSink(publish=publish, is_async=True, backlog=4, sleep=sleep)
    dropped = metric("leaseboard_broadcast_dropped_total")
    for pid in "0123456":
        sink(_event(pid))
        await asyncio.sleep(0)
    assert not await sink.flush(0.05)  # still waiting for the dashboard: reported, not raised
    reachable.set()
    assert await sink.flush(5)
    assert published == ["3", "4", "5", "6"] and sink.dropped == 3
    assert metric("leaseboard_broadcast_dropped_total") == dropped + 3
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["balancer events dropped without reaching the dashboard: 1 so far (more than 4 waited)"]
    assert any("not yet handed to the dashboard" in r.getMessage() for r in caplog.records)


@pytest.mark.django_db(transaction=True)
async def test_the_sink_records_each_event_in_the_dashboards_event_log() -> None:
    from asgiref.sync import sync_to_async

    from dashboard.models import EventLog

    sink = build_sink()  # the publisher LEASEBOARD_EVENT_PUBLISHER names: the dashboard's event log
    sink(_event("7"))
    assert await sink.flush(10)
    rows = await sync_to_async(lambda: [(r.kind, r.partition_id, r.owner_id) for r in EventLog.objects.all()])()
    assert rows == [("claim", "7", "a")]
