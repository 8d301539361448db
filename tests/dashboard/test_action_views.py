"""The actions over HTTP: staff login and CSRF required, preview before apply, refusals with their codes;
and who may read the console when anonymous reading is off."""

from __future__ import annotations

import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.conf import LazySettings
from django.contrib.auth.models import User
from django.test import AsyncClient

from balancer.model import ControlKind, HubRef, Member, OwnershipRecord
from dashboard.models import AuditEntry
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

pytestmark = pytest.mark.django_db(transaction=True)


async def user(name: str, staff: bool) -> User:
    created: User = await database_sync_to_async(User.objects.create_user)(name, password="pw", is_staff=staff)
    return created


async def logged_in(staff: bool = True) -> AsyncClient:
    """A client that enforces CSRF like a browser, logged in, with the CSRF cookie the pages set."""
    client = AsyncClient(enforce_csrf_checks=True)
    await client.aforce_login(await user("ops" if staff else "viewer", staff))
    page = await client.get("/")
    assert page.status_code == 200
    return client


async def post(client: AsyncClient, path: str, body: dict[str, Any], csrf: bool = True) -> Any:
    headers = {"X-CSRFToken": client.cookies["csrftoken"].value} if csrf and "csrftoken" in client.cookies else {}
    return await client.post(path, json.dumps(body), content_type="application/json", headers=headers)


@pytest.fixture
async def fleet(stores: Stores, hub: EmbeddedHub, ref: HubRef) -> Stores:
    for worker, partitions in {"w1": ["0", "1"], "w2": ["2", "3"]}.items():
        await stores.controls.heartbeat(Member(ref, worker, 0.0))
        await stores.ownership.claim_ownership([OwnershipRecord(ref, p, worker) for p in partitions])
    return stores


DRAIN = {"action": "drain", "target": "w1", "reason": "deploy"}


async def test_staff_previews_then_applies_a_drain(fleet: Stores, ref: HubRef) -> None:
    client = await logged_in()

    preview = await post(client, "/api/actions/preview", DRAIN)
    assert fleet is not None and await fleet.controls.list_controls(ref) == []
    applied = await post(client, "/api/actions/apply", {**DRAIN, "confirmed": True})

    assert preview.status_code == 200, preview.content
    assert {(m["partition_id"], m["before"], m["after"]) for m in preview.json()["moves"]} == {
        ("0", "w1", "w2"), ("1", "w1", "w2"),
    }  # fmt: skip
    assert applied.status_code == 200 and applied.json()["user"] == "ops" and applied.json()["outcome"] == "applied"
    assert [(c.kind, c.target) for c in await fleet.controls.list_controls(ref)] == [(ControlKind.DRAIN, "w1")]
    audit = (await client.get("/api/audit")).json()
    assert [(e["action"], e["target"], e["reason"]) for e in audit] == [("drain", "w1", "deploy")]


async def test_apply_without_the_confirmation_changes_nothing(fleet: Stores, ref: HubRef) -> None:
    client = await logged_in()

    response = await post(client, "/api/actions/apply", DRAIN)

    assert response.status_code == 400 and response.json()["code"] == "unconfirmed"
    assert await fleet.controls.list_controls(ref) == []


async def test_refusals_come_back_with_a_code_and_a_sentence(fleet: Stores) -> None:
    client = await logged_in()

    unknown = await post(client, "/api/actions/preview", {"action": "drain", "target": "w9", "reason": "x"})
    owned = await post(client, "/api/actions/preview", {"action": "resetcheckpoint", "target": "0", "value": "latest"})
    bad = await post(client, "/api/actions/preview", {"action": "explode"})

    assert (unknown.status_code, unknown.json()["code"]) == (404, "unknown_worker")
    assert (owned.status_code, owned.json()["code"]) == (409, "owned")
    assert "owned by w1" in owned.json()["error"]
    assert (bad.status_code, bad.json()["code"]) == (400, "bad_request")


async def test_anonymous_and_non_staff_users_cannot_act(fleet: Stores, ref: HubRef) -> None:
    anonymous = AsyncClient()
    viewer = await logged_in(staff=False)

    for client in (anonymous, viewer):  # the viewer sends a valid CSRF token: only the staff check stops it
        for path in ("/api/actions/preview", "/api/actions/apply"):
            response = await post(client, path, {**DRAIN, "confirmed": True})
            assert response.status_code == 403, (path, response.content)
            assert response.json() == {"error": "a staff login is needed for this action", "code": "forbidden"}
    assert await fleet.controls.list_controls(ref) == []
    assert await database_sync_to_async(AuditEntry.objects.count)() == 0


async def test_a_post_without_the_csrf_token_is_refused(fleet: Stores, ref: HubRef) -> None:
    client = await logged_in()

    response = await post(client, "/api/actions/apply", {**DRAIN, "confirmed": True}, csrf=False)

    assert response.status_code == 403 and b"CSRF" in response.content
    assert await fleet.controls.list_controls(ref) == []


async def test_the_page_offers_actions_to_staff_only(fleet: Stores) -> None:
    staff = await logged_in()
    viewer = await logged_in(staff=False)
    anonymous = AsyncClient()

    for_staff = (await staff.get("/")).content.decode()
    for_viewer = (await viewer.get("/")).content.decode()
    for_anonymous = (await anonymous.get("/")).content.decode()

    assert 'id="action-dialog"' in for_staff and "actions.js" in for_staff and 'data-can-act="true"' in for_staff
    for html in (for_viewer, for_anonymous):
        assert 'id="action-dialog"' not in html and "actions.js" not in html and 'data-can-act="false"' in html
    assert 'id="login"' in for_anonymous and "log out" in for_viewer


async def test_with_anonymous_reading_off_pages_ask_for_a_login_and_the_api_refuses(
    settings: LazySettings, fleet: Stores
) -> None:
    settings.LEASEBOARD_ANONYMOUS_READ = False
    anonymous = AsyncClient()

    page = await anonymous.get("/events/")
    state = await anonymous.get("/api/state")
    metrics = await anonymous.get("/metrics")
    viewer = await logged_in(staff=False)
    allowed = await viewer.get("/api/state")

    assert page.status_code == 302 and page["Location"] == "/login/?next=%2Fevents%2F"
    assert state.status_code == 401 and "log in" in state.json()["error"]
    assert metrics.status_code == 200  # Prometheus scrapes without a login
    assert allowed.status_code == 200


async def test_a_non_staff_user_logs_in_on_the_console_and_reads_it(settings: LazySettings, fleet: Stores) -> None:
    settings.LEASEBOARD_ANONYMOUS_READ = False
    await user("reader", staff=False)
    client = AsyncClient()

    form = await client.get("/login/", {"next": "/history/"})
    logged = await client.post("/login/", {"username": "reader", "password": "pw", "next": "/history/"})
    page = await client.get("/history/")

    assert form.status_code == 200 and b'name="password"' in form.content
    assert logged.status_code == 302 and logged["Location"] == "/history/"
    assert page.status_code == 200 and b'data-can-act="false"' in page.content
