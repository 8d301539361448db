"""A healing step on a stuck partition (its reader or handler restarted: ``Balancer.healed``) is an event
of its own: in the feed under "heal", filterable, and on the partition page with its reason, without
ending the holder's tenure."""

from __future__ import annotations

import time

import pytest
from django.conf import LazySettings
from django.test import Client

from balancer.model import BalancerEvent, EventKind, HubRef
from dashboard.models import EventLog


def event(ref: HubRef, kind: EventKind, reason: str, previous: str | None) -> BalancerEvent:
    return BalancerEvent(kind, ref, "3", "w1", previous, "w1", reason, time.time())


@pytest.mark.django_db(transaction=True)  # the partition page reads on the console's database thread
def test_a_restart_is_filed_under_heal_and_shown_on_the_partition_page_within_its_tenure(
    client: Client, ref: HubRef, settings: LazySettings
) -> None:
    settings.LEASEBOARD_ANONYMOUS_READ = True
    for kind, reason, previous in [
        (EventKind.CLAIM, "never owned", None),
        (EventKind.HEAL, "restarted: reader failing 10 s", "w1"),
        (EventKind.HEAL, "restarted: handler running 300 s", "w1"),
    ]:
        EventLog.from_domain(event(ref, kind, reason, previous)).save()

    feed = client.get("/api/events", {"kind": "heal"})
    assert feed.status_code == 200, feed.content
    assert [(e["category"], e["partition_id"], e["reason"]) for e in feed.json()] == [
        ("heal", "3", "restarted: reader failing 10 s"),
        ("heal", "3", "restarted: handler running 300 s"),
    ]
    detail = client.get("/api/partitions/3")
    assert detail.status_code == 200, detail.content
    body = detail.json()
    assert [e["kind"] for e in body["events"]] == ["claim", "heal", "heal"]
    (span,) = body["timeline"]  # a heal moves nothing: still w1's one tenure, open
    assert (span["owner"], span["until"]) == ("w1", None)
    page = client.get("/events/")
    assert page.status_code == 200 and b'value="heal"' in page.content  # the feed's filter offers it


def test_an_unknown_category_is_still_refused(client: Client, settings: LazySettings) -> None:
    settings.LEASEBOARD_ANONYMOUS_READ = True
    response = client.get("/api/events", {"kind": "heal,cure"})
    assert response.status_code == 400 and b"cure" in response.content
