"""``/api/pipeline``: ``?alerts=N`` newest alerts, and the live ``latency`` object."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.conf import LazySettings
from django.test import Client

from tests.dashboard.api_document import conforms_response
from workers.models import Alert, PipelineBatch

pytestmark = [pytest.mark.django_db]
HUB = "sensors"


@pytest.fixture(autouse=True)
def folders(settings: LazySettings, tmp_path: Path) -> None:
    settings.LEASEBOARD_LANDING_DIR = tmp_path / "landing"
    settings.LEASEBOARD_DEADLETTER_DIR = tmp_path / "deadletter"
    settings.LEASEBOARD_PIPELINE_DIR = tmp_path / "pipeline"


def alerts(count: int, raised: datetime, hub: str = HUB, latency: float = 0.5) -> None:
    """``count`` alerts, the event of alert i at ``raised`` - 1000 + i seconds (the last is the newest)."""
    Alert.objects.bulk_create(
        Alert(
            hub=hub,
            partition_id=str(i % 4),
            sequence_number=i,
            home=f"home-{i:05d}",
            kind="glass_break",
            sensor="glass_break",
            sensor_id="glass_break-1",
            event="detected",
            event_time=raised - timedelta(seconds=1000 - i),
            enqueued_time=raised - timedelta(seconds=latency),
            raised_at=raised,
            raised_by="landing" if i % 2 else "pipeline",
            batch_id=None if i % 2 else 7,
        )
        for i in range(count)
    )


def test_alerts_lists_as_many_newest_alerts_as_asked(client: Client) -> None:
    alerts(30, datetime.now(UTC))

    default = client.get("/api/pipeline", {"hub": HUB})
    three = client.get("/api/pipeline", {"hub": HUB, "alerts": "3"})
    empty = client.get("/api/pipeline", {"hub": HUB, "alerts": ""})  # empty is the same as missing
    every = client.get("/api/pipeline", {"hub": HUB, "alerts": "1000"})

    conforms_response("GET", f"/api/pipeline?hub={HUB}&alerts=3", three)
    assert [a["sequence_number"] for a in three.json()["alerts"]] == [29, 28, 27]  # newest event first
    assert len(default.json()["alerts"]) == 20 and len(empty.json()["alerts"]) == 20
    assert len(every.json()["alerts"]) == 30
    first = three.json()["alerts"][1]
    assert first["raised_by"] == "pipeline" and first["latency_seconds"] == 0.5
    assert first["enqueued_time"] == pytest.approx(first["raised_at"] - 0.5)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0", "alerts must be between 1 and 1000, got 0"),
        ("1001", "alerts must be between 1 and 1000, got 1001"),
        ("-3", "alerts must be between 1 and 1000, got -3"),
        ("many", "alerts must be a whole number, got 'many'"),
        ("2.5", "alerts must be a whole number, got '2.5'"),
    ],
)
def test_a_bad_alerts_count_is_a_400_saying_why(client: Client, value: str, says: str) -> None:
    response = client.get("/api/pipeline", {"hub": HUB, "alerts": value})
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert response.json() == {"error": says}
    conforms_response("GET", f"/api/pipeline?hub={HUB}&alerts={value}", response)


def test_every_existing_key_is_kept_and_latency_is_added(client: Client) -> None:
    state = client.get("/api/pipeline", {"hub": HUB}).json()
    assert set(state) == {
        "hub",
        "generated_at",
        "chart",
        "alerts",
        "batches",
        "lag",
        "totals",
        "unreadable_files",
        "dead_letters",
        "spark",
        "latency",
    }
    assert state["latency"] == {
        "window_seconds": 60,
        "alerts": {"count": 0, "p50": None, "p95": None},
        "aggregates": {"events": 0, "batches": 0, "p50": None, "p95": None, "estimated": True},
    }


def test_latency_covers_the_alerts_and_batches_of_the_last_minute(client: Client) -> None:
    now = datetime.now(UTC)
    alerts(4, now - timedelta(seconds=5), latency=0.25)
    alerts(1, now - timedelta(minutes=5), hub="older", latency=9.0)
    for batch_id, (finished, events) in enumerate([(now - timedelta(seconds=3), 30), (now - timedelta(hours=1), 99)]):
        PipelineBatch.objects.create(
            hub=HUB,
            query_id="q",
            batch_id=batch_id,
            finished_at=finished,
            events=events,
            alerts=0,
            newest_enqueued=finished - timedelta(seconds=2),
            oldest_enqueued=finished - timedelta(seconds=6),
            write_seconds=0.5,
        )

    response = client.get("/api/pipeline", {"hub": HUB})
    conforms_response("GET", f"/api/pipeline?hub={HUB}", response)
    figures = response.json()["latency"]

    assert figures["alerts"] == {"count": 4, "p50": 0.25, "p95": 0.25}
    assert figures["aggregates"] == {"events": 30, "batches": 1, "p50": 4.0, "p95": 5.8, "estimated": True}
