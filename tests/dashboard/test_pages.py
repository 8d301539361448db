"""The dashboard page and the admin are served; the page carries what its script needs."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_the_page_names_the_hub_and_loads_its_local_assets(client: Client) -> None:
    response = client.get("/", {"consumer_group": "analytics"})

    html = response.content.decode()
    assert response.status_code == 200
    assert 'data-hub="sensors"' in html and 'data-consumer-group="analytics"' in html
    assert 'data-state-url="/api/state"' in html and 'data-ws-path="/ws/balancer/"' in html
    assert "/static/dashboard/dashboard.js" in html and "/static/dashboard/dashboard.css" in html
    assert "http://" not in html and "https://" not in html  # nothing from a CDN


def test_the_page_refuses_a_bad_hub(client: Client) -> None:
    response = client.get("/", {"hub": "../../etc"})

    assert response.status_code == 400
    assert b"hub must be" in response.content


def test_the_admin_asks_for_a_login(client: Client) -> None:
    response = client.get("/admin/")

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_a_superuser_sees_the_admin(admin_client: Client) -> None:
    assert admin_client.get("/admin/").status_code == 200
