"""Who may read the console and who may act on it: the one place that decides.

Reading: everyone when ``LEASEBOARD_ANONYMOUS_READ`` is on (the default), else a logged-in user.
The rule is applied to every request before any view runs (``ReadRule``, a middleware) and to
every websocket before any consumer runs (``ReadRuleSocket``, around the websocket router), so a
new page, API or socket route cannot forget it. Whoever may not read gets: a page, the login page
(302); ``/api/…``, 401 with a JSON message; a socket, an error frame and close 4401. The only
doors open to everyone are listed in ``OPEN`` with the reason each is open.

Acting: only an active staff user, over HTTP POST with Django's CSRF token, never over the
websocket (``can_act``). What a reader who is not staff sees is trimmed here too: user names in the
audit log (``audit_for``), dead letters' bodies and error texts, which may repeat an event's
body (``dead_letters_for``), and the event browser's bodies unless ``LEASEBOARD_EVENT_BODIES`` is
``readers`` (``sees_event_bodies``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import urlencode

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse

LOGIN_REQUIRED = "log in to see this dashboard"
STAFF_REQUIRED = "a staff login is needed for this action"
CLOSE_LOGIN_REQUIRED = 4401

# Path prefixes anyone may reach whatever LEASEBOARD_ANONYMOUS_READ says, and why.
OPEN: dict[str, str] = {
    "/login/": "the login form itself",
    "/logout/": "ends a session; shows nothing",
    "/admin/": "Django's admin, which asks for its own staff login on every page",
    "/static/": "stylesheets and scripts, the same for everyone",
    "/metrics": "Prometheus scrapes it without a session; counts and states only, no user names or bodies",
}
HIDDEN_USER = "(staff only)"
OPERATOR = "dashboard:"  # the reporter prefix of an event an operator's action caused (control/action.py)
HIDDEN_ERROR = "(the text is shown to staff only: it may repeat the event's body)"


def can_read(user: Any) -> bool:
    return bool(settings.LEASEBOARD_ANONYMOUS_READ or (user is not None and user.is_authenticated))


def can_act(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)


def is_open(path: str) -> bool:
    """Whether ``path`` is one of the ``OPEN`` doors."""
    return any(path == door or path.startswith(door) for door in OPEN)


def login_url(next_path: str) -> str:
    return f"{settings.LOGIN_URL}?{urlencode({'next': next_path})}"


def refusal(request: HttpRequest, user: Any) -> HttpResponse | None:
    """What ``request`` gets instead of its view when ``user`` may not read it; None when it may."""
    if is_open(request.path) or can_read(user):
        return None
    if request.path.startswith("/api/"):
        return JsonResponse({"error": LOGIN_REQUIRED, "login": login_url("/")}, status=401)
    return HttpResponseRedirect(login_url(request.get_full_path()))


class ReadRule:
    """The read rule for every HTTP request (after ``AuthenticationMiddleware``)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        refused = None if is_open(request.path) else refusal(request, request.user)
        if refused is not None:
            _keep_refused_action(request)
        return refused or self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        # The user is looked up only when the rule needs it (a session read is a database read).
        needed = not is_open(request.path) and not settings.LEASEBOARD_ANONYMOUS_READ
        refused = refusal(request, await request.auser()) if needed else None
        if refused is not None:
            await sync_to_async(_keep_refused_action)(request)
            return refused
        response: HttpResponse = await self.get_response(request)
        return response


def _keep_refused_action(request: HttpRequest) -> None:
    """An action POSTed by someone who may not even read is counted too (``control/refusals.py``)."""
    if request.method == "POST" and request.path.startswith("/api/actions/"):
        from ..control.logins import refused_attempt

        refused_attempt(request)


Scope = Any
App = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class ReadRuleSocket:
    """The read rule for every websocket (inside ``AuthMiddlewareStack``, which puts the user in
    the scope): whoever may not read gets ``{"type": "error", ...}`` and close 4401, and no
    consumer is built for them."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and not can_read(scope.get("user")):
            message = await receive()
            if message.get("type") == "websocket.connect":
                await send({"type": "websocket.accept"})
                await send({"type": "websocket.send", "text": json.dumps({"type": "error", "error": LOGIN_REQUIRED})})
                await send({"type": "websocket.close", "code": CLOSE_LOGIN_REQUIRED})
            return
        await self.app(scope, receive, send)


def audit_for(user: Any, entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Audit entries as ``user`` may see them: user names for staff only."""
    if can_act(user):
        return list(entries)
    return [{**entry, "user": HIDDEN_USER} for entry in entries]


def reporter_for(staff: bool, reporter: str) -> str:
    """An event's reporter as a reader sees it: ``dashboard:<user>`` (an operator's action) is
    ``dashboard`` for whoever is not staff."""
    if staff or not reporter.startswith(OPERATOR):
        return reporter
    return OPERATOR.rstrip(":")


def events_for(user: Any, events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Balancer events as ``user`` may see them: who applied an operator's action for staff only."""
    staff = can_act(user)
    if staff:
        return list(events)
    return [{**e, "reporter": reporter_for(False, str(e.get("reporter") or ""))} for e in events]


RAW = frozenset({"body_base64", "amqp_base64"})  # a dead letter's body and sections as the files keep them


def dead_letters_for(user: Any, entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Dead-letter entries as ``user`` may see them: error texts and bodies for staff only (a decoded
    ``body`` is null for others; the raw ones are left out)."""
    if can_act(user):
        return list(entries)
    return [{k: _hidden(k, v) for k, v in entry.items() if k not in RAW} for entry in entries]


def _hidden(key: str, value: Any) -> Any:
    if key == "error":
        return _error_kind(value)
    if key == "in_place_failed" and isinstance(value, dict):
        return {**value, "error": _error_kind(value.get("error"))}
    return None if key == "body" else value


def _error_kind(error: Any) -> str:
    """``"ValueError: <text>"`` → ``"ValueError (the text is shown to staff only: …)"``."""
    kind = str(error).partition(":")[0].strip()
    return f"{kind} {HIDDEN_ERROR}" if kind.isidentifier() else HIDDEN_ERROR


def sees_event_bodies(user: Any) -> bool:
    """Whether ``user`` sees the bodies of a hub's events (the event browser): staff always, every
    reader when ``LEASEBOARD_EVENT_BODIES`` is ``readers``."""
    return settings.LEASEBOARD_EVENT_BODIES == "readers" or can_act(user)
