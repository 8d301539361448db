"""Alerts raised by the landing the moment their file is durable (``workers.alerts``), beside the
Spark pipeline's: the same alerts, each once, whichever path raises it first; the fast copy may be
lost (a full queue, a database that is down) and the pipeline's is not."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import SparkSession

from workers import alerts, metrics
from workers.models import Alert, CountedRange
from workers.pipeline import transforms
from workers.sensors import SENSORS

from .conftest import HUB, Landing, fleet_events
from .helpers import alerts_in_db, alerts_in_parquet, batches, expected_alerts, run_once
from .test_job import land_with_redeliveries

NOON = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
DATABASES = ["default", "postgres"]


def row(sequence_number: int, partition_id: str = "0", kind: str = alerts.SMOKE) -> dict[str, object]:
    return {
        "partition_id": partition_id,
        "sequence_number": sequence_number,
        "home": "home-00001",
        "kind": kind,
        "sensor": "smoke",
        "sensor_id": "smoke-1",
        "event": "detected",
        "event_time": NOON,
        "enqueued_time": NOON + timedelta(seconds=1),
    }


def test_the_landing_and_spark_raise_the_same_alert_for_every_sensor_event_and_armed_state(
    spark: SparkSession,
) -> None:
    readings = [
        (sensor, event, armed)
        for sensor, (_, _, events) in SENSORS.items()
        for event, armed in itertools.product((*events, "unknown"), (False, True))
    ]
    frame = spark.createDataFrame(readings, "sensor string, event string, armed boolean")
    kinds = frame.select(transforms.alert_kind(frame["sensor"], frame["event"], frame["armed"]).alias("k")).collect()
    assert [alerts.kind_of(*reading) for reading in readings] == [r["k"] for r in kinds]
    assert {k for k in (r["k"] for r in kinds) if k} == set(alerts.ALERT_KINDS)


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.parametrize("using", DATABASES)
def test_an_alert_is_inserted_once_and_only_new_ones_are_reported(using: str) -> None:
    raised = metrics.ALERTS_RAISED.labels("landing")._value.get()
    first = alerts.insert(HUB, [row(1), row(2)], raised_by="landing", raised_at=NOON, using=using)
    assert [r["sequence_number"] for r in first] == [1, 2]
    again = alerts.insert(HUB, [row(2), row(3)], raised_by="pipeline", raised_at=NOON, batch_id=7, using=using)
    assert [r["sequence_number"] for r in again] == [3], "the alert already raised is not reported again"
    kept = {a.sequence_number: (a.raised_by, a.batch_id) for a in Alert.objects.using(using).filter(hub=HUB)}
    assert kept == {1: ("landing", None), 2: ("landing", None), 3: ("pipeline", 7)}, "the first copy stays"
    assert alerts.insert("other", [row(1)], raised_by="landing", raised_at=NOON, using=using), "per hub"
    assert metrics.ALERTS_RAISED.labels("landing")._value.get() - raised == 3


def count(intervals: list[tuple[int, int]], using: str = "default", partition_id: str = "0") -> None:
    """Record ``intervals`` as what the pipeline counted of ``partition_id``."""
    CountedRange.objects.using(using).update_or_create(
        hub=HUB, partition_id=partition_id, defaults={"intervals": json.dumps(intervals), "batch_id": 0}
    )


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.parametrize("using", DATABASES)
def test_the_table_keeps_the_most_recently_raised_alerts_and_every_one_the_pipeline_may_raise_again(
    using: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(alerts, "ALERTS_KEPT", 5)
    monkeypatch.setattr(alerts, "UNCOUNTED_KEPT", 7)
    alerts.insert(HUB, [row(n) for n in range(10)], raised_by="landing", raised_at=NOON, using=using)
    count([(0, 1)], using)  # the pipeline is behind: it counted 0 and 1 only
    assert alerts.trim(HUB, using) == 3, "0 and 1, and 2 past the 7 kept at most"
    assert sorted(Alert.objects.using(using).values_list("sequence_number", flat=True)) == list(range(3, 10))
    count([(0, 9)], using)
    assert alerts.trim(HUB, using) == 2
    assert sorted(Alert.objects.using(using).values_list("sequence_number", flat=True)) == [5, 6, 7, 8, 9]
    again = alerts.insert(HUB, [row(3), row(4)], raised_by="pipeline", raised_at=NOON, using=using)
    assert [r["sequence_number"] for r in again] == [3, 4], "trimmed after counting: the pipeline never raises them"


@pytest.mark.django_db(transaction=True)
def test_the_landing_raises_no_alert_of_an_event_the_pipeline_counted() -> None:
    count([(0, 4)], partition_id="1")
    writer = alerts.AlertWriter(wake=False)
    writer.submit(HUB, [row(3, "1"), row(5, "1"), row(3, "2")])  # landed again after a checkpoint reset
    assert writer.flush(10)
    assert sorted(Alert.objects.values_list("partition_id", "sequence_number")) == [("1", 5), ("2", 3)]


@pytest.mark.django_db(transaction=True)
def test_the_writer_inserts_what_the_landing_submits_and_drops_what_it_cannot_write() -> None:
    writer = alerts.AlertWriter(max_queued=3, wake=False)
    assert writer.submit(HUB, [row(1), row(2)])
    dropped = metrics.LANDING_ALERTS_DROPPED.labels("queue full")._value.get()
    writer.submit(HUB, [row(3), row(4)])  # accepted or dropped, depending on how far the writer got
    assert writer.flush(10)
    kept = set(Alert.objects.filter(hub=HUB).values_list("sequence_number", flat=True))
    lost = metrics.LANDING_ALERTS_DROPPED.labels("queue full")._value.get() - dropped
    assert kept in ({1, 2, 3, 4}, {1, 2}) and lost == 4 - len(kept)

    failed = metrics.LANDING_ALERTS_DROPPED.labels("database error")._value.get()
    broken = alerts.AlertWriter(using="no-such-database", wake=False)
    assert broken.submit(HUB, [row(5)])
    assert broken.flush(10)
    assert metrics.LANDING_ALERTS_DROPPED.labels("database error")._value.get() - failed == 1
    assert writer.submit(HUB, [row(6)]) and writer.flush(10)
    assert 6 in set(Alert.objects.filter(hub=HUB).values_list("sequence_number", flat=True)), "the writer goes on"


@pytest.mark.django_db(transaction=True)
def test_landed_alerts_are_raised_at_once_and_the_pipeline_then_raises_the_same_ones_not_again(
    spark: SparkSession, landing: Landing
) -> None:
    landing.alerts = writer = alerts.AlertWriter(wake=False)
    keyed = land_with_redeliveries(landing, fleet_events(600, seed=5))
    assert writer.flush(10)
    expected = expected_alerts(keyed)
    assert len(expected) > 10, "the seed raised too few alerts to prove anything"
    assert sorted(alerts_in_db()) == sorted(expected.items()), "every alert at once, each once"

    run_once(spark, landing.paths)

    assert sorted(alerts_in_db()) == sorted(expected.items()), "the pipeline raised none again"
    assert set(Alert.objects.filter(hub=HUB).values_list("raised_by", flat=True)) == {"landing"}
    assert sorted(alerts_in_parquet(spark, landing.paths)) == sorted(expected.items()), "both paths agree"
    [batch] = batches()
    assert batch.alerts == len(expected), "the minute figures count every alert, whoever raised it"


@pytest.mark.django_db(transaction=True)
def test_alerts_the_landing_could_not_raise_are_raised_by_the_pipeline(spark: SparkSession, landing: Landing) -> None:
    readings = fleet_events(600, seed=6)
    landing.alerts = writer = alerts.AlertWriter(wake=False)
    half = len(readings) // 2
    landing.land("0", 0, [e.to_json() for e in readings[:half]])
    assert writer.flush(10)
    landing.alerts = False  # the rest as if the worker died before its writer wrote them
    landing.land("0", half, [e.to_json() for e in readings[half:]])
    keyed = {("0", s): e for s, e in enumerate(readings)}

    run_once(spark, landing.paths)

    expected = expected_alerts(keyed)
    assert sorted(alerts_in_db()) == sorted(expected.items())
    by = dict(Alert.objects.filter(hub=HUB).values_list("sequence_number", "raised_by"))
    assert {by[s] for (_, s) in expected if s < half} == {"landing"}
    assert {by[s] for (_, s) in expected if s >= half} == {"pipeline"}
