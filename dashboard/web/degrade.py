"""Answers while a backend is down: a 503 saying why, never a 500 or Django's debug page.

``OutageMiddleware`` turns an outage (``health.outage``: the database or the store not answering),
or a console with every monitor slot taken (``host.Full``), that escapes a view into a 503: JSON
``{"error": ...}`` for the API and ``/metrics``, a small page
for everything else. The outage is reported to ``health`` (one log line when it starts); the
response is not logged again per request by ``django.request``. Views that can still answer
(``/api/state`` with a last known state, ``/metrics``) handle outages themselves.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.utils.deprecation import MiddlewareMixin

from ..live.health import report
from ..live.host import Full

RETRY_AFTER = "5"  # seconds a client is told to wait before asking again


def _quiet(response: HttpResponse) -> HttpResponse:
    # Django logs every 5xx response ("Service Unavailable: /api/state") unless it was logged
    # already; an outage is logged once by ``health``, not once per request.
    response._has_been_logged = True  # type: ignore[attr-defined]
    response["Retry-After"] = RETRY_AFTER
    return response


def wants_json(request: HttpRequest) -> bool:
    return request.path.startswith(("/api/", "/metrics")) or "application/json" in request.headers.get("Accept", "")


def unavailable_json(reason: str) -> HttpResponse:
    """503 ``{"error": reason}``."""
    return _quiet(JsonResponse({"error": reason}, status=503))


def unavailable(request: HttpRequest, reason: str) -> HttpResponse:
    """503 saying ``reason``: JSON for the API, a small page otherwise."""
    if wants_json(request):
        return unavailable_json(reason)
    # No request context: the context processors would read the session and the user, from the
    # database that is down.
    page = render_to_string("dashboard/unavailable.html", {"reason": reason, "path": request.path})
    return _quiet(HttpResponse(page, status=503, content_type="text/html; charset=utf-8"))


class OutageMiddleware(MiddlewareMixin):
    """A view that raised an outage answers 503 with the reason (see the module docstring)."""

    sync_capable = True
    async_capable = True

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, Full):  # every monitor slot is taken (host.py): a 503 too
            return unavailable(request, str(exception))
        found = report(exception)
        if found is None:
            return None  # a bug: Django's usual 500
        return unavailable(request, found.reason)
