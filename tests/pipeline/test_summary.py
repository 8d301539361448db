"""The batch summary in the database: minute counts added to what earlier batches wrote, exactly once
per batch, on SQLite and PostgreSQL alike (the addition is one SQL upsert, written for both)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from workers.models import MinuteSummary
from workers.pipeline import summary

NOON = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LATER = NOON + timedelta(minutes=1)
DATABASES = ["default", "postgres"]


def result(batch_id: int, minutes: list[tuple[datetime, str, int, int]], hub: str = "sensors") -> summary.BatchResult:
    return summary.BatchResult(
        hub=hub,
        query_id=f"query of {hub}",
        batch_id=batch_id,
        finished_at=LATER + timedelta(minutes=5),
        events=sum(m[2] for m in minutes),
        newest_enqueued=None,
        newest_event=None,
        oldest_enqueued=None,
        write_seconds=0.1,
        minutes=minutes,
    )


def minutes_in(using: str, hub: str = "sensors") -> dict[tuple[datetime, str], tuple[int, int]]:
    rows = MinuteSummary.objects.using(using).filter(hub=hub)
    return {(r.minute, r.sensor): (r.events, r.alerts) for r in rows}


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.parametrize("using", DATABASES)
def test_a_batch_adds_its_minute_counts_to_the_rows_earlier_batches_wrote(using: str) -> None:
    assert summary.apply(result(0, [(NOON, "door", 5, 1), (NOON, "smoke", 2, 2)]), using)
    # The same minute twice in one batch's rows, a row already there, a new one, another hub.
    second = [(NOON, "door", 3, 0), (NOON, "door", 1, 1), (LATER, "door", 4, 0)]
    assert summary.apply(result(1, second), using)
    assert summary.apply(result(0, [(NOON, "door", 7, 0)], hub="other"), using)

    assert minutes_in(using) == {(NOON, "door"): (9, 2), (NOON, "smoke"): (2, 2), (LATER, "door"): (4, 0)}
    assert minutes_in(using, "other") == {(NOON, "door"): (7, 0)}


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.parametrize("using", DATABASES)
def test_a_batch_applied_again_adds_nothing(using: str) -> None:
    assert summary.apply(result(0, [(NOON, "door", 5, 1)]), using)
    assert not summary.apply(result(0, [(NOON, "door", 5, 1)]), using)
    assert minutes_in(using) == {(NOON, "door"): (5, 1)}


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.parametrize("using", DATABASES)
def test_more_minute_rows_than_one_statement_takes_are_all_added(using: str) -> None:
    many = [(NOON + timedelta(minutes=n), sensor, n + 1, n % 2) for n in range(300) for sensor in ("door", "smoke")]
    assert summary.apply(result(0, many), using)
    assert summary.apply(result(1, many), using)
    expected = {(m, s): (2 * e, 2 * a) for m, s, e, a in many}
    assert minutes_in(using) == expected
