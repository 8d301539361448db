"""A handoff is a typed field of the event log, not a reason prefix: written from the event, read by
the feed's category and its filter, and filled in for rows logged before the field existed."""

from __future__ import annotations

import time

import pytest
from django.conf import LazySettings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from balancer.model import BalancerEvent, EventKind, HubRef
from dashboard.models import EventLog

REF = HubRef("handoff.example", "sensors", "$Default")


def release(reason: str, handoff: bool, ref: HubRef = REF) -> BalancerEvent:
    return BalancerEvent(EventKind.RELEASE, ref, "0", None, "w1", "w1", reason, time.time(), handoff)


@pytest.mark.django_db
def test_the_row_and_its_json_carry_the_handoff_and_file_it_under_handoff() -> None:
    planned = EventLog.from_domain(release("handed off", handoff=True))
    planned.save()
    stopping = EventLog.from_domain(release("shutting down", handoff=False))
    stopping.save()

    assert (planned.as_json()["handoff"], planned.as_json()["category"]) == (True, "handoff")
    assert (stopping.as_json()["handoff"], stopping.as_json()["category"]) == (False, "release")
    assert release("handed off", handoff=True).as_json()["handoff"] is True
    assert release("handed off", handoff=True).as_json()["kind"] == "release"  # the kind stays "release"


@pytest.mark.django_db
def test_the_feed_filters_handoffs_and_other_releases_by_the_field(
    client: Client, ref: HubRef, settings: LazySettings
) -> None:
    settings.LEASEBOARD_ANONYMOUS_READ = True
    for reason, handoff in [("handed off", True), ("shutting down", False), ("lost the race to w2", True)]:
        EventLog.from_domain(release(reason, handoff, ref)).save()

    def reasons(kind: str) -> list[str]:
        response = client.get("/api/events", {"kind": kind})
        assert response.status_code == 200, response.content
        return [e["reason"] for e in response.json()]

    assert reasons("handoff") == ["handed off", "lost the race to w2"]
    assert reasons("release") == ["shutting down"]
    assert reasons("release,handoff") == ["handed off", "shutting down", "lost the race to w2"]


@pytest.mark.django_db(transaction=True)
def test_the_migration_marks_old_releases_handed_off_by_their_reason() -> None:
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("dashboard")
    executor.migrate([("dashboard", "0002_console")])
    try:
        old = executor.loader.project_state([("dashboard", "0002_console")]).apps.get_model("dashboard", "EventLog")
        scope = {"namespace": REF.namespace, "hub": REF.hub, "consumer_group": REF.consumer_group}
        for kind, reason in [("release", "handed off"), ("release", "shutting down"), ("claim", "handed off?")]:
            old.objects.create(**scope, kind=kind, partition_id="0", reporter="w1", reason=reason, at=1.0)
        executor = MigrationExecutor(connection)
        executor.migrate([("dashboard", "0003_eventlog_handoff")])
        rows = EventLog.objects.order_by("id").values_list("kind", "reason", "handoff")
        assert list(rows) == [
            ("release", "handed off", True),
            ("release", "shutting down", False),
            ("claim", "handed off?", False),
        ]
    finally:
        MigrationExecutor(connection).migrate(latest)
