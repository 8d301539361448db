"""The landing stays small: the file source archives the files of committed batches (``cleanSource``),
and ``runpipeline --reset`` puts the archive back so that the new query counts every event again."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.conf import LazySettings
from django.core.management import call_command
from pyspark.sql import SparkSession

from .conftest import HUB, Landing, fleet_events
from .helpers import batches, expected_minutes, minutes_in_db, run_once

# The slowest Spark test outside the cluster suite (40 s under load): `make check` leaves it to `make test`.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def names(folder: Path) -> list[str]:
    return sorted(f"{p.parent.name}/{p.name[:20].lstrip('0') or '0'}" for p in folder.rglob("*.parquet"))


def test_read_files_leave_the_landing_for_the_archive_and_reset_puts_them_back(
    spark: SparkSession, landing: Landing, settings: LazySettings
) -> None:
    readings = fleet_events(400, seed=23)
    bodies = [e.to_json() for e in readings]
    paths = landing.paths
    landing.land("0", 0, bodies[:100])
    landing.land("1", 0, bodies[100:200])
    run_once(spark, paths)
    landing.land("0", 100, bodies[200:300])
    run_once(spark, paths)
    landing.land("1", 100, bodies[300:400])
    landing.land("1", 150, bodies[350:400])  # landed twice: the archive keeps both, the count once
    run_once(spark, paths)

    # A batch's files are archived when the next batch starts: the landing holds the last batch only.
    assert names(paths.landing) == ["1/100", "1/150"]
    assert names(paths.archive) == ["0/0", "0/100", "1/0"]
    mirror = paths.archive / paths.landing.relative_to("/")  # each file keeps its whole path under the archive
    assert all(p.is_relative_to(mirror) for p in paths.archive.rglob("*.parquet"))
    assert [b.events for b in batches()] == [200, 100, 100]
    assert minutes_in_db() == expected_minutes(readings)
    archived = next(paths.archive.rglob("*.parquet"))
    assert paths.located(Path("/") / archived.relative_to(paths.archive)) == archived

    settings.LEASEBOARD_LANDING_DIR = landing.root
    settings.LEASEBOARD_PIPELINE_DIR = landing.pipeline
    out = io.StringIO()
    call_command("runpipeline", "--hub", HUB, "--master", "local[2]", "--once", "--reset", stdout=out)

    assert "3 archived landing files put back" in out.getvalue()
    assert minutes_in_db() == expected_minutes(readings)  # everything counted again by the new query, once
    assert [b.events for b in batches()] == [400]
