"""What the console's views share: the limits and event categories they check (the OpenAPI
document states the same, ``openapi.py``), the hub and consumer group of a query, the answers for a
bad parameter and an unknown hub, and the thread their ORM work runs on.
"""

from __future__ import annotations

import re

from django.http import HttpRequest, JsonResponse

from balancer.model import HubRef
from balancer.model import check_partition_id as _check_partition_id

from ..dbthread import READ_DEADLINE, DatabaseThread
from ..live.console import ConsoleState
from ..live.health import report
from ..live.host import current_state, host, unknown
from ..live.state import parse_ref

EVENTS_DEFAULT = 100
EVENTS_MAX = 500
HISTORY_EVENTS_MAX = 50_000
ID_MAX = 2**63 - 1  # the largest id a database column holds: a greater ``after`` or ``before`` is a 400
CATEGORIES = ("claim", "steal", "expire", "release", "handoff", "drain", "undrain", "pin", "unpin", "lost", "heal")


_PARTITION_ID = re.compile(r"0|[1-9][0-9]{0,5}")


def check_partition_id(partition_id: str) -> str:
    """The model's check, matched whole: a trailing newline ("0\\n") is refused too."""
    if not _PARTITION_ID.fullmatch(partition_id):
        raise ValueError(f"partition id must be a decimal string like '0', got {partition_id!r}")
    return _check_partition_id(partition_id)


def bad_request(message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=400)


def query_ref(request: HttpRequest) -> HubRef:
    return parse_ref(request.GET.get("hub"), request.GET.get("consumer_group"))


def not_found(ref: HubRef) -> JsonResponse:
    return JsonResponse({"error": unknown(ref)}, status=404)


async def known(ref: HubRef) -> bool:
    """Whether the store knows ``ref`` (``host.known``); True while it cannot be asked, so the view
    answers with what it has (a last known state, a 503) rather than a 404."""
    try:
        return await host.known(ref)
    except Exception as exc:
        if report(exc) is None:
            raise
        return True


def known_sync(ref: HubRef) -> bool:
    try:
        return host.known_sync(ref)
    except Exception as exc:
        if report(exc) is None:
            raise
        return True


# The views' ORM work, on one thread with a kept connection (why this way: ``dbthread.py``); read
# only, so a call that finds its connection dropped by a database restart runs again on a new one.
db = DatabaseThread("leaseboard-views", retry=True, deadline=READ_DEADLINE)


async def state_or_error(ref: HubRef) -> tuple[ConsoleState | None, str | None]:
    """The current state, or None and why not when the store or the database is down (logged once
    per outage by ``health``, not per request)."""
    try:
        return await current_state(ref, db), None
    except Exception as exc:
        found = report(exc)
        if found is None:
            raise
        return None, found.reason


def int_param(request: HttpRequest, name: str, default: int | None, low: int, high: int = ID_MAX) -> int | None:
    raw = request.GET.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return value
