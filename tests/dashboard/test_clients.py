"""Who a request comes from behind the proxies the operator trusts (issue 37, item 2;
``dashboard/clients.py``): the login throttle and the refusal counts go by the real client, a peer
that is no trusted proxy cannot name another address, and ``check --deploy`` warns when the console
is behind a TLS proxy that it does not know."""

from __future__ import annotations

import secrets
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.conf import LazySettings
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from dashboard.clients import client_address, trusted_proxies

from .test_production import manage

PROXY = "10.0.0.5"
A, B = "203.0.113.7", "198.51.100.9"


def request(peer: str, forwarded: str = "") -> SimpleNamespace:
    meta = {"REMOTE_ADDR": peer, **({"HTTP_X_FORWARDED_FOR": forwarded} if forwarded else {})}
    return SimpleNamespace(META=meta)


@pytest.fixture
def behind_proxy(settings: LazySettings) -> None:
    settings.LEASEBOARD_TRUSTED_PROXIES = trusted_proxies(f"{PROXY}, 10.1.0.0/16")


def test_without_trusted_proxies_the_peer_is_the_client_whatever_it_says(settings: LazySettings) -> None:
    settings.LEASEBOARD_TRUSTED_PROXIES = ()
    assert client_address(request(A, f"{B}, 1.2.3.4")) == A


def test_behind_a_trusted_proxy_the_client_is_the_last_address_no_proxy_added(behind_proxy: None) -> None:
    assert client_address(request(PROXY, A)) == A
    assert client_address(request(PROXY, f"{A}, 10.1.2.3")) == A  # through two of ours
    assert client_address(request(PROXY, f"1.2.3.4, {A}")) == A  # what the client wrote itself is left of it
    assert client_address(request(PROXY)) == PROXY  # the proxy said nothing: the proxy
    assert client_address(request(B, A)) == B  # a peer that is no proxy of ours names nobody else


def test_a_trusted_proxy_setting_that_is_no_address_is_refused_naming_it() -> None:
    assert trusted_proxies(" 10.0.0.5 ,10.1.0.0/16,, ::1 ") == trusted_proxies("10.0.0.5,10.1.0.0/16,::1")
    with pytest.raises(ImproperlyConfigured, match=r"'proxy\.example'"):
        trusted_proxies("10.0.0.5, proxy.example")


@pytest.mark.django_db(transaction=True)
def test_a_lockout_through_the_proxy_is_one_clients_not_everyones(settings: LazySettings, behind_proxy: None) -> None:
    User.objects.create_user("ops", password="right-password-123", is_staff=True)

    def login(client_ip: str, password: str) -> int:
        via_proxy = Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=client_ip)
        return via_proxy.post("/login/", {"username": "ops", "password": password}).status_code

    for _ in range(settings.AXES_FAILURE_LIMIT):
        login(A, "wrong")
    assert login(A, "right-password-123") == 429  # the guesser is locked out
    assert login(B, "right-password-123") == 302  # the operator behind the same proxy is not


@pytest.mark.parametrize(("trusted", "warned"), [("", True), (PROXY, False)])
def test_check_deploy_warns_behind_a_tls_proxy_it_does_not_know(tmp_path: Path, trusted: str, warned: bool) -> None:
    result = manage(
        tmp_path,
        "check",
        "--deploy",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        LEASEBOARD_BEHIND_TLS_PROXY="1",
        LEASEBOARD_TRUSTED_PROXIES=trusted,
    )

    assert ("leaseboard.W001" in result.stdout + result.stderr) is warned, result.stdout + result.stderr
