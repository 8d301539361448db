"""``read_only``: the decorator of the views that only read (the JSON API, ``/metrics``).

Such a view answers GET and HEAD; any other method gets 405 with ``Allow: GET, HEAD``, as the
OpenAPI document (``openapi.py``) says. Django's CSRF check runs before a view and would answer a
POST without a token with 403 first; it guards writes, and these views write nothing, so they are
exempt from it (an exempt view still refuses every method but GET and HEAD).

A query string Django will not parse (more than ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` fields) is a 400
with ``{"error": ...}`` before the view runs, as every other bad parameter is; left to Django, it
was an HTML page, and a 500 with ``DEBUG`` on (the debug page reads the query again, and fails).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction
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
