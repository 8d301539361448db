"""No input reaches a 500 (issue 37, item 4), anonymous or staff: a JSON body nested past Python's
recursion limit, a lone surrogate (``"\\ud800"``, which no database can store as UTF-8) in an action's
fields, NUL in a query (PostgreSQL refuses it in any string), a target longer than its column
(PostgreSQL's ``DataError``), and a nested websocket frame. Each is a 400 (or the 403 of an
anonymous attempt) with an error that says what was wrong. The checks are on the input, so SQLite
proves them for PostgreSQL too; ``test_schema_fuzz`` runs the whole API against both."""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client

from dashboard.asgi import application
from dashboard.models import AuditEntry
from dashboard.web import access, consumers
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

from .test_security_frames import ORIGIN, answer

pytestmark = pytest.mark.django_db(transaction=True)

NESTED = "[" * 100_000 + "]" * 100_000  # past the recursion limit of json.loads
ACTIONS = ("/api/actions/preview", "/api/actions/apply")


def post(client: Client, path: str, body: str) -> Any:
    return client.post(path, data=body, content_type="application/json")


@pytest.mark.parametrize("path", ACTIONS)
@pytest.mark.parametrize("who", ["anonymous", "staff"])
def test_a_body_nested_too_deep_is_refused_not_a_500(
    client: Client, admin_client: Client, stores: Stores, hub: EmbeddedHub, path: str, who: str
) -> None:
    response = post(admin_client if who == "staff" else client, path, '{"action": "drain", "x": ' + NESTED + "}")

    assert response.status_code == (400 if who == "staff" else 403), response.content[:300]
    if who == "staff":
        assert "nested" in response.json()["error"]


SURROGATE = "\\ud800"  # as JSON writes it: json.loads gives a lone surrogate


@pytest.mark.parametrize("field", ["reason", "target", "value", "hub", "consumer_group", "action"])
@pytest.mark.parametrize("who", ["anonymous", "staff"])
def test_a_lone_surrogate_in_any_field_is_refused_not_a_500(
    client: Client, admin_client: Client, stores: Stores, hub: EmbeddedHub, field: str, who: str
) -> None:
    fields = {"action": "drain", "target": "w1", "reason": "deploy", "value": ""}
    body = json.dumps(fields)[:-1] + f', "{field}": "x{SURROGATE}y"}}'

    response = post(admin_client if who == "staff" else client, "/api/actions/preview", body)

    assert response.status_code == (400 if who == "staff" else 403), response.content[:300]
    for entry in AuditEntry.objects.all():  # whatever was kept of the attempt can be read back
        json.dumps([entry.user, entry.action, entry.target, entry.value, entry.reason, entry.message]).encode()


@pytest.mark.parametrize(
    "query",
    ["/api/events?worker=a%00b", "/api/events?partition=0%00", "/api/audit?target=%00", "/api/state?x%00=1"],
)
@pytest.mark.parametrize("who", ["anonymous", "staff"])
def test_nul_in_a_query_is_a_400(
    client: Client, admin_client: Client, stores: Stores, hub: EmbeddedHub, query: str, who: str
) -> None:
    response = (admin_client if who == "staff" else client).get(query)

    assert response.status_code == 400, (query, response.status_code)
    assert "NUL" in response.json()["error"]


@pytest.mark.parametrize("field", ["target", "value"])
def test_a_target_longer_than_its_column_is_a_400(
    admin_client: Client, stores: Stores, hub: EmbeddedHub, field: str
) -> None:
    body = json.dumps({"action": "drain", "target": "w1", "reason": "deploy", field: "w" * 256})

    response = post(admin_client, "/api/actions/preview", body)

    assert response.status_code == 400
    assert "255" in response.json()["error"]


def test_a_reason_of_a_thousand_characters_is_still_taken(
    admin_client: Client, stores: Stores, hub: EmbeddedHub
) -> None:
    body = json.dumps({"action": "rebalance", "reason": "r" * 1000})

    response = post(admin_client, "/api/actions/preview", body)

    assert response.status_code == 200, response.content[:300]


async def test_a_websocket_frame_nested_too_deep_is_answered_not_closed_with_1011(
    stores: Stores, hub: EmbeddedHub
) -> None:
    ws = WebsocketCommunicator(application, "/ws/balancer/", headers=ORIGIN)
    connected, _ = await ws.connect(timeout=10)
    assert connected
    try:
        await ws.send_to(text_data="[" * 2000 + "]" * 2000)
        reply = await answer(ws)
    finally:
        await ws.disconnect()
    # Python 3.11 and 3.12's json give up on it (RecursionError: "frames must be JSON text"); 3.13
    # parses it (its C recursion limit is higher), and the read-only refusal answers it. Never a 1011.
    assert reply.get("type") == "error" and reply.get("code") in ("bad_frame", "read_only"), reply


def test_every_close_code_the_console_sends_is_one_daphne_sends() -> None:
    """Daphne (autobahn) sends 1000 or 3000-4999 only; any other code became 1011 and a traceback."""
    codes = {
        name: value
        for module in (consumers, access)
        for name, value in vars(module).items()
        if name.startswith("CLOSE_")
    }
    source = inspect.getsource(consumers)
    codes.update({f"literal {m}": int(m) for m in re.findall(r"close\(code=(\d+)", source)})

    assert codes and all(code == 1000 or 3000 <= code <= 4999 for code in codes.values()), codes
