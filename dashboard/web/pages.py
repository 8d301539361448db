"""The console's pages: each renders a shell whose scripts load JSON and follow ``/ws/balancer/``."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_GET

from ..live.host import host, unknown
from .access import can_act
from .common import CATEGORIES, check_partition_id, query_ref


def _page(request: HttpRequest, template: str, page: str, **extra: Any) -> HttpResponse:
    try:
        ref = query_ref(request)
    except ValueError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain")
    if host.admit_sync(ref) is None:  # the sampler starts with the first look at a hub the store knows
        raise Http404(unknown(ref))
    context = {
        "ref": ref,
        "page": page,
        "expiry": settings.LEASEBOARD_EXPIRY,
        "can_act": can_act(request.user),
        "categories": CATEGORIES,
        **extra,
    }
    return render(request, template, context)


@require_GET
@ensure_csrf_cookie
def index(request: HttpRequest) -> HttpResponse:
    """The fleet: workers and the partition grid (its script loads ``/api/state`` and follows the socket)."""
    return _page(request, "dashboard/index.html", "fleet")


@require_GET
@ensure_csrf_cookie
def partition_page(request: HttpRequest, partition_id: str) -> HttpResponse:
    """One partition: ownership timeline, checkpoint history, lag chart."""
    try:
        check_partition_id(partition_id)
    except ValueError as exc:
        raise Http404(str(exc)) from exc
    return _page(request, "dashboard/partition.html", "partition", partition_id=partition_id)


@require_GET
def events_page(request: HttpRequest) -> HttpResponse:
    """The filterable feed of balancer events."""
    return _page(request, "dashboard/events.html", "events")


@require_GET
def history_page(request: HttpRequest) -> HttpResponse:
    """Rebalances over time, derived from the event log."""
    return _page(request, "dashboard/history.html", "history")


# Seconds between two refreshes of the groups page: each is one read of the store for every group.
GROUPS_POLL_SECONDS = 5


@require_GET
def groups_page(request: HttpRequest) -> HttpResponse:
    """Every hub and consumer group at a glance (its script polls ``/api/groups``)."""
    return _page(request, "dashboard/groups.html", "groups", poll_seconds=GROUPS_POLL_SECONDS)
