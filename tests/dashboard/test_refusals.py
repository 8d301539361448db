"""Refused attempts are counted, not kept as text (issue 37, item 1): anyone could write to the
operators' audit log with a cross-site form; now a refusal before an operator's action adds one to a
bounded count per kind, address and account, and ``/api/refusals`` shows addresses to staff only."""

from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client import REGISTRY

from dashboard.control import refusals
from dashboard.models import AuditEntry, Refusal
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

pytestmark = pytest.mark.django_db(transaction=True)

A = "203.0.113.7"
URGENT = "URGENT from the on-call lead: drain every worker now"


def refused(kind: str) -> float:
    return REGISTRY.get_sample_value("leaseboard_refused_attempts_total", {"kind": kind}) or 0.0


def test_a_flood_of_cross_site_posts_leaves_the_audit_log_to_the_operators(
    stores: Stores, hub: EmbeddedHub, admin_client: Client
) -> None:
    before = refused("action")
    attacker = Client(enforce_csrf_checks=True, REMOTE_ADDR=A)  # a plain <form method=post>: no session, no token
    for i in range(200):
        body = {"action": "drain", "target": f"w{i}", "reason": URGENT}
        assert attacker.post("/api/actions/apply", body).status_code == 403

    assert list(Refusal.objects.values_list("kind", "source", "user", "count")) == [("csrf", A, "", 200)]
    assert not AuditEntry.objects.exists()
    assert admin_client.get("/api/audit").json() == []
    assert refused("csrf") >= 200 and refused("action") == before
    stored = " ".join(str(v) for row in Refusal.objects.values_list() for v in row)
    assert "URGENT" not in stored and "w199" not in stored


def test_at_most_kept_counts_and_the_least_recent_go_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(refusals, "KEPT", 5)
    for i in range(8):
        refusals.count("login", f"198.51.100.{i}")
    refusals.count("login", "198.51.100.7")

    kept = sorted(Refusal.objects.values_list("source", "count"))
    assert kept == [(f"198.51.100.{i}", 2 if i == 7 else 1) for i in range(3, 8)]


def test_the_api_shows_addresses_and_accounts_to_staff_only(
    stores: Stores, hub: EmbeddedHub, client: Client, admin_client: Client
) -> None:
    refusals.count("lockout", A, "admin")
    refusals.count("lockout", A, "admin")

    anonymous = client.get("/api/refusals").json()
    staff = admin_client.get("/api/refusals").json()

    assert anonymous["totals"]["lockout"] == 2 and staff["totals"]["lockout"] == 2
    assert [(c["kind"], c["source"], c["user"], c["count"]) for c in anonymous["counts"]] == [
        ("lockout", None, None, 2)
    ]
    assert [(c["kind"], c["source"], c["user"], c["count"]) for c in staff["counts"]] == [("lockout", A, "admin", 2)]
    assert client.get("/api/refusals?limit=0").status_code == 400


def test_a_login_form_posted_without_its_token_is_counted(stores: Stores, hub: EmbeddedHub) -> None:
    browser = Client(enforce_csrf_checks=True, REMOTE_ADDR=A)

    assert browser.post("/login/", {"username": "ops", "password": "x"}).status_code == 403

    assert list(Refusal.objects.values_list("kind", "source", "user", "count")) == [("csrf", A, "", 1)]
