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

    sink = build_sink()  # the publisher LEASEBOARD_EVENT_PUBLISHER names: the dashboard's event log
    sink(_event("7"))
    assert await sink.flush(10)
    rows = await sync_to_async(lambda: [(r.kind, r.partition_id, r.owner_id) for r in EventLog.objects.all()])()
    assert rows == [("claim", "7", "a")]
