"""The console's HTTP endpoints: the pages, the JSON API, the actions and ``/metrics``.

Pages render a shell; their scripts load JSON and follow ``/ws/balancer/``. Who may read and who
may act is ``access.py``'s business.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.db.models import Count, Q
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_GET, require_POST
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from balancer.errors import StoreError
from balancer.model import HubRef
from balancer.model import check_partition_id as _check_partition_id

from ..control import actions, logins
from ..dbthread import READ_DEADLINE, DatabaseThread
from ..live import history, metrics
from ..live.console import ConsoleState, Json
from ..live.health import DATABASE, DATABASE_ERRORS, health, report
from ..live.host import current_state, host, unknown
from ..live.state import lag_rules, last_served, parse_ref, remember
from ..models import EventLog, LagSample, category
from .access import STAFF_REQUIRED, audit_for, can_act, events_for, reporter_for
from .consumers import open_sockets
from .degrade import unavailable_json
from .methods import read_only
from .pipeline import PipelineCollector

log = logging.getLogger(__name__)

EVENTS_DEFAULT = 100
EVENTS_MAX = 500
HISTORY_EVENTS_MAX = 50_000
ID_MAX = 2**63 - 1  # the largest id a database column holds: a greater ``after`` or ``before`` is a 400
CATEGORIES = ("claim", "steal", "expire", "release", "handoff", "drain", "undrain", "pin", "unpin", "lost")


_PARTITION_ID = re.compile(r"0|[1-9][0-9]{0,5}")


def check_partition_id(partition_id: str) -> str:
    """The model's check, matched whole: a trailing newline ("0\\n") is refused too."""
    if not _PARTITION_ID.fullmatch(partition_id):
        raise ValueError(f"partition id must be a decimal string like '0', got {partition_id!r}")
    return _check_partition_id(partition_id)


def _bad_request(message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=400)


def _ref(request: HttpRequest) -> HubRef:
    return parse_ref(request.GET.get("hub"), request.GET.get("consumer_group"))


def _not_found(ref: HubRef) -> JsonResponse:
    return JsonResponse({"error": unknown(ref)}, status=404)


async def _known(ref: HubRef) -> bool:
    """Whether the store knows ``ref`` (``host.known``); True while it cannot be asked, so the view
    answers with what it has (a last known state, a 503) rather than a 404."""
    try:
        return await host.known(ref)
    except Exception as exc:
        if report(exc) is None:
            raise
        return True


def _known_sync(ref: HubRef) -> bool:
    try:
        return host.known_sync(ref)
    except Exception as exc:
        if report(exc) is None:
            raise
        return True


# --- pages ------------------------------------------------------------------------------------


def _page(request: HttpRequest, template: str, page: str, **extra: Any) -> HttpResponse:
    try:
        ref = _ref(request)
    except ValueError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain")
    if host.admit_sync(ref) is None:  # the sampler starts with the first look at a hub the store knows
        raise Http404(unknown(ref))
    context = {
        "ref": ref, "page": page, "expiry": settings.LEASEBOARD_EXPIRY, "can_act": can_act(request.user),
        "categories": CATEGORIES, **extra,
    }  # fmt: skip
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


# --- state ------------------------------------------------------------------------------------


# The views' ORM work, on one thread with a kept connection (why this way: ``dbthread.py``); read
# only, so a call that finds its connection dropped by a database restart runs again on a new one.
_db = DatabaseThread("leaseboard-views", retry=True, deadline=READ_DEADLINE)


async def _state_or_error(ref: HubRef) -> tuple[ConsoleState | None, str | None]:
    """The current state, or None and why not when the store or the database is down (logged once
    per outage by ``health``, not per request)."""
    try:
        return await current_state(ref, _db), None
    except Exception as exc:
        found = report(exc)
        if found is None:
            raise
        return None, found.reason


