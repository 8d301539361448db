"""One read rule for every door: each URL pattern and websocket route, walked, refuses anonymous
visitors when anonymous reading is off (a new page cannot forget), and what readers who are not
staff see of the audit log and of dead letters is trimmed."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import LazySettings
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from dashboard.asgi import application
from dashboard.models import AuditEntry
from dashboard.web.access import HIDDEN_USER, OPEN, is_open
from dashboard.web.routing import websocket_urlpatterns
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

pytestmark = pytest.mark.django_db(transaction=True)

# A value for each URL parameter the patterns name (the admin's included).
SAMPLES = {
    "partition_id": "0",
    "id": "1",
    "app_label": "dashboard",
    "object_id": "1",
    "content_type_id": "1",
    "url": "x/",
}


def _walk(patterns: list[Any], prefix: str = "", namespace: str = "") -> Iterator[tuple[str, str | None, list[str]]]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            inner = f"{namespace}:{entry.namespace}".strip(":") if entry.namespace else namespace
            yield from _walk(entry.url_patterns, prefix + str(entry.pattern), inner)
        elif isinstance(entry, URLPattern):
            name = f"{namespace}:{entry.name}".strip(":") if entry.name else None
            yield prefix + str(entry.pattern), name, list(entry.pattern.regex.groupindex)


def example_paths() -> list[tuple[str, str]]:
    """(pattern, a path it matches) for every URL pattern of the project."""
    found = []
    for pattern, name, params in _walk(get_resolver().url_patterns):
        kwargs = {p: SAMPLES[p] for p in params}
        if name is not None:
            path = reverse(name, kwargs=kwargs)
        else:  # the admin's catch-all: any path under it
            assert pattern.startswith("admin/"), f"an unnamed URL pattern: {pattern}"
            path = "/admin/x/"
        found.append((pattern, path))
    return found


PATHS = example_paths()


def test_the_walk_finds_every_console_door() -> None:
    walked = {path for _, path in PATHS}
    for door in (
        "/",
        "/events/",
        "/history/",
        "/groups/",
        "/pipeline/",
        "/api/pipeline",
        "/deadletters/",
        "/api/deadletters",
        "/api/state",
        "/api/groups",
        "/api/events",
        "/api/partitions/0",
        "/api/history",
        "/api/audit",
        "/api/actions/preview",
        "/api/actions/apply",
        "/api/schema",
        "/metrics",
        "/partitions/0/",
    ):
        assert door in walked, door
    assert len(PATHS) > 30  # the admin's patterns are walked too


@pytest.mark.parametrize(("pattern", "path"), PATHS, ids=[p for p, _ in PATHS])
def test_anonymous_visitors_get_a_login_redirect_or_401_at_every_door(
    settings: LazySettings, client: Client, stores: Stores, hub: EmbeddedHub, pattern: str, path: str
) -> None:
    settings.LEASEBOARD_ANONYMOUS_READ = False
    for method in (client.get, client.post):
        response = method(path)
        if path.startswith("/admin/") and path not in ("/admin/login/", "/admin/logout/"):
            # The admin's own staff login (an open door by its own rule).
            assert response.status_code in (302, 405), (method, path, response.status_code)
            if response.status_code == 302:
                assert response["Location"].startswith("/admin/login/"), path
        elif is_open(path):
            assert response.status_code != 500, path
            assert path in ("/login/", "/logout/", "/admin/login/", "/admin/logout/", "/metrics"), f"{path}: {OPEN}"
        elif path.startswith("/api/"):
            assert response.status_code == 401, (method, path, response.status_code)
            assert "log in" in response.json()["error"]
        else:
            assert response.status_code == 302, (method, path, response.status_code)
            assert response["Location"].startswith("/login/?next="), path


def test_the_open_doors_are_few_and_each_says_why() -> None:
    assert set(OPEN) == {"/login/", "/logout/", "/admin/", "/static/", "/metrics"}
    assert all(len(reason) > 10 for reason in OPEN.values())


@pytest.mark.parametrize("route", [str(p.pattern) for p in websocket_urlpatterns])
async def test_anonymous_sockets_are_closed_with_4401_on_every_route(settings: LazySettings, route: str) -> None:
    settings.LEASEBOARD_ANONYMOUS_READ = False
    socket = WebsocketCommunicator(application, "/" + route, headers=[(b"origin", b"http://127.0.0.1:8000")])
    connected, _ = await socket.connect()
    assert connected
    message = await socket.receive_json_from(timeout=5)
    closed = await socket.receive_output(timeout=5)

    assert message["type"] == "error" and "log in" in message["error"]
    assert closed == {"type": "websocket.close", "code": 4401}


def audit_entry(ref: Any, user: str) -> None:
    AuditEntry.objects.create(
        namespace=ref.namespace,
        hub=ref.hub,
        consumer_group=ref.consumer_group,
        at=1.0,
        user=user,
        action="drain",
        target="w1",
        reason="maintenance",
        outcome=AuditEntry.APPLIED,
    )


def test_user_names_in_the_audit_log_are_for_staff_only(client: Client, stores: Stores, hub: EmbeddedHub) -> None:
    from dashboard.live.state import parse_ref

    audit_entry(parse_ref(None, None), "alice")
    anonymous = client.get("/api/audit").json()
    User.objects.create_user("viewer", password="x")
    client.login(username="viewer", password="x")
    viewer = client.get("/api/audit").json()
    User.objects.create_user("ops", password="x", is_staff=True)
    client.login(username="ops", password="x")
    staff = client.get("/api/audit").json()

    assert [e["user"] for e in anonymous] == [HIDDEN_USER] == [e["user"] for e in viewer]
    assert [e["user"] for e in staff] == ["alice"]
    assert anonymous[0]["action"] == "drain" and anonymous[0]["reason"] == "maintenance"


def test_dead_letter_texts_are_for_staff_only(
    settings: LazySettings, client: Client, stores: Stores, hub: EmbeddedHub, tmp_path: Path
) -> None:
    settings.LEASEBOARD_DEADLETTER_DIR = tmp_path
    (tmp_path / "sensors").mkdir()
    letter = {
        "partition_id": "0",
        "sequence_number": 7,
        "error": "ValueError: bad body {'pin': 1234}",
        "set_aside_at": 1.0,
        "body_base64": "eyJwaW4iOiAxMjM0fQ==",
    }
    (tmp_path / "sensors" / "0.jsonl").write_text(json.dumps(letter) + "\n")

    anonymous = client.get("/api/pipeline?hub=sensors").json()["dead_letters"]
    User.objects.create_user("ops", password="x", is_staff=True)
    client.login(username="ops", password="x")
    staff = client.get("/api/pipeline?hub=sensors").json()["dead_letters"]

    assert anonymous[0]["sequence_number"] == 7 and "1234" not in json.dumps(anonymous)
    assert re.match(r"ValueError \(the text is shown to staff only", anonymous[0]["error"])
    assert staff[0]["error"] == letter["error"] and "body_base64" not in staff[0]


def test_who_applied_an_operator_action_is_for_staff_only(client: Client, stores: Stores, hub: EmbeddedHub) -> None:
    from dashboard.live.state import parse_ref
    from dashboard.models import EventLog

    ref = parse_ref(None, None)
    EventLog.objects.create(
        namespace=ref.namespace,
        hub=ref.hub,
        consumer_group=ref.consumer_group,
        kind="drain",
        partition_id="",
        owner_id="w1",
        previous_owner="",
        reporter="dashboard:alice",
        reason="drain: maintenance",
        at=1.0,
    )
    EventLog.objects.create(
        namespace=ref.namespace,
        hub=ref.hub,
        consumer_group=ref.consumer_group,
        kind="claim",
        partition_id="0",
        owner_id="w2",
        previous_owner="w1",
        reporter="w2",
        reason="handed off",
        at=2.0,
    )
    anonymous = [client.get("/api/events").json(), client.get("/api/history").json()]
    User.objects.create_user("ops", password="x", is_staff=True)
    client.login(username="ops", password="x")
    staff = [client.get("/api/events").json(), client.get("/api/history").json()]

    assert "alice" not in json.dumps(anonymous) and anonymous[0][0]["reporter"] == "dashboard"
    assert staff[0][0]["reporter"] == "dashboard:alice" and staff[1]["episodes"]
