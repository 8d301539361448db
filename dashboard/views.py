"""The dashboard's HTTP endpoints: the page, ``/api/state``, ``/api/events`` and ``/metrics``."""

from __future__ import annotations

import logging
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from balancer.errors import StoreError
from balancer.model import HubRef

from . import metrics
from .models import EventLog
from .state import Snapshot, parse_ref, snapshot

log = logging.getLogger(__name__)

EVENTS_DEFAULT = 100
EVENTS_MAX = 500


def _bad_request(message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=400)


def _ref(request: HttpRequest) -> HubRef:
    return parse_ref(request.GET.get("hub"), request.GET.get("consumer_group"))


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    """The live dashboard page (its script loads ``/api/state`` and follows ``/ws/balancer/``)."""
    try:
        ref = _ref(request)
    except ValueError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain")
    return render(request, "dashboard/index.html", {"ref": ref, "expiry": settings.LEASEBOARD_EXPIRY})


async def _state_or_error(ref: HubRef) -> tuple[Snapshot | None, str | None]:
    try:
        return await snapshot(ref), None
    except StoreError as exc:
        log.warning("state of %s/%s unavailable: %s", ref.hub, ref.consumer_group, exc)
        return None, f"store unavailable: {exc}"


@require_GET
async def api_state(request: HttpRequest) -> JsonResponse:
    """200 with the snapshot; 400 for a bad hub or consumer group; 503 when the store cannot be read."""
    try:
        ref = _ref(request)
    except ValueError as exc:
        return _bad_request(str(exc))
    state, error = await _state_or_error(ref)
    if state is None:
        return JsonResponse({"error": error}, status=503)
    return JsonResponse(state)


def _int_param(request: HttpRequest, name: str, default: int | None, low: int, high: int | None) -> int | None:
    raw = request.GET.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {raw!r}") from None
    if value < low or (high is not None and value > high):
        span = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ValueError(f"{name} must be {span}, got {value}")
    return value


def _events(ref: HubRef, after: int | None, limit: int) -> list[dict[str, Any]]:
    rows = EventLog.objects.filter(**EventLog.scope(ref))
    if after is not None:
        chosen = list(rows.filter(id__gt=after).order_by("id")[:limit])
    else:
        chosen = list(rows.order_by("-id")[:limit])[::-1]
    return [row.as_json() for row in chosen]


@require_GET
def api_events(request: HttpRequest) -> JsonResponse:
    """Balancer events in id order: the first ``limit`` after ``after``, or without it the newest ``limit``."""
    try:
        ref = _ref(request)
        after = _int_param(request, "after", None, 0, None)
        limit = _int_param(request, "limit", EVENTS_DEFAULT, 1, EVENTS_MAX)
    except ValueError as exc:
        return _bad_request(str(exc))
    assert limit is not None
    return JsonResponse(_events(ref, after, limit), safe=False)


def _logged_by_kind(ref: HubRef) -> dict[str, int]:
    rows = EventLog.objects.filter(**EventLog.scope(ref)).values("kind").annotate(n=Count("id"))
    return {row["kind"]: row["n"] for row in rows}


@require_GET
async def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text for the configured hub and consumer group (always 200, ``leaseboard_store_up`` says
    whether the store answered)."""
    ref = parse_ref(None, None)
    state, _ = await _state_or_error(ref)
    logged: dict[str, int] = await database_sync_to_async(_logged_by_kind)(ref)
    body = metrics.render(ref, state, logged)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