def _last_known(ref: HubRef) -> Json | None:
    """The newest state of ``ref`` this process had: served here or published by its monitor."""
    known = [last_served(ref)]
    watched = host.running(ref)
    if watched is not None and watched.published is not None:
        known.append(watched.published.json)
    return max((k for k in known if k is not None), key=lambda k: float(k["generated_at"]), default=None)


@read_only
async def api_state(request: HttpRequest) -> HttpResponse:
    """200 with the snapshot (``stale: false``); 400 for a bad hub or consumer group. While the store
    cannot be read: 200 with the last known snapshot, ``stale: true`` and the reason in ``error``,
    or 503 with the reason when there is none."""
    try:
        ref = _ref(request)
    except ValueError as exc:
        return _bad_request(str(exc))
    if not await _known(ref):
        return _not_found(ref)
    state, error = await _state_or_error(ref)
    if state is None:
        assert error is not None
        last = _last_known(ref)
        if last is None:
            return unavailable_json(error)
        return JsonResponse({**last, "stale": True, "error": error})
    served = state.as_json()
    remember(ref, served)
    return JsonResponse({**served, "stale": False})


def _int_param(request: HttpRequest, name: str, default: int | None, low: int, high: int = ID_MAX) -> int | None:
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


def _filtered(ref: HubRef, request: HttpRequest) -> Any:
    rows = EventLog.objects.filter(**EventLog.scope(ref))
    kinds = [k for k in request.GET.get("kind", "").split(",") if k]
    unknown = set(kinds) - set(CATEGORIES)
    if unknown:
        raise ValueError(f"kind must be among {', '.join(CATEGORIES)}, got {', '.join(sorted(unknown))}")
    if kinds:
        match = Q(kind__in=[k for k in kinds if k not in ("release", "handoff")])
        handoff = Q(kind="release", handoff=True)
        if "release" in kinds:
            match |= Q(kind="release") & ~handoff
        if "handoff" in kinds:
            match |= handoff
        rows = rows.filter(match)
    partition = request.GET.get("partition", "")
    if partition:
        rows = rows.filter(partition_id=partition)
    worker = request.GET.get("worker", "")
    if worker:
        rows = rows.filter(Q(owner_id=worker) | Q(previous_owner=worker) | Q(reporter=worker))
    return rows


def _events(
    ref: HubRef, request: HttpRequest, after: int | None, before: int | None, limit: int
) -> list[dict[str, Any]]:
    rows = _filtered(ref, request)
    if after is not None:
        chosen = list(rows.filter(id__gt=after).order_by("id")[:limit])
    else:
        if before is not None:
            rows = rows.filter(id__lt=before)
        chosen = list(rows.order_by("-id")[:limit])[::-1]
    return [row.as_json() for row in chosen]


@read_only
def api_events(request: HttpRequest) -> JsonResponse:
    """Balancer events in id order: the first ``limit`` after ``after``, or else the newest ``limit``
    (before ``before``); filtered by ``kind`` (comma-separated categories), ``partition``, ``worker``."""
    try:
        ref = _ref(request)
        after = _int_param(request, "after", None, 0)
        before = _int_param(request, "before", None, 1)
        limit = _int_param(request, "limit", EVENTS_DEFAULT, 1, EVENTS_MAX)
        assert limit is not None
        if not _known_sync(ref):
            return _not_found(ref)
        return JsonResponse(events_for(request.user, _events(ref, request, after, before, limit)), safe=False)
    except ValueError as exc:
        return _bad_request(str(exc))


def _partition_detail(ref: HubRef, pid: str) -> dict[str, Any]:
    events = [row.as_json() for row in EventLog.objects.filter(**EventLog.scope(ref), partition_id=pid).order_by("id")]
    samples = [
        row.as_json() for row in LagSample.objects.filter(**LagSample.scope(ref), partition_id=pid).order_by("at")
    ]
    return {
        "timeline": history.ownership_timeline(events),
        "events": events[-200:],
        "samples": samples,
        "checkpoints": history.checkpoint_history(samples),
        "audit": actions.recent_audit(ref, 50, target=pid),
    }


