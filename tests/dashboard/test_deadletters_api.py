"""``/api/deadletters`` and ``/deadletters/``: the shape the OpenAPI document gives, bodies decoded as
JSON, text or hex, paged by a cursor within bounds, bad parameters refused, and bodies and error
texts for staff only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import LazySettings
from django.contrib.auth.models import User
from django.test import Client

from balancer.model import HubRef
from workers.hub.embedded import EmbeddedHub

from .api_document import conforms_response
from .dead import set_aside, with_properties

pytestmark = pytest.mark.django_db


@pytest.fixture
def folder(settings: LazySettings, tmp_path: Path) -> Path:
    settings.LEASEBOARD_DEADLETTER_DIR = tmp_path / "dead"
    return tmp_path / "dead"


def staff(client: Client) -> Client:
    User.objects.create_user("ops", password="pw", is_staff=True)
    client.login(username="ops", password="pw")
    return client


def read(client: Client, query: str = "") -> Any:
    url = f"/api/deadletters{query}"
    response = client.get(url)
    conforms_response("GET", url, response)
    assert response.status_code == 200, response.content
    return response.json()


def test_staff_see_each_dead_letter_with_its_body_decoded_and_its_properties(
    settings: LazySettings, client: Client, hub: EmbeddedHub, ref: HubRef, folder: Path
) -> None:
    bodies = [b'{"door": "open"}', "café au lait".encode(), b"\x00\xff\x10"]
    amqp = [with_properties(bodies[0], {"Diagnostic-Id": "00-ab-cd-01"}), b"", b""]
    set_aside(settings, ref, hub, bodies, partition="2", amqp=amqp)

    found = read(staff(client), "?hub=sensors")

    assert (found["hub"], found["consumer_group"], found["partition"], found["next"]) == (
        "sensors",
        "$Default",
        None,
        None,
    )
    assert found["partitions"] == ["2"] and found["limit"] == 50 and found["bytes_read"] > 0
    first, text, binary = found["entries"]
    assert (first["partition_id"], first["sequence_number"], first["offset"]) == ("2", 0, "0")
    assert first["body"] == {"encoding": "json", "value": {"door": "open"}, "size": 16, "truncated": False}
    assert first["properties"] == {"Diagnostic-Id": "00-ab-cd-01"} and first["partition_key"] == "home-7"
    assert first["error"] == 'ValueError: cannot handle b\'{"door": "op\'' and first["attempts"] == 3
    assert first["enqueued_time"] > 0 and first["set_aside_at"] > 0 and first["replayed"] is None
    assert (text["body"]["encoding"], text["body"]["value"]) == ("text", "café au lait")
    assert (binary["body"]["encoding"], binary["body"]["value"]) == ("hex", "00ff10")
    assert all("body_base64" not in e and "amqp_base64" not in e for e in found["entries"])


def test_readers_who_are_not_staff_see_no_body_and_no_error_text(
    settings: LazySettings, client: Client, hub: EmbeddedHub, ref: HubRef, folder: Path
) -> None:
    set_aside(settings, ref, hub, [b'{"pin": 1234}'])
    viewer = Client()
    User.objects.create_user("viewer", password="pw")
    viewer.login(username="viewer", password="pw")

    for reader in (client, viewer):
        (entry,) = read(reader)["entries"]
        assert entry["sequence_number"] == 0 and entry["body"] is None
        assert entry["error"].startswith("ValueError (the text is shown to staff only")
        assert "1234" not in str(entry)


def test_pages_follow_the_cursor_until_there_is_no_next(
    settings: LazySettings, client: Client, hub: EmbeddedHub, ref: HubRef, folder: Path
) -> None:
    for partition in ("0", "3"):
        set_aside(settings, ref, hub, [b"{}"] * 4, partition=partition)
    other = HubRef(ref.namespace, ref.hub, "other")
    set_aside(settings, other, hub, [b"{}"], partition="3")

    seen: list[tuple[str, int]] = []
    query = "?limit=3"
    while True:
        page = read(client, query)
        assert len(page["entries"]) <= 3
        seen += [(e["partition_id"], e["sequence_number"]) for e in page["entries"]]
        if page["next"] is None:
            break
        query = f"?limit=3&after={page['next']}"
    one = read(client, "?partition=3&limit=200")
    theirs = read(client, "?consumer_group=other")

    assert seen == [("0", n) for n in range(4)] + [("3", n) for n in range(4)]
    assert [e["sequence_number"] for e in one["entries"]] == [0, 1, 2, 3] and one["partition"] == "3"
    assert [(e["partition_id"], e["sequence_number"]) for e in theirs["entries"]] == [("3", 4)]
    assert len(read(client, "?partition=3&after=0:999")["entries"]) == 4  # a cursor before the partition: all of it
    assert read(client, "?partition=0&after=3:0")["entries"] == []  # after it: none


@pytest.mark.parametrize(
    "query",
    [
        "?partition=x",
        "?partition=01",
        "?limit=0",
        "?limit=201",
        "?limit=many",
        "?after=zz",
        "?after=0:-1",
        "?hub=bad/name",
        "?consumer_group=-x",
    ],
)
def test_bad_parameters_are_a_400_saying_what_is_wrong(client: Client, folder: Path, query: str) -> None:
    url = f"/api/deadletters{query}"
    response = client.get(url)

    conforms_response("GET", url, response)
    assert response.status_code == 400 and response.json()["error"]


def test_no_dead_letter_folder_is_an_empty_list(client: Client, folder: Path) -> None:
    found = read(client, "?hub=never-seen")

    assert found["entries"] == [] and found["next"] is None and found["partitions"] == []


def test_the_page_is_in_the_navigation_and_the_pipeline_links_its_count_to_it(
    client: Client, folder: Path, hub: EmbeddedHub
) -> None:
    page = client.get("/deadletters/?hub=sensors&partition=2")
    pipeline = client.get("/pipeline/?hub=sensors")

    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-deadletters-url="/api/deadletters"' in html and 'data-deadletters-partition="2"' in html
    assert 'aria-current="page">Dead letters</a>' in html and "deadletters.js" in html
    assert 'id="replay-selected"' not in html  # no action for a reader who is not staff
    assert 'id="total-dead" href="/deadletters/?hub=sensors' in pipeline.content.decode()
    assert client.get("/deadletters/?partition=x").status_code == 400
