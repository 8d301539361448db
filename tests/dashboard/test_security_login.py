"""Logins throttled (django-axes) and counted with every refused action attempt, off the audit log
(``control/refusals.py``); a Content-Security-Policy with no inline script or style; a CSRF cookie
scripts cannot read."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.conf import LazySettings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import User
from django.db.models import F
from django.test import Client

from dashboard.models import AuditEntry, Refusal
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

pytestmark = pytest.mark.django_db(transaction=True)

A, B = "203.0.113.7", "198.51.100.9"
DRAIN = {"action": "drain", "target": "w1", "reason": "try"}


@pytest.fixture
def staff() -> User:
    return User.objects.create_user("ops", password="right-password-123", is_staff=True)


def login(path: str, password: str, address: str, username: str = "ops") -> int:
    client = Client(REMOTE_ADDR=address)
    response = client.post(path, {"username": username, "password": password})
    return response.status_code


def counted() -> list[tuple[str, str, str, int]]:
    return sorted(Refusal.objects.values_list("kind", "source", "user", "count"))


@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_a_few_wrong_passwords_lock_the_user_out_from_that_address_until_the_cool_off(
    settings: LazySettings, staff: User, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    limit = settings.AXES_FAILURE_LIMIT
    assert [login(path, f"wrong-{i}", A) for i in range(limit)] == [200] * (limit - 1) + [429]

    assert login(path, "right-password-123", A) == 429  # the right password, too late
    assert login(path, "right-password-123", B) == 302  # the same user from another address
    # The last wrong password is the one that locks: counted as a lockout, as is each refusal after it.
    assert counted() == [("lockout", A, "ops", 2), ("login", A, "ops", limit - 1)]
    assert not AuditEntry.objects.exists()  # the audit log is what operators did
    assert "right-password-123" not in caplog.text and "wrong-0" not in caplog.text
    assert "refused lockout attempt from 203.0.113.7 for 'ops'" in caplog.text

    # The cool-off passes (the attempts' times moved back by it): the right password works again.
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))
    assert login(path, "right-password-123", A) == 302


def test_a_right_password_resets_the_count(settings: LazySettings, staff: User) -> None:
    limit = settings.AXES_FAILURE_LIMIT
    for _ in range(limit - 1):
        assert login("/login/", "wrong", A) == 200
    assert login("/login/", "right-password-123", A) == 302
    assert login("/login/", "wrong", A) == 200  # counting starts again


def test_a_wrong_password_for_no_account_keeps_nothing_the_sender_typed(staff: User) -> None:
    for i in range(3):
        assert login("/login/", "x", A, username=f"URGENT from the on-call lead: drain every worker now {i}") == 200

    assert counted() == [("login", A, "", 3)]


def test_refused_action_attempts_are_counted_not_kept(settings: LazySettings, stores: Stores, hub: EmbeddedHub) -> None:
    User.objects.create_user("viewer", password="x")
    viewer = Client(enforce_csrf_checks=True, REMOTE_ADDR=A)
    viewer.login(username="viewer", password="x")
    viewer.get("/")
    token = viewer.cookies["csrftoken"].value
    not_staff = viewer.post("/api/actions/apply", DRAIN, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    no_token = viewer.post("/api/actions/apply", DRAIN, content_type="application/json")
    settings.LEASEBOARD_ANONYMOUS_READ = False
    anonymous = Client(REMOTE_ADDR=B).post("/api/actions/preview", {**DRAIN, "action": "no-such-action"})

    assert (not_staff.status_code, no_token.status_code, anonymous.status_code) == (403, 403, 401)
    assert no_token.json()["code"] == "csrf"
    assert not AuditEntry.objects.exists()
    assert counted() == [("action", B, "", 1), ("action", A, "viewer", 1), ("csrf", A, "viewer", 1)]


def test_every_page_has_a_policy_that_allows_no_inline_script_and_carries_none(
    client: Client, stores: Stores, hub: EmbeddedHub
) -> None:
    for path in ("/", "/events/", "/history/", "/partitions/0/", "/pipeline/", "/login/"):
        response = client.get(path)
        assert response.status_code == 200, path
        policy = response["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "style-src 'self'" in policy, policy
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        html = response.content.decode()
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), path  # every script is a file
        assert not re.search(r"<style\b|\son[a-z]+=|\sstyle=", html), path  # no inline style or handler


def test_the_csrf_cookie_is_http_only(client: Client, stores: Stores, hub: EmbeddedHub) -> None:
    client.get("/")
    cookie = client.cookies["csrftoken"]

    assert cookie["httponly"] is True


def test_an_oversized_action_body_is_a_json_413_and_too_many_fields_a_json_400(
    stores: Stores, hub: EmbeddedHub, settings: LazySettings
) -> None:
    User.objects.create_user("ops", password="x", is_staff=True)
    staff = Client()
    staff.login(username="ops", password="x")
    big = {**DRAIN, "reason": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)}
    too_big = staff.post("/api/actions/preview", big, content_type="application/json")
    fields = "&".join(f"f{i}=1" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1))
    too_many = staff.post("/api/actions/preview", fields, content_type="application/x-www-form-urlencoded")

    assert (too_big.status_code, too_big.json()["code"]) == (413, "too_large")
    assert too_many.status_code == 400 and "too many form fields" in too_many.json()["error"]


def test_logins_from_one_client_beyond_the_rate_cost_no_password_hash(
    settings: LazySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # counted here, not timed
    hashed: list[str] = []
    real = ModelBackend.authenticate

    def counting(self: ModelBackend, request: Any, username: str | None = None, **kw: Any) -> Any:
        hashed.append(username or "")
        return real(self, request, username=username, **kw)

    monkeypatch.setattr(ModelBackend, "authenticate", counting)
    statuses = [login("/login/", "guess", A, username=f"user{i}") for i in range(settings.LEASEBOARD_LOGIN_RATE + 10)]

    assert statuses == [200] * (settings.LEASEBOARD_LOGIN_RATE + 10)  # each a wrong password to the guesser
    assert len(hashed) == settings.LEASEBOARD_LOGIN_RATE  # the ten over the rate were refused before a hash
    assert counted() == [("login", A, "", settings.LEASEBOARD_LOGIN_RATE + 10)]
    assert login("/login/", "guess", B, username="user0") == 200 and len(hashed) == settings.LEASEBOARD_LOGIN_RATE + 1


def test_a_name_guessed_from_many_addresses_holds_up_new_addresses_but_never_a_known_one(
    settings: LazySettings,
) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.LEASEBOARD_LOGIN_USER_FAILURES = 2
    User.objects.create_user("lead", password="right-password-123", is_staff=True)
    known, new = "192.0.2.10", "192.0.2.99"
    assert login("/login/", "right-password-123", known, username="lead") == 302  # the operator's usual address

    for i in range(6):  # one guesser, a new address per guess: axes' lockout per name and address never trips
        assert login("/login/", f"guess-{i}", f"198.51.100.{i}", username="lead") == 200

    assert login("/login/", "right-password-123", new, username="lead") == 200  # held up: a doubling delay
    assert login("/login/", "right-password-123", known, username="lead") == 302  # never from a known address
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))
    assert login("/login/", "right-password-123", new, username="lead") == 302  # the cool-off has passed
