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
from dashboard.control.registry import REGISTRY
from dashboard.models import AuditEntry, Refusal
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
    assert preview.json()["strategy"] == "cooperative" and preview.json()["strategy_source"] == "default"
    assert {(m["partition_id"], m["before"], m["after"]) for m in preview.json()["moves"]} == {
        ("0", "w1", "w2"),
        ("1", "w1", "w2"),
    }
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

    assert (unknown.status_code, unknown.json()["code"]) == (400, "unknown_worker")
    assert (owned.status_code, owned.json()["code"]) == (409, "owned")
    assert "owned by w1" in owned.json()["error"]
    assert (bad.status_code, bad.json()["code"]) == (400, "bad_request")


async def test_an_unknown_worker_or_partition_or_a_bad_position_is_a_400_that_says_what_is_wrong(fleet: Stores) -> None:
    client = await logged_in()
    asked: dict[str, dict[str, Any]] = {
        "pin to an unknown worker": {"action": "pin", "target": "0", "value": "w9"},
        "pin an unknown partition": {"action": "pin", "target": "99", "value": "w1"},
        "unpin a partition that is no id": {"action": "unpin", "target": "abc"},
        "purge nobody": {"action": "purge", "target": ""},
        "reset to no position": {"action": "resetcheckpoint", "target": "0", "value": "yesterday", "force": True},
        "reset to nowhere": {"action": "resetcheckpoint", "target": "0", "value": ""},
    }

    answers = {what: await post(client, "/api/actions/preview", body) for what, body in asked.items()}

    assert {what: (r.status_code, r.json()["code"]) for what, r in answers.items()} == {
        "pin to an unknown worker": (400, "unknown_worker"),
        "pin an unknown partition": (400, "unknown_partition"),
        "unpin a partition that is no id": (400, "unknown_partition"),
        "purge nobody": (400, "bad_request"),
        "reset to no position": (400, "bad_request"),
        "reset to nowhere": (400, "bad_request"),
    }
    assert answers["pin to an unknown worker"].json()["error"] == "unknown worker 'w9'; known workers: w1, w2"
    assert "the hub's partitions are 0..3" in answers["pin an unknown partition"].json()["error"]


async def test_every_registered_action_is_served_and_offered_by_the_page(fleet: Stores) -> None:
    client = await logged_in()
    page = (await client.get("/")).content.decode()
    opening = '<script id="action-catalogue" type="application/json">'
    catalogue = json.loads(page.split(opening)[1].split("</script>")[0])

    assert [a["name"] for a in catalogue] == list(REGISTRY)
    for name, action in REGISTRY.items():
        response = await post(client, "/api/actions/preview", {"action": name, "target": "", "reason": "x"})
        # no target: refused for that, by the action's own argument check, never as an unknown action
        assert response.status_code in (200, 400, 409), (name, response.content)
        assert "unknown action" not in response.json().get("error", ""), name
        if action.target is not None:
            assert (response.status_code, response.json()["code"]) == (400, "bad_request"), name
    scraped = (await client.get("/metrics")).content.decode()
    for name in REGISTRY:  # counted from the start, so a rate over it is defined before the first use
        assert f'leaseboard_admin_actions_total{{action="{name}",outcome="applied"}}' in scraped, name


async def test_anonymous_and_non_staff_users_cannot_act(fleet: Stores, ref: HubRef) -> None:
    anonymous = AsyncClient()
    viewer = await logged_in(staff=False)

    for client in (anonymous, viewer):  # the viewer sends a valid CSRF token: only the staff check stops it
        for path in ("/api/actions/preview", "/api/actions/apply"):
            response = await post(client, path, {**DRAIN, "confirmed": True})
            assert response.status_code == 403, (path, response.content)
            assert response.json() == {"error": "a staff login is needed for this action", "code": "forbidden"}
    assert await fleet.controls.list_controls(ref) == []
    kept = await database_sync_to_async(lambda: list(AuditEntry.objects.values_list("outcome", "action")))()
    assert kept == []  # no operator acted: each refused attempt is counted instead (control/refusals.py)
    counted = await database_sync_to_async(lambda: sorted(Refusal.objects.values_list("kind", "user", "count")))()
    assert counted == [("action", "", 2), ("action", "viewer", 2)]


async def test_a_referer_from_another_site_is_refused_even_over_plain_http(fleet: Stores, ref: HubRef) -> None:
    client = await logged_in()
    token = {"X-CSRFToken": client.cookies["csrftoken"].value}

    def send(referer: str) -> Any:
        headers = {**token, "Referer": referer}
        return client.post("/api/actions/preview", json.dumps(DRAIN), content_type="application/json", headers=headers)

    forged = await send("http://attacker.example/page")
    ours = await send("http://testserver/")

    assert (forged.status_code, forged.json()["code"]) == (403, "csrf")
    assert ours.status_code == 200, ours.content
    counted = await database_sync_to_async(lambda: sorted(Refusal.objects.values_list("kind", "user", "count")))()
    assert counted == [("csrf", "ops", 1)]


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
