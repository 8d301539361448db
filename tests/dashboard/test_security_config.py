"""docker-compose.yml sets only variables something reads; websockets match the origin's scheme, host and port."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from channels.testing import WebsocketCommunicator
from django.conf import LazySettings

from dashboard.asgi import application
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

ROOT = Path(__file__).resolve().parents[2]
READERS = [ROOT / "dashboard", ROOT / "workers", ROOT / "balancer", ROOT / "manage.py"]
READ = re.compile(
    r"""(?:env(?:str|int|float|bool)|os\.environ\.get|os\.getenv|os\.environ\.setdefault|os\.environ\[)"""
    r"""\(?\s*["']([A-Z][A-Z0-9_]*)["']"""
)
# Read by the programs of other images, not by ours.
OTHER_PROGRAMS = {
    "POSTGRES_DB": "the postgres image creates this database on first start",
    "POSTGRES_USER": "the postgres image creates this user on first start",
    "POSTGRES_PASSWORD": "the postgres image sets this user's password on first start",
    "GF_SECURITY_ADMIN_PASSWORD": "Grafana's admin password (the grafana image maps GF_* to its ini)",
    "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH": "Grafana's home dashboard (the grafana image maps GF_* to its ini)",
    "PROMETHEUS_MULTIPROC_DIR": "prometheus_client's multi-process mode (the workers read it too)",
    "SPARK_HOME": "Spark's scripts (spark-class) find the installed pyspark package through it",
    "SPARK_NO_DAEMONIZE": "Spark's start scripts keep the master and workers in the foreground (a container's process)",
    "SPARK_WORKER_DIR": "Spark's workers keep their application folders there, not in the package",
}


def read_names() -> set[str]:
    names: set[str] = set()
    for place in READERS:
        for path in [place] if place.is_file() else place.rglob("*.py"):
            names |= set(READ.findall(path.read_text(encoding="utf-8")))
    return names


def compose_environment() -> dict[str, set[str]]:
    """Every service's environment variable names (anchors and merge keys resolved)."""
    document: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    found: dict[str, set[str]] = {}
    for name, service in document["services"].items():
        environment = service.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(item.partition("=")[::2] for item in environment)
        found[name] = set(environment)
    return found


def test_the_settings_read_what_production_reads() -> None:
    read = read_names()
    assert {"LEASEBOARD_SSL_REDIRECT", "DJANGO_SECRET_KEY", "DATABASE_URL", "REDIS_URL"} <= read
    assert "DJANGO_SECURE_SSL_REDIRECT" not in read


def test_every_variable_compose_sets_is_read() -> None:
    read = read_names()
    environments = compose_environment()
    assert environments["dashboard"], "the dashboard service sets no environment"
    unread = {(service, var) for service, names in environments.items() for var in names}
    unread = {(service, var) for service, var in unread if var not in read and var not in OTHER_PROGRAMS}

    assert not unread, f"set in docker-compose.yml but read by nothing: {sorted(unread)}"
    assert "LEASEBOARD_SSL_REDIRECT" in environments["dashboard"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("origin", "accepted"),
    [
        (b"http://localhost:8000", True),
        (b"http://LOCALHOST:8000", True),
        (b"http://localhost:9999", False),
        (b"http://localhost", False),
        (b"https://localhost:8000", False),
        (b"http://127.0.0.1:8000", False),
        (b"null", False),
        (b"http://evil.example:8000", False),
    ],
)
async def test_the_origin_must_match_scheme_host_and_port(
    stores: Stores, hub: EmbeddedHub, settings: LazySettings, origin: bytes, accepted: bool
) -> None:
    assert await connects([(b"host", b"localhost:8000"), (b"origin", origin)]) is accepted, origin


@pytest.mark.django_db(transaction=True)
async def test_a_trusted_origin_and_a_tls_proxy_are_accepted(
    stores: Stores, hub: EmbeddedHub, settings: LazySettings
) -> None:
    settings.CSRF_TRUSTED_ORIGINS = ["https://localhost:8443"]
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    host, proxied = (b"host", b"localhost:8000"), (b"x-forwarded-proto", b"https")
    for headers, accepted in (
        ([host, (b"origin", b"https://localhost:8443")], True),
        ([host, proxied, (b"origin", b"https://localhost:8000")], True),
        ([host, (b"origin", b"https://localhost:8000")], False),
        ([host, (b"origin", b"http://localhost:8443")], False),
    ):
        assert await connects(headers) is accepted, headers


async def connects(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the balancer websocket accepts a connection with ``headers``."""
    communicator = WebsocketCommunicator(application, "/ws/balancer/", headers=headers)
    connected, _ = await communicator.connect(timeout=10)
    await communicator.disconnect()
    return bool(connected)
