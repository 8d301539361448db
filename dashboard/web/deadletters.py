"""The dead letters of a hub and consumer group: ``/api/deadletters`` and the page that pages through
it (``/deadletters/``, ``deadletters.js``), where staff replay and purge them (``control/deadletters.py``).

The API reads the dead-letter files (``workers.deadletter.files``) partition by partition, oldest
first, from a cursor (``after``: ``"<partition>:<byte position>"``, the ``next`` of the page
before; with ``partition``, a cursor of an earlier partition reads all of it, one of a later
partition nothing), at most ``limit`` entries and about READ_BUDGET bytes a request. Each entry shows its
body decoded (JSON, text or hex, ``workers.deadletter.decode``), its application properties and
its replay, if any. Bodies and error texts are for staff only (``access.dead_letters_for``).
"""

from __future__ import annotations

import re
import time
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_GET

from balancer.model import HubRef
from workers.deadletter import files
from workers.deadletter.decode import body_view, properties_of
from workers.deadletter.files import Entry

from ..control.deadletters import folder_of
from .access import can_act, dead_letters_for
from .common import bad_request, check_partition_id, int_param, query_ref
from .methods import read_only

LIMIT_DEFAULT = 50
LIMIT_MAX = 200
READ_BUDGET = 4 * 1024 * 1024  # bytes of dead-letter files read a request (one line more at most)
CURSOR_PATTERN = r"^(0|[1-9][0-9]{0,5}):(0|[1-9][0-9]{0,14})$"
_CURSOR = re.compile(CURSOR_PATTERN)
SHOWN = (
    "partition_id",
    "sequence_number",
    "offset",
    "enqueued_time",
    "partition_key",
    "set_aside_at",
    "owner_id",
    "attempts",
    "error",
)


def parse_cursor(raw: str) -> tuple[str, int] | None:
    """``(partition, byte position)`` of an ``after`` cursor; None for none; ValueError when malformed."""
    if raw == "":
        return None
    found = _CURSOR.fullmatch(raw)
    if found is None:
        raise ValueError(f"after must be a cursor like '0:1234' (a page's next), got {raw!r}")
    return found.group(1), int(found.group(2))


def shown(entry: Entry, marks: dict[int, Entry], failures: dict[int, Entry] | None = None) -> dict[str, Any]:
    """A dead-letter file's entry as the API shows it."""
    out = {key: entry.get(key) for key in SHOWN}
    out["partition_id"] = str(out["partition_id"])
    try:
        amqp = files.b64(entry.get("amqp_base64"))
        body = files.b64(entry["body_base64"]) if "body_base64" in entry else None
    except ValueError:
        amqp, body = b"", None
    out["properties"] = properties_of(amqp)
    out["body"] = None if body is None else body_view(body)
    sequence = files.sequence_of(entry)
    mark = marks.get(sequence) if sequence is not None else None
    out["replayed"] = None if mark is None else {k: mark.get(k) for k in ("replayed_at", "user", "to")}
    failed = (failures or {}).get(sequence) if sequence is not None else None
    out["in_place_failed"] = None
    if failed is not None:
        fields = {k: failed.get(k) for k in ("replayed_at", "user", "owner")}
        out["in_place_failed"] = {**fields, "error": failed["failed"]}
    return out


def listing(ref: HubRef, partition: str | None, after: tuple[str, int] | None, limit: int) -> dict[str, Any]:
    """The ``/api/deadletters`` document (before the read rule trims it). Blocking."""
    folder = folder_of(ref.hub)
    page = files.read_page(folder, ref.consumer_group, partition, after, limit, READ_BUDGET)
    pids = {str(e.get("partition_id")) for e in page.entries}
    marks = {pid: files.read_markers(folder, pid, ref.consumer_group) for pid in sorted(pids)}
    failures = {pid: files.read_failures(folder, pid, ref.consumer_group) for pid in sorted(pids)}
    return {
        "hub": ref.hub,
        "consumer_group": ref.consumer_group,
        "partition": partition,
        "generated_at": time.time(),
        "entries": [shown(e, marks.get(p := str(e.get("partition_id")), {}), failures.get(p)) for e in page.entries],
        "next": None if page.next is None else f"{page.next[0]}:{page.next[1]}",
        "limit": limit,
        "bytes_read": page.bytes_read,
        "partitions": files.partitions(folder),
    }


def _query(request: HttpRequest) -> tuple[HubRef, str | None, tuple[str, int] | None, int]:
    """The query's hub and group, partition, cursor and limit; ValueError saying what is wrong."""
    ref = query_ref(request)
    partition = request.GET.get("partition", "") or None
    if partition is not None:
        check_partition_id(partition)
    after = parse_cursor(request.GET.get("after", ""))  # of another partition: all of it, or none
    limit = int_param(request, "limit", LIMIT_DEFAULT, 1, LIMIT_MAX)
    assert limit is not None
    return ref, partition, after, limit


@read_only
def api_deadletters(request: HttpRequest) -> JsonResponse:
    """200 with a page of dead letters (bodies and error texts for staff only); 400 for a bad parameter."""
    try:
        ref, partition, after, limit = _query(request)
    except ValueError as exc:
        return bad_request(str(exc))
    found = listing(ref, partition, after, limit)
    found["entries"] = dead_letters_for(request.user, found["entries"])
    return JsonResponse(found)


@require_GET
@ensure_csrf_cookie
def page(request: HttpRequest) -> HttpResponse:
    """The dead-letters page (its script pages through ``api_deadletters``)."""
    try:
        ref = query_ref(request)
        partition = request.GET.get("partition", "")
        if partition:
            check_partition_id(partition)
    except ValueError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain")
    context = {
        "ref": ref,
        "page": "deadletters",
        "partition": partition,
        "expiry": settings.LEASEBOARD_EXPIRY,
        "can_act": can_act(request.user),
    }
    return render(request, "dashboard/deadletters.html", context)
