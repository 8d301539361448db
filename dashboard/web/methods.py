"""``read_only``: the decorator of the views that only read (the JSON API, ``/metrics``).

Such a view answers GET and HEAD; any other method gets 405 with ``Allow: GET, HEAD``, as the
OpenAPI document (``openapi.py``) says. Django's CSRF check runs before a view and would answer a
POST without a token with 403 first; it guards writes, and these views write nothing, so they are
exempt from it (an exempt view still refuses every method but GET and HEAD).

A query string Django will not parse (more than ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` fields), or a path
or query holding NUL (which PostgreSQL refuses in any string), is a 400 with ``{"error": ...}`` before
the view runs, as every other bad parameter is; left to Django, the first was an HTML page, and a
500 with ``DEBUG`` on (the debug page reads the query again, and fails).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.exceptions import TooManyFieldsSent
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

V = TypeVar("V", bound=Callable[..., Any])


def unreadable_query(request: HttpRequest) -> HttpResponse | None:
    """A 400 when Django will not parse the query string of ``request``; None when it does."""
    try:
        request.GET  # noqa: B018 (parsed here, once, for the view)
    except TooManyFieldsSent:
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        return JsonResponse({"error": f"too many query parameters: at most {limit}"}, status=400)
    if "\x00" in request.path or any("\x00" in k or "\x00" in v for k, vs in request.GET.lists() for v in vs):
        # PostgreSQL refuses NUL in any string it is given: a 500 on the query that held one.
        return JsonResponse({"error": "the path and query parameters must not contain NUL characters"}, status=400)
    return None


def read_only(view: V) -> V:
    """``view`` for GET and HEAD only, a 405 for any other method (before the CSRF check), a 400 for
    a query string too long to parse."""
    checked: Callable[..., Any]
    if iscoroutinefunction(view):

        async def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return unreadable_query(request) or await view(request, *args, **kwargs)

    else:

        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return unreadable_query(request) or view(request, *args, **kwargs)

    wrapped: V = functools.wraps(view)(checked)  # type: ignore[assignment]
    exempt: V = csrf_exempt(require_GET(wrapped))
    return exempt


class QueryLimit:
    """Every request (pages, ``/login/``, the admin too): a query string Django will not parse is a
    400 here, before anything reads it (with ``DEBUG`` on, Django's error page read it again and
    answered 500). JSON for the API and ``/metrics`` (as their other errors), plain text elsewhere."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def _refusal(self, request: HttpRequest) -> HttpResponse | None:
        refused = unreadable_query(request)
        if refused is None or request.path.startswith(("/api/", "/metrics")):
            return refused
        return HttpResponse(json.loads(refused.content)["error"], status=400, content_type="text/plain")

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        return self._refusal(request) or self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        refused = self._refusal(request)
        if refused is not None:
            return refused
        response: HttpResponse = await self.get_response(request)
        return response
