"""The console's pages and the admin are served; each page carries what its script needs."""

from __future__ import annotations

import pytest
from django.conf import LazySettings
from django.contrib.auth.models import User
from django.test import Client

# Outside a transaction: a page starts its hub's monitor, whose sample writes would otherwise wait
# for the test transaction's write lock while its teardown waits for them (dashboard/live/host.py).
pytestmark = pytest.mark.django_db(transaction=True)


def test_the_fleet_page_names_the_hub_and_loads_its_local_assets(client: Client, settings: LazySettings) -> None:
    settings.LEASEBOARD_CONSUMER_GROUP = "analytics"  # a group the console knows (test_security_bounded)
    response = client.get("/", {"consumer_group": "analytics"})

    html = response.content.decode()
    assert response.status_code == 200
    assert 'data-hub="sensors"' in html and 'data-consumer-group="analytics"' in html
    assert 'data-state-url="/api/state"' in html and 'data-ws-path="/ws/balancer/"' in html
    assert "/static/dashboard/live.js" in html and "/static/dashboard/fleet.js" in html
    assert "/static/dashboard/dashboard.css" in html
    assert "http://" not in html and "https://" not in html  # nothing from a CDN


@pytest.mark.parametrize(
    ("path", "script"),
    [("/partitions/7/", "partition.js"), ("/events/", "events.js"), ("/history/", "history.js")],
)
def test_every_page_is_served_with_its_script(client: Client, path: str, script: str) -> None:
    response = client.get(path)

    assert response.status_code == 200
    assert f"/static/dashboard/{script}" in response.content.decode()


def test_the_partition_page_knows_its_partition_and_refuses_a_bad_id(client: Client) -> None:
    html = client.get("/partitions/12/").content.decode()

    assert 'data-partition="12"' in html and 'data-partition-url="/api/partitions/12"' in html
    assert client.get("/partitions/x1/").status_code == 404


def test_the_page_refuses_a_bad_hub(client: Client) -> None:
    response = client.get("/", {"hub": "../../etc"})

    assert response.status_code == 400
    assert b"hub must be" in response.content


def test_the_admin_asks_for_a_login(client: Client) -> None:
    response = client.get("/admin/")

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_a_superuser_sees_the_admin_and_its_audit_log(admin_client: Client, admin_user: User) -> None:
    assert admin_client.get("/admin/").status_code == 200
    assert admin_client.get("/admin/dashboard/auditentry/").status_code == 200
    assert admin_client.get("/admin/dashboard/lagsample/").status_code == 200
