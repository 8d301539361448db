"""No name reaches a 500: names are matched whole, overlong ones and traversal under /static/ are refused."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote

import pytest
from asgiref.testing import ApplicationCommunicator
from django.test import Client

from dashboard import asgi
from dashboard.live.state import parse_ref
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

pytestmark = pytest.mark.django_db(transaction=True)

PIPELINE = ("/pipeline/", "/api/pipeline")
PAGES = ["/", "/events/", "/history/", "/pipeline/", "/api/pipeline", "/api/state", "/api/events", "/api/history"]


@pytest.mark.parametrize("name", ["sensors\n", "sensors\r\n", "a" * 256, "a" * 4000, "x\x00y"])
def test_parse_ref_refuses_trailing_newlines_and_overlong_names(name: str) -> None:
    with pytest.raises(ValueError):
        parse_ref(name, None)
    with pytest.raises(ValueError):
        parse_ref(None, name)


def test_parse_ref_takes_a_255_character_name_and_the_default_group() -> None:
    assert parse_ref("a" * 255, "$Default").hub == "a" * 255
    assert parse_ref("sensors", "c" * 255).consumer_group == "c" * 255


# The pipeline pages take only a hub: no consumer group to try there.
FIELDS = [(p, f) for p in PAGES for f in ("hub", "consumer_group") if not (p in PIPELINE and f == "consumer_group")]


@pytest.mark.parametrize(("path", "field"), FIELDS)
@pytest.mark.parametrize("name", ["sensors\n", "a" * 256, "b" * 5000])
def test_bad_names_in_queries_get_400(
    client: Client, stores: Stores, hub: EmbeddedHub, path: str, field: str, name: str
) -> None:
    response = client.get(f"{path}?{field}={quote(name)}")

    assert response.status_code == 400, (path, response.status_code)


def test_a_255_character_hub_name_is_not_a_500(client: Client, stores: Stores, hub: EmbeddedHub) -> None:
    response = client.get(f"/api/pipeline?hub={'a' * 255}")

    assert response.status_code == 200
    assert response.json()["hub"] == "a" * 255


@pytest.mark.parametrize("partition", ["9" * 300, "0%0A", "0%0D%0A", "..%2f..%2fsettings.py", "%ff"])
def test_odd_partition_ids_are_not_a_500(client: Client, stores: Stores, hub: EmbeddedHub, partition: str) -> None:
    for prefix in ("/api/partitions/", "/partitions/"):
        response = client.get(f"{prefix}{partition}" + ("/" if prefix == "/partitions/" else ""))
        assert response.status_code in (400, 404), (prefix, response.status_code)


async def static_get(raw: bytes) -> int:
    """Status of a GET through the static handler of dashboard.asgi, as Daphne hands it (path decoded)."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": unquote(raw.decode("ascii")),  # what Daphne does
        "raw_path": raw,
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    app = ApplicationCommunicator(asgi.StaticFiles(asgi.django_asgi_app), scope)
    await app.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await app.receive_output(timeout=10)
    await app.wait(timeout=10)
    assert start["type"] == "http.response.start"
    return int(start["status"])


@pytest.mark.parametrize(
    "raw",
    [
        b"/static/..%2f..%2fsettings.py",
        b"/static/%2e%2e/",
        b"/static/%2e%2e/%2e%2e/dashboard/settings.py",
        b"/static/../../../etc/passwd",
        b"/static/a%00b.css",
        b"/static/" + b"a" * 5000 + b".css",
        b"/static/%ff%fe.css",
    ],
)
async def test_traversal_and_odd_bytes_under_static_get_404(raw: bytes) -> None:
    assert await static_get(raw) == 404


async def test_real_static_files_are_still_served() -> None:
    assert await static_get(b"/static/dashboard/dashboard.css") == 200
    assert await static_get(b"/static/dashboard/missing.css") == 404
    assert asgi.serve_static is False or isinstance(asgi.http_app, asgi.StaticFiles)


@pytest.mark.parametrize("path", ["/", "/events/", "/login/", "/admin/", "/api/state", "/pipeline/"])
def test_more_query_fields_than_django_parses_are_a_400_everywhere_even_with_debug_on(
    settings: Any, client: Client, stores: Stores, hub: EmbeddedHub, path: str
) -> None:
    settings.DEBUG = True  # the demo's default, where Django's error page used to answer 500
    query = "&".join(f"f{i}=1" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 10))

    response = client.get(f"{path}?{query}")

    assert response.status_code == 400, (path, response.status_code)
    assert "too many query parameters" in response.content.decode()