@read_only
async def api_partition(request: HttpRequest, partition_id: str) -> JsonResponse:
    """One partition: current state, ownership timeline, events, lag samples, checkpoint moves, audit."""
    try:
        ref = _ref(request)
        check_partition_id(partition_id)
    except ValueError as exc:
        return _bad_request(str(exc))
    if not await _known(ref):
        return _not_found(ref)
    state, error = await _state_or_error(ref)
    current = state.partition(partition_id) if state is not None else None
    detail: dict[str, Any] = await _db.acall(_partition_detail, ref, partition_id)
    user = await request.auser()
    detail["audit"] = audit_for(user, detail["audit"])
    detail["events"] = events_for(user, detail["events"])
    detail.update(
        partition=current.as_json() if current is not None else None, error=error,
        generated_at=state.generated_at if state else None, last_event_id=state.last_event_id if state else None,
        lag_rules=lag_rules().as_json(),
    )  # fmt: skip
    return JsonResponse(detail)


def _history(ref: HubRef, quiet: float, partitions: int | None, staff: bool) -> dict[str, Any]:
    rows = EventLog.objects.filter(**EventLog.scope(ref), kind__in=(*history.OWNERSHIP, *history.OPERATOR))
    fields = ("id", "kind", "partition_id", "owner_id", "previous_owner", "reporter", "reason", "at", "handoff")
    newest: list[dict[str, Any]] = [dict(row) for row in rows.order_by("-id").values(*fields)[:HISTORY_EVENTS_MAX]]
    newest.reverse()
    for event in newest:
        event["reporter"] = reporter_for(staff, event["reporter"])
        event["category"] = category(event["kind"], event["handoff"])
    found = history.episodes(newest, quiet, partitions)
    return {
        "episodes": [e.as_json() for e in reversed(found)],
        "quiet": quiet,
        "partitions": partitions,
        "events": len(newest),
        "truncated": len(newest) >= HISTORY_EVENTS_MAX,
    }


@read_only
async def api_history(request: HttpRequest) -> JsonResponse:
    """Rebalances, newest first (``history.episodes``); ``quiet`` seconds end one (default expiry + interval)."""
    try:
        ref = _ref(request)
        default = settings.LEASEBOARD_EXPIRY + settings.LEASEBOARD_INTERVAL
        quiet = float(request.GET.get("quiet") or default)
        if not 0 < quiet <= 3600:
            raise ValueError(f"quiet must be between 0 and 3600 seconds, got {quiet}")
    except ValueError as exc:
        return _bad_request(str(exc))
    if not await _known(ref):
        return _not_found(ref)
    watched = host.running(ref)
    latest = watched.fresh(max_age=10.0) if watched is not None else None
    partitions = len(latest.partitions) if latest is not None else None
    staff = can_act(await request.auser())
    found: dict[str, Any] = await _db.acall(_history, ref, quiet, partitions, staff)
    return JsonResponse(found)


@read_only
def api_audit(request: HttpRequest) -> JsonResponse:
    """The audit log of the hub, newest first (``after`` an id; ``target`` a worker or partition)."""
    try:
        ref = _ref(request)
        limit = _int_param(request, "limit", 50, 1, EVENTS_MAX)
        after = _int_param(request, "after", 0, 0)
    except ValueError as exc:
        return _bad_request(str(exc))
    assert limit is not None and after is not None
    if not _known_sync(ref):
        return _not_found(ref)
    entries = actions.recent_audit(ref, limit, request.GET.get("target") or None, after)
    return JsonResponse(audit_for(request.user, entries), safe=False)


# --- actions ----------------------------------------------------------------------------------


Parsed = tuple[HubRef, actions.Request, str, Any]


