"""The Pipeline page and its JSON endpoint, from database rows, landing markers and dead letters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import LazySettings
from django.test import Client
from prometheus_client import CollectorRegistry, generate_latest
from pyspark.sql import SparkSession

from dashboard.web.pipeline import MINUTES, PipelineCollector
from tests.dashboard.api_document import conforms_response
from workers.models import Alert, MinuteSummary, PipelineBatch, UnreadableFile
from workers.pipeline import cluster

from .conftest import HUB, T0, Landing, fleet_events

pytestmark = [pytest.mark.django_db]
NOON = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def folders(settings: LazySettings, landing: Landing) -> Landing:
    settings.LEASEBOARD_LANDING_DIR = landing.root
    settings.LEASEBOARD_DEADLETTER_DIR = landing.dead
    return landing


def batch(batch_id: int, events: int, input_rows: int | None, newest: datetime, **extra: Any) -> PipelineBatch:
    return PipelineBatch.objects.create(
        hub=HUB,
        query_id="q",
        batch_id=batch_id,
        finished_at=newest + timedelta(seconds=4),
        events=events,
        alerts=1,
        newest_enqueued=newest,
        newest_event=newest,
        write_seconds=0.5,
        input_rows=input_rows,
        duration_seconds=1.5,
        **extra,
    )


def test_the_api_reports_aggregates_alerts_lag_batches_and_bad_input(client: Client, folders: Landing) -> None:
    for minute, sensor, events, alerts in [(0, "door", 7, 2), (0, "motion", 5, 0), (2, "smoke", 1, 1)]:
        MinuteSummary.objects.create(
            hub=HUB, minute=NOON + timedelta(minutes=minute), sensor=sensor, events=events, alerts=alerts
        )
    MinuteSummary.objects.create(hub="other", minute=NOON, sensor="door", events=1000)
    Alert.objects.create(
        hub=HUB,
        partition_id="3",
        sequence_number=9,
        home="home-00007",
        kind="smoke",
        sensor="smoke",
        sensor_id="smoke-1",
        event="detected",
        event_time=NOON,
        enqueued_time=NOON,
        raised_at=NOON,
        batch_id=1,
    )
    batch(0, 10, 12, datetime.fromtimestamp(T0 + 20, UTC))
    batch(1, 3, 3, datetime.fromtimestamp(T0 + 30, UTC), unreadable_files=1)
    UnreadableFile.objects.create(hub=HUB, path="/l/1/x.parquet", error="torn", size=10, found_at=NOON, batch_id=1)
    readings = [e.to_json() for e in fleet_events(3)]
    folders.land("0", 0, readings[:2])  # enqueued at T0 + 0..1
    folders.land("1", 40, readings)  # enqueued at T0 + 40..42: the newest landed event
    folders.land("1", 43, [b"garbage"])

    response = client.get("/api/pipeline", {"hub": HUB})
    conforms_response("GET", f"/api/pipeline?hub={HUB}", response)  # as /api/schema describes it
    state = response.json()

    assert state["hub"] == HUB
    assert state["lag"] == {
        "newest_landed": T0 + 42,
        "newest_aggregated": T0 + 30,
        "seconds": 12.0,
        "partitions_landed": 2,
    }
    assert state["totals"] == {
        "events": 13,
        "alerts": 3,
        "batches": 2,
        "duplicates": 2,
        "unreadable_files": 1,
        "dead_letters": 1,
    }
    series = state["chart"]["series"]
    assert len(series) == MINUTES and series[-1]["minute"] == (NOON + timedelta(minutes=2)).timestamp()
    assert series[-3]["events"] == {"motion": 5, "door": 7, "window": 0, "glass_break": 0, "smoke": 0}
    assert (series[-3]["alerts"], series[-2]["alerts"], series[-1]["alerts"]) == (2, 0, 1)
    assert [(a["home"], a["kind"]) for a in state["alerts"]] == [("home-00007", "smoke")]
    assert [(b["batch_id"], b["duplicates"], b["latency_seconds"]) for b in state["batches"]] == [
        (0, 2, 4.0),
        (1, 0, 4.0),
    ]
    assert [u["path"] for u in state["unreadable_files"]] == ["/l/1/x.parquet"]
    [dead] = state["dead_letters"]
    assert (dead["partition_id"], dead["sequence_number"]) == ("1", 43) and "MalformedEvent" in dead["error"]
    assert "body_base64" not in dead


def test_the_api_of_a_hub_without_results_is_empty_not_an_error(client: Client, folders: Landing) -> None:
    state = client.get("/api/pipeline").json()
    assert state["chart"]["series"] == [] and state["batches"] == [] and state["alerts"] == []
    assert state["lag"]["seconds"] is None and state["totals"]["events"] == 0


def test_a_bad_hub_name_is_refused(client: Client) -> None:
    response = client.get("/api/pipeline", {"hub": "../etc"})
    assert response.status_code == 400 and "hub must be" in response.json()["error"]
    assert client.get("/pipeline/", {"hub": "../etc"}).status_code == 400


def test_the_page_loads_its_script_and_points_it_at_the_api(client: Client, folders: Landing) -> None:
    response = client.get("/pipeline/", {"hub": HUB})
    html = response.content.decode()
    assert response.status_code == 200
    assert 'data-api-url="/api/pipeline"' in html and f'data-hub="{HUB}"' in html
    assert "/static/pipeline.js" in html
    script = Path(__file__).resolve().parents[2] / "static" / "pipeline.js"
    assert "http" not in script.read_text().replace("http://www.w3.org/2000/svg", ""), "no CDN or remote URL"


def test_staff_are_not_called_read_only_on_the_page(client: Client, folders: Landing, django_user_model: Any) -> None:
    html = client.get("/pipeline/", {"hub": HUB}).content.decode()
    assert "(read-only)" not in html  # anonymous: no user shown at all
    client.force_login(django_user_model.objects.create_user("reader", password="pw-reader-1"))
    assert "reader (read-only)" in client.get("/pipeline/", {"hub": HUB}).content.decode()
    client.force_login(django_user_model.objects.create_user("operator", password="pw-operator-1", is_staff=True))
    html = client.get("/pipeline/", {"hub": HUB}).content.decode()
    assert "operator" in html and "(read-only)" not in html  # it read "operator (read-only)" before


def test_the_collector_gives_metrics_the_pipeline_figures(folders: Landing) -> None:
    MinuteSummary.objects.create(hub=HUB, minute=NOON, sensor="door", events=42, alerts=4)
    batch(0, 42, 50, NOON)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PipelineCollector(HUB))
    text = generate_latest(registry).decode()
    assert f'leaseboard_pipeline_aggregated_events_total{{hub="{HUB}"}} 42.0' in text
    assert f'leaseboard_pipeline_dropped_duplicates_total{{hub="{HUB}"}} 8.0' in text
    assert f'leaseboard_pipeline_raised_alerts_total{{hub="{HUB}"}} 4.0' in text
    assert "leaseboard_pipeline_lag_seconds" not in text  # nothing landed: no lag to report


def test_the_api_shows_the_master_and_executors_the_driver_published(
    client: Client, folders: Landing, settings: LazySettings, spark: SparkSession
) -> None:
    settings.LEASEBOARD_PIPELINE_DIR = folders.pipeline
    assert client.get("/api/pipeline", {"hub": HUB}).json()["spark"] is None  # no driver yet

    cluster.publish(folders.pipeline / HUB, cluster.describe(spark))  # what runpipeline does per batch

    spark_view = client.get("/api/pipeline", {"hub": HUB}).json()["spark"]
    assert spark_view["master"] == "local[2]" and spark_view["app_id"].startswith("local-")
    [driver] = spark_view["executors"]  # local mode: the driver runs the tasks
    assert driver["driver"] and driver["id"] == "driver" and driver["cores"] == 2 and ":" in driver["host_port"]
    html = client.get("/pipeline/", {"hub": HUB}).content.decode()
    assert 'id="executors"' in html and 'id="spark-master"' in html
