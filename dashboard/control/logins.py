"""Refused logins and refused action attempts: counted (``refusals.py``), not on the audit log.

Logins are throttled by django-axes (settings: ``AXES_*``): after ``AXES_FAILURE_LIMIT`` wrong
passwords for one user name from one address, that pair is locked out for ``AXES_COOLOFF_TIME``.
Here every wrong password and every refusal of a locked-out pair adds one to its count (kind
``login`` or ``lockout``, the client's address, the account when the name tried is one) with a log
line at most every minute per address. The password is never read here (Django's
``user_login_failed`` hands over cleansed credentials), nor is the name tried kept unless it names an
account.

An action attempt refused before it reached its action (no staff login: ``refused_attempt``; a
missing or wrong CSRF token: ``csrf_failure``, Django's ``CSRF_FAILURE_VIEW``) is counted the same
way (kind ``action`` or ``csrf``, the logged-in user if any); what it asked for is not read. The audit
log holds what operators did.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from datetime import timedelta
from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.models import AccessAttempt, AccessLog
from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db.models import Max, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.csrf import csrf_failure as django_csrf_failure

from ..clients import client_address as behind_proxies
from . import refusals

log = logging.getLogger(__name__)

LOGIN = "login"
ANONYMOUS = "(anonymous)"
CSRF_REFUSED = "refused: the CSRF token is missing or wrong (reload the page and try again)"


class LoginThrottle(AxesStandaloneBackend):  # type: ignore[misc]
    """django-axes' check before every login over HTTP, after this console's own: at most
    ``LEASEBOARD_LOGIN_RATE`` logins a minute from one client, whatever the user names (each costs a
    password hash, about 0.4 s of CPU: rotating names kept a core busy). One over the rate is refused
    before any hash, as a wrong password (and counted as one). A login that comes with no request at
    all (code calling ``authenticate`` itself: a management command, a test client's ``login``) has no
    address to count against and is not an attempt from outside: it passes on to the next backend."""

    def authenticate(self, request: HttpRequest | None, *args: Any, **kwargs: Any) -> None:
        if request is None:
            return None
        address = client_address(request)
        if not _RATE.allow(address, time.monotonic(), settings.LEASEBOARD_LOGIN_RATE):
            raise PermissionDenied("too many logins from this address in a minute")  # ends authenticate()
        name = kwargs.get("username")
        if isinstance(name, str) and name and _guessed_elsewhere(name, address):
            raise PermissionDenied("this user name is being guessed: wait, or log in from a known address")
        super().authenticate(request, *args, **kwargs)
        return None


def _guessed_elsewhere(name: str, address: str) -> bool:
    """Whether a login as ``name`` from ``address`` waits: ``name`` had ``LEASEBOARD_LOGIN_USER_FAILURES``
    wrong passwords or more within the cool-off, from any addresses (one guesser spread over many), and
    ``address`` is none ``name`` logged in from in the last 30 days. Then one try is let through per
    delay, the delay doubling with each failure past the limit, up to the cool-off. From a known
    address the operator is never held up by a guesser elsewhere; django-axes' lockout per name and
    address still applies there."""
    now = timezone.now()
    cooloff: timedelta = settings.AXES_COOLOFF_TIME
    recent = AccessAttempt.objects.filter(username=name, attempt_time__gte=now - cooloff)
    found = recent.aggregate(failures=Sum("failures_since_start"), last=Max("attempt_time"))
    over = int(found["failures"] or 0) - settings.LEASEBOARD_LOGIN_USER_FAILURES
    if over < 0:
        return False
    known = AccessLog.objects.filter(username=name, ip_address=address, attempt_time__gte=now - timedelta(days=30))
    if known.exists():
        return False
    wait = min(2.0**over, cooloff.total_seconds())
    return bool((now - found["last"]).total_seconds() < wait)


class _PerMinute:
    """Login attempts per client in the last minute (this process), for ``LoginThrottle``."""

    def __init__(self) -> None:
        self.seen: dict[str, deque[float]] = {}

    def allow(self, client: str, now: float, limit: int) -> bool:
        if len(self.seen) > 10_000:  # many clients: forget those with nothing in the last minute
            self.seen = {c: t for c, t in self.seen.items() if t and t[-1] > now - 60.0}
        times = self.seen.setdefault(client, deque())
        while times and times[0] <= now - 60.0:
            times.popleft()
        if len(times) >= limit:
            return False
        times.append(now)
        return True


_RATE = _PerMinute()


def client_address(request: HttpRequest | None) -> str:
    """The client's address, behind the trusted proxies (``dashboard/clients.py``)."""
    return behind_proxies(request)


def wrong_password(sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **_: Any) -> None:
    """Django's ``user_login_failed``, connected by ``apps.DashboardConfig.ready``: one wrong password counted."""
    if getattr(request, "axes_locked_out", False):
        return  # a refusal of a locked-out pair: ``locked_out`` counts it
    refusals.count("login", client_address(request), refusals.account(str(credentials.get("username") or "")))


def locked_out(sender: Any, request: HttpRequest | None = None, username: str | None = None, **kw: Any) -> None:
    """django-axes' ``user_locked_out``, connected by ``apps.DashboardConfig.ready``: one lockout counted."""
    address = str(kw.get("ip_address") or client_address(request))
    refusals.count("lockout", address, refusals.account(username or ""))


def _who(request: HttpRequest) -> str:
    user = getattr(request, "user", None)
    return user.get_username() if user is not None and user.is_authenticated else ""


def refused_attempt(request: HttpRequest, user: str = "", kind: str = "action") -> None:
    """Count an action attempt refused before its action ran (sync ORM): ``user`` the logged-in
    user's name ("" for none)."""
    refusals.count(kind, client_address(request), user)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """Django's CSRF refusal, counted wherever it happens (a login form too); JSON for the action API."""
    refused_attempt(request, _who(request), "csrf")
    if not request.path.startswith("/api/actions/"):
        return django_csrf_failure(request, reason)
    return JsonResponse({"error": CSRF_REFUSED, "code": "csrf"}, status=403)