async def _action_request(request: HttpRequest) -> Parsed | JsonResponse:
    user = await request.auser()
    try:
        request.body  # noqa: B018 (read once, here: Django refuses a body over DATA_UPLOAD_MAX_MEMORY_SIZE)
    except RequestDataTooBig:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return JsonResponse({"error": f"the body is larger than {limit} bytes", "code": "too_large"}, status=413)
    if not can_act(user):  # kept on the audit log: who tried what
        who = user.get_username() if user.is_authenticated else logins.ANONYMOUS
        await _db.acall(logins.refused_attempt, request, who, logins.parsed_body(request), STAFF_REQUIRED)
        return JsonResponse({"error": STAFF_REQUIRED, "code": "forbidden"}, status=403)
    try:
        data = json.loads(request.body or b"{}") if request.content_type == "application/json" else request.POST
        if not isinstance(data, dict) and not hasattr(data, "get"):
            raise ValueError("the body must be a JSON object")
        ref = parse_ref(data.get("hub"), data.get("consumer_group"))
        return ref, actions.parse(data), user.get_username(), data
    except TooManyFieldsSent:
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        return JsonResponse({"error": f"too many form fields: at most {limit}", "code": "bad_request"}, status=400)
    except (ValueError, actions.Refused) as exc:
        return JsonResponse({"error": str(exc), "code": "bad_request"}, status=400)


def _refusal(refusal: actions.Refused) -> JsonResponse:
    """400 for bad input (an unknown worker or partition included), 409 for what the fleet's state forbids."""
    return JsonResponse({"error": refusal.message, "code": refusal.code}, status=refusal.http_status)


@require_POST
async def action_preview(request: HttpRequest) -> JsonResponse:
    """The dry run of an action (staff, CSRF). 200 with it; 4xx with ``error`` and ``code`` when refused."""
    parsed = await _action_request(request)
    if isinstance(parsed, JsonResponse):
        return parsed
    ref, wanted, _, _ = parsed
    try:
        shown = await actions.preview(ref, wanted)
    except actions.Refused as refusal:
        return _refusal(refusal)
    except StoreError as exc:
        return JsonResponse({"error": f"store unavailable: {exc}", "code": "store"}, status=503)
    return JsonResponse(shown.as_json())


@require_POST
async def action_apply(request: HttpRequest) -> JsonResponse:
    """Apply a confirmed action (staff, CSRF, ``confirmed: true``); 200 with its audit entry."""
    parsed = await _action_request(request)
    if isinstance(parsed, JsonResponse):
        return parsed
    ref, wanted, user, body = parsed
    if body.get("confirmed") not in (True, "true", "on", "1"):
        return JsonResponse({"error": "preview the action first, then confirm it", "code": "unconfirmed"}, status=400)
    try:
        entry = await actions.apply(ref, wanted, user)
    except actions.Refused as refusal:
        return _refusal(refusal)
    except StoreError as exc:
        return JsonResponse({"error": f"store unavailable: {exc}", "code": "store"}, status=503)
    return JsonResponse(entry)


# --- metrics ----------------------------------------------------------------------------------


def _logged_by_kind(ref: HubRef) -> dict[str, int]:
    rows = EventLog.objects.filter(**EventLog.scope(ref)).values("kind").annotate(n=Count("id"))
    return {row["kind"]: row["n"] for row in rows}


@read_only
async def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text for the configured hub and consumer group (always 200; ``leaseboard_store_up``
    says whether the store answered). Open to Prometheus whatever ``LEASEBOARD_ANONYMOUS_READ`` says."""
    ref = parse_ref(None, None)
    state = await host.latest(ref, max_age=3.0)  # the monitor's (the first scrape waits for its first round)
    if state is None:  # it could not read the store lately: try once more here
        state, _ = await _state_or_error(ref)
    logged: dict[str, int] = {}
    extra: list[Collector] = [metrics.ConsoleLoad(host.running_count(), open_sockets(), await host.tasks_count())]
    try:
        logged = await _db.acall(_logged_by_kind, ref)
        extra.append(await _db.acall(PipelineCollector, ref.hub))
        database_up = True
    except DATABASE_ERRORS as exc:  # the event log's and the pipeline's series wait for the database
        report(exc)
        database_up = False
    else:
        health.ok(DATABASE)
    body = metrics.render(ref, state, logged, extra=extra, database_up=database_up)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
