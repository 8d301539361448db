"""``manage.py runpipeline --once`` in this process (on the session's SparkSession)."""

from __future__ import annotations

import io
import shutil

import pytest
from django.conf import LazySettings
from django.core.management import CommandError, call_command
from pyspark.sql import SparkSession

from workers.models import CountedRange
from workers.pipeline import summary

from .conftest import HUB, Landing, fleet_events
from .helpers import batches, expected_minutes, minutes_in_db

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def configured(settings: LazySettings, landing: Landing) -> Landing:
    settings.LEASEBOARD_LANDING_DIR = landing.root
    settings.LEASEBOARD_PIPELINE_DIR = landing.pipeline
    settings.LEASEBOARD_DEADLETTER_DIR = landing.dead
    return landing


def runpipeline(*args: str) -> str:
    out = io.StringIO()
    call_command("runpipeline", "--hub", HUB, "--master", "local[2]", *args, stdout=out)
    return out.getvalue()


def test_once_processes_what_is_landed_and_says_what_it_did(spark: SparkSession, configured: Landing) -> None:
    readings = fleet_events(200, seed=17)
    bodies = [e.to_json() for e in readings]
    configured.land("0", 0, bodies[:120])
    configured.land("0", 100, bodies[100:])  # 20 landed twice

    output = runpipeline("--once")

    assert "1 batches: 200 events (20 duplicates dropped)" in output, output
    assert minutes_in_db() == expected_minutes(readings)
    assert (configured.paths.checkpoint / "commits" / "0").exists()


def test_a_summary_without_its_checkpoint_is_refused_until_reset(spark: SparkSession, configured: Landing) -> None:
    readings = fleet_events(100, seed=19)
    configured.land("0", 0, [e.to_json() for e in readings])
    runpipeline("--once")
    shutil.rmtree(configured.paths.checkpoint)  # lost: a fresh query would count every file again

    with pytest.raises(CommandError, match="--reset"):
        runpipeline("--once")
    assert "reset: deleted the checkpoint" in runpipeline("--once", "--reset")

    assert minutes_in_db() == expected_minutes(readings)  # counted once, not twice
    assert [b.batch_id for b in batches()] == [0]


def test_a_summary_without_counted_ranges_is_refused_until_reset(spark: SparkSession, configured: Landing) -> None:
    readings = fleet_events(100, seed=29)
    configured.land("0", 0, [e.to_json() for e in readings])
    runpipeline("--once")
    CountedRange.objects.filter(hub=HUB).delete()  # as a summary written before the ranges existed

    with pytest.raises(CommandError, match="no counted ranges"):
        runpipeline("--once")
    runpipeline("--once", "--reset")

    assert minutes_in_db() == expected_minutes(readings)
    assert summary.counted_ranges(HUB) == {"0": [(0, 99)]}
