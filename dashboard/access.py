"""Who may read the console and who may act on it.

Reading: everyone when ``LEASEBOARD_ANONYMOUS_READ`` is on (the default), else a logged-in user;
pages send the others to the login page, the JSON API and the websocket refuse them. Acting: only
an active staff user, over HTTP POST with Django's CSRF token, never over the websocket.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast
from urllib.parse import urlencode

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse

LOGIN_REQUIRED = "log in to see this dashboard"
STAFF_REQUIRED = "a staff login is needed for this action"

A = TypeVar("A", bound=Callable[..., Awaitable[Any]])


def can_read(user: Any) -> bool:
    return bool(settings.LEASEBOARD_ANONYMOUS_READ or (user is not None and user.is_authenticated))


def can_act(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)


def login_url(next_path: str) -> str:
    return f"{settings.LOGIN_URL}?{urlencode({'next': next_path})}"


def readable_page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A page anyone may read when anonymous reading is on; else the login page first."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not can_read(request.user):
            return HttpResponseRedirect(login_url(request.get_full_path()))
        return view(request, *args, **kwargs)

    return wrapped


def readable_api(view: A) -> A:
    """An async JSON endpoint: 401 with a message for whoever may not read."""

    @functools.wraps(view)
    async def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not can_read(await request.auser()):
            return JsonResponse({"error": LOGIN_REQUIRED, "login": login_url("/")}, status=401)
        response: HttpResponse = await view(request, *args, **kwargs)
        return response

    return cast(A, wrapped)


def readable_sync_api(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A sync JSON endpoint: 401 with a message for whoever may not read."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not can_read(request.user):
            return JsonResponse({"error": LOGIN_REQUIRED, "login": login_url("/")}, status=401)
        return view(request, *args, **kwargs)

    return wrapped
