"""``/api/partitions/<id>/events`` on a real embedded hub: the shape the OpenAPI document gives,
positions by sequence number, offset and time, newest first by default, paging by cursor without a gap
or a repeat, the bounds on count and bytes, bad input refused with a 400 that says why, a hub that
cannot be read a 503, the read rule and bodies for staff only, and no lease taken, no checkpoint moved."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import LazySettings
from django.contrib.auth.models import User
from django.test import AsyncClient, Client

from balancer.model import Checkpoint, HubRef, OwnershipRecord
from dashboard.web.eventbrowser import READ_BUDGET
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

from .api_document import conforms, conforms_response
from .conftest import timed_events
from .dead import with_properties

pytestmark = pytest.mark.django_db

URL = "/api/partitions/{}/events"


def staff(client: Client) -> Client:
    User.objects.create_user("ops", password="pw", is_staff=True)
    client.login(username="ops", password="pw")
    return client


def read(client: Client, query: str = "", partition: str = "1", status: int = 200) -> Any:
    url = URL.format(partition) + query
    response = client.get(url)
    conforms_response("GET", url, response)
    assert response.status_code == status, response.content
    return response.json()


def sequences(page: Any) -> list[int]:
    return [e["sequence_number"] for e in page["events"]]


def fill(hub: EmbeddedHub, count: int, partition: str = "1") -> None:
    hub.send_batch([f'{{"n": {i}}}'.encode() for i in range(count)], partition_id=partition, partition_key="home-7")


def test_the_newest_events_come_first_with_their_bodies_properties_and_system_properties(
    client: Client, hub: EmbeddedHub
) -> None:
    fill(hub, 25)
    amqp = [with_properties(b'{"door": "open"}', {"Diagnostic-Id": "00-ab"}), b"", b""]
    hub.send_batch([b'{"door": "open"}', "café".encode(), b"\x00\xff"], partition_id="1", amqp=amqp)

    page = read(staff(client), "?hub=sensors")

    assert sequences(page) == list(range(27, 7, -1))  # 20 by default, newest first
    assert (page["order"], page["position"], page["count"], page["source"]) == ("newest", "newest", 20, "embedded")
    assert (page["older"], page["newer"], page["first_sequence_number"], page["last_sequence_number"]) == (
        8,
        None,
        0,
        27,
    )
    binary, text, door = page["events"][:3]
    assert door["body"] == {"encoding": "json", "value": {"door": "open"}, "size": 16, "truncated": False}
    assert door["properties"] == {"Diagnostic-Id": "00-ab"} and door["partition_key"] is None
    assert (text["body"]["encoding"], text["body"]["value"]) == ("text", "café")
    assert (binary["body"]["encoding"], binary["body"]["value"]) == ("hex", "00ff")
    oldest = page["events"][-1]
    assert (oldest["partition_id"], oldest["partition_key"], oldest["properties"]) == ("1", "home-7", {})
    assert oldest["enqueued_time"] > 0 and oldest["offset"].isdigit() and page["bodies_shown"] is True
    assert page["bytes_read"] == sum(e["body"]["size"] for e in page["events"]) + len(amqp[0])


def test_older_and_newer_pages_cover_every_event_once(client: Client, hub: EmbeddedHub) -> None:
    fill(hub, 23)
    seen: list[int] = []
    page = read(client, "?count=5")
    while True:
        seen += sequences(page)
        if page["older"] is None:
            break
        page = read(client, f"?count=5&before={page['older']}")
    assert seen == list(range(22, -1, -1))

    forward: list[int] = []
    page = read(client, "?from=earliest&count=7&order=oldest")
    while True:
        forward += sequences(page)
        if page["newer"] is None:
            break
        page = read(client, f"?after={page['newer']}&count=7&order=oldest")
    assert forward == list(range(23))
    assert sequences(read(client, "?after=22")) == [] and sequences(read(client, "?before=0")) == []


def test_a_page_starts_at_a_sequence_number_an_offset_or_a_time(
    settings: LazySettings, client: Client, hub: EmbeddedHub, ref: HubRef
) -> None:
    fill(hub, 15)
    assert sequences(read(client, "?from=sequence:5&count=3")) == [7, 6, 5]
    assert sequences(read(client, "?from=sequence:5&count=3&order=oldest")) == [5, 6, 7]
    assert sequences(read(client, "?from=sequence:13&count=5&order=oldest")) == [13, 14]
    assert sequences(read(client, "?from=sequence:15")) == []  # just past the end: nothing yet
    offset = read(client, "?from=sequence:9&count=1")["events"][0]["offset"]
    assert sequences(read(client, f"?from=offset:{offset}&count=2&order=oldest")) == [9, 10]

    timed_events(settings, ref, "2", [1000.0, 1010.0, 1020.0, 1030.0])
    assert sequences(read(client, "?from=time:1970-01-01T00:16:50Z&order=oldest", "2")) == [1, 2, 3]
    assert sequences(read(client, "?from=time:1970-01-01T00:16:51&order=oldest", "2")) == [2, 3]  # no zone: UTC
    assert sequences(read(client, "?from=time:2000-01-01T00:00:00%2B00:00", "2")) == []


def test_a_page_is_bounded_in_count_and_in_bytes(client: Client, hub: EmbeddedHub) -> None:
    fill(hub, 120)
    assert len(read(client, "?count=100")["events"]) == 100
    assert "count must be between 1 and 100" in read(client, "?count=101", status=400)["error"]
    big = 900_000
    hub.send_batch([bytes([65 + i]) * big for i in range(8)], partition_id="3")

    page = read(client, "?from=earliest&count=8&order=oldest", "3")

    assert sequences(page) == [0, 1, 2, 3, 4]  # 4.5 MB read: the fifth crossed the bound, the last read
    assert page["cut"] is True and page["newer"] == 4 and READ_BUDGET <= page["bytes_read"] < READ_BUDGET + big
    rest = read(client, "?after=4&count=8&order=oldest", "3")
    assert sequences(rest) == [5, 6, 7] and rest["cut"] is False

    newest = read(client, "?count=8", "3")  # cut too, and still the newest: read again from later on
    assert sequences(newest) == [7, 6, 5, 4, 3] and newest["cut"] is True
    assert (newest["older"], newest["newer"]) == (3, None)
    assert sequences(read(client, "?before=3&count=8", "3")) == [2, 1, 0]


@pytest.mark.parametrize(
    ("query", "partition", "says"),
    [
        ("?from=sequence:abc", "1", "from=sequence: needs a whole number"),
        ("?from=sequence:-1", "1", "from=sequence: needs a whole number"),
        ("?from=sequence:99", "1", "partition 1 has no event 99: it holds 0..4"),
        ("?from=offset:1", "1", "no event starts at offset 1"),
        # Found by the schema fuzz: the embedded hub's reader failed on it (a 503, "int too large").
        ("?from=offset:22722771471421283253", "1", "from=offset: needs a whole number of at most"),
        ("?from=sequence:9223372036854775808", "1", "from=sequence: needs a whole number of at most"),
        ("?from=time:yesterday", "1", "from=time: needs an ISO 8601 time"),
        ("?from=somewhere", "1", "from must be newest, earliest, sequence:N, offset:X or time:<ISO 8601>"),
        ("?from=newest&before=3", "1", "give one of from, before and after, not from and before"),
        ("?before=x", "1", "before must be a sequence number"),
        ("?after=99999999999999999999", "1", "after must be a sequence number"),
        ("?order=sideways", "1", "order must be newest or oldest"),
        ("?count=0", "1", "count must be between 1 and 100"),
        ("", "9", "hub 'sensors' has no partition '9'"),
        ("", "01", "partition id must be a decimal string"),
    ],
)
def test_bad_input_is_a_400_that_says_what_is_wrong(
    client: Client, hub: EmbeddedHub, query: str, partition: str, says: str
) -> None:
    fill(hub, 5)
    assert says in read(client, query, partition, status=400)["error"]


def test_a_hub_that_cannot_be_read_is_a_503_not_a_500(
    settings: LazySettings, client: Client, hub: EmbeddedHub, tmp_path: Any
) -> None:
    fill(hub, 3)
    hub.refuse("1")  # the drill: every read of partition 1 fails, as a link that keeps failing
    try:
        response = client.get(URL.format("1"))
    finally:
        hub.admit("1")
    conforms("GET", URL.format("1"), response.status_code, response["Content-Type"], response.content)
    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert response.json()["error"].startswith("event source unavailable: ReadRefused: the hub refused the read")
    assert sequences(read(client)) == [2, 1, 0]  # and again once it answers

    settings.LEASEBOARD_HUB_DIR = tmp_path / "nowhere"  # no such hub: nothing is created by looking
    gone = client.get(URL.format("1"))
    assert gone.status_code == 503 and "embedded hub 'sensors' cannot be opened" in gone.json()["error"]
    assert not (tmp_path / "nowhere").exists()


def test_readers_follow_the_read_rule_and_see_bodies_only_when_the_setting_says(
    settings: LazySettings, client: Client, hub: EmbeddedHub
) -> None:
    hub.send(b'{"pin": 1234}', partition_id="1", partition_key="home-7")
    viewer = Client()
    User.objects.create_user("viewer", password="pw")
    viewer.login(username="viewer", password="pw")
    for reader in (client, viewer):  # anonymous, and logged in without staff
        page = read(reader)
        (event,) = page["events"]
        assert event["body"] is None and page["bodies_shown"] is False
        assert (event["sequence_number"], event["partition_key"]) == (0, "home-7")

    settings.LEASEBOARD_EVENT_BODIES = "readers"
    assert read(client)["events"][0]["body"]["value"] == {"pin": 1234}

    settings.LEASEBOARD_ANONYMOUS_READ = False
    refused = client.get(URL.format("1"))
    assert refused.status_code == 401 and "log in" in refused.json()["error"]
    assert read(viewer)["events"][0]["body"]["value"] == {"pin": 1234}


@pytest.mark.django_db(transaction=True)
async def test_browsing_takes_no_lease_and_moves_no_checkpoint(hub: EmbeddedHub, stores: Stores, ref: HubRef) -> None:
    hub.send_batch([b"{}"] * 30, partition_id="1")
    (owned,) = await stores.ownership.claim_ownership([OwnershipRecord(ref, "1", "w1")])
    await stores.checkpoints.update_checkpoint(Checkpoint(ref, "1", 4, "0"), "w1")
    ownership_before = await stores.ownership.list_ownership(ref)
    checkpoints_before = await stores.checkpoints.list_checkpoints(ref)

    client = AsyncClient()
    for query in ("", "?from=earliest&count=100", "?from=sequence:3", "?before=10"):
        response = await client.get(URL.format("1") + query)
        assert response.status_code == 200, response.content

    assert await stores.ownership.list_ownership(ref) == ownership_before
    assert await stores.checkpoints.list_checkpoints(ref) == checkpoints_before
    assert [r.owner_id for r in ownership_before if r.partition_id == "1"] == ["w1"] and owned.etag
