"""Refused logins and refused action attempts, on the audit log beside the actions.

Logins are throttled by django-axes (settings: ``AXES_*``): after ``AXES_FAILURE_LIMIT`` wrong
passwords for one user name from one address, that pair is locked out for ``AXES_COOLOFF_TIME``.
Here every wrong password and every lockout becomes one audit entry (action ``login``, outcome
``refused``, target the client's address, the message saying which it was) and one log line, on
the configured hub's audit log: the console has one set of operators whatever hub they look at.
The password is never read here (Django's ``user_login_failed`` hands over cleansed credentials).

An action attempt refused before it reached its action (no staff login: ``refused_attempt``; a
missing or wrong CSRF token: ``csrf_failure``, Django's ``CSRF_FAILURE_VIEW``) is kept the same
way, with the action it asked for when it could be read.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.signals import user_locked_out
from django.contrib.auth.signals import user_login_failed
from django.core.exceptions import SuspiciousOperation
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.csrf import csrf_failure as django_csrf_failure

from workers.wiring import hub_ref

from ..models import AuditEntry
from .audit import save
from .registry import parse
from .request import Refused, Request, storable

log = logging.getLogger(__name__)

LOGIN = "login"
ANONYMOUS = "(anonymous)"
CSRF_REFUSED = "refused: the CSRF token is missing or wrong (reload the page and try again)"


class LoginThrottle(AxesStandaloneBackend):  # type: ignore[misc]
    """django-axes' check before every login over HTTP. A login that comes with no request at all
    (code calling ``authenticate`` itself: a management command, a test client's ``login``) has no
    address to count against and is not an attempt from outside: it passes on to the next backend."""

    def authenticate(self, request: HttpRequest | None, *args: Any, **kwargs: Any) -> None:
        if request is None:
            return None
        super().authenticate(request, *args, **kwargs)
        return None


def client_address(request: HttpRequest | None) -> str:
    return str(getattr(request, "META", {}).get("REMOTE_ADDR") or "unknown")[:255]


@receiver(user_login_failed)
def _wrong_password(sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **_: Any) -> None:
    name = str(credentials.get("username") or "")
    if getattr(request, "axes_locked_out", False):
        return  # a refusal of a locked-out pair: ``_locked_out`` says it once
    address = client_address(request)
    log.warning("login refused: wrong password for %r from %s", name, address)
    save(hub_ref(), Request(LOGIN, address), name or ANONYMOUS, AuditEntry.REFUSED, "wrong user name or password", {})


@receiver(user_locked_out)
def _locked_out(sender: Any, request: HttpRequest | None = None, username: str | None = None, **kw: Any) -> None:
    address = str(kw.get("ip_address") or client_address(request))[:255]
    message = "locked out after too many wrong passwords: refused until the cool-off has passed"
    log.warning("login locked out: %r from %s", username, address)
    save(hub_ref(), Request(LOGIN, address), username or ANONYMOUS, AuditEntry.REFUSED, message, {})


def _who(request: HttpRequest) -> str:
    user = getattr(request, "user", None)
    return user.get_username() if user is not None and user.is_authenticated else ANONYMOUS


def _asked(data: Any) -> Request:
    """The action ``data`` asks for, or an ``invalid`` one when it cannot be read as one."""
    try:
        return parse(data)
    except (Refused, AttributeError, TypeError, ValueError):
        return Request("invalid")


def refused_attempt(request: HttpRequest, user: str, data: Any, message: str) -> None:
    """Keep an action attempt refused before its action ran (sync ORM)."""
    try:
        names = (data.get("hub") or None, data.get("consumer_group") or None)
        readable = all(v is None or (isinstance(v, str) and storable(v)) for v in names)
        ref = hub_ref(*names) if readable else hub_ref()
    except (AttributeError, ValueError, TypeError):
        ref = hub_ref()
    save(ref, _asked(data), user, AuditEntry.REFUSED, message, {"address": client_address(request)})


def parsed_body(request: HttpRequest) -> Any:
    """The action request's body as a mapping (JSON or a form); {} when it is neither."""
    try:
        data: Any = json.loads(request.body or b"{}") if request.content_type == "application/json" else request.POST
    except (ValueError, UnicodeDecodeError, SuspiciousOperation, RecursionError):  # not JSON, too big, too
        return {}  # many fields, nested past the recursion limit
    return data if hasattr(data, "get") else {}


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """Django's CSRF refusal; for the action API, JSON and an audit entry."""
    if not request.path.startswith("/api/actions/"):
        return django_csrf_failure(request, reason)
    refused_attempt(request, _who(request), parsed_body(request), CSRF_REFUSED)
    return JsonResponse({"error": CSRF_REFUSED, "code": "csrf"}, status=403)
