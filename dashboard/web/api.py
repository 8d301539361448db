"""The console's read API: the state, the events, one partition, the rebalances and the audit log.
Who may read which fields is ``access.py``'s business."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, JsonResponse

from balancer.model import HubRef

from ..control import actions, refusals
from ..live import history
from ..live.console import Json
from ..live.host import host
from ..live.state import lag_rules, last_served, remember
from ..models import EventLog, LagSample, category
from .access import audit_for, can_act, events_for, reporter_for
from .common import (
    CATEGORIES,
    EVENTS_DEFAULT,
    EVENTS_MAX,
    HISTORY_EVENTS_MAX,
    bad_request,
    check_partition_id,
    db,
    int_param,
    known,
    known_sync,
    not_found,
    query_ref,
    state_or_error,
)
from .degrade import unavailable_json
from .methods import read_only


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
        ref = query_ref(request)
    except ValueError as exc:
        return bad_request(str(exc))
    if not await known(ref):
        return not_found(ref)
    state, error = await state_or_error(ref)
    if state is None:
        assert error is not None
        last = _last_known(ref)
        if last is None:
            return unavailable_json(error)
        return JsonResponse({**last, "stale": True, "error": error})
    served = state.as_json()
    remember(ref, served)
    return JsonResponse({**served, "stale": False})


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
        ref = query_ref(request)
        after = int_param(request, "after", None, 0)
        before = int_param(request, "before", None, 1)
        limit = int_param(request, "limit", EVENTS_DEFAULT, 1, EVENTS_MAX)
        assert limit is not None
        if not known_sync(ref):
            return not_found(ref)
        return JsonResponse(events_for(request.user, _events(ref, request, after, before, limit)), safe=False)
    except ValueError as exc:
        return bad_request(str(exc))


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
        ref = query_ref(request)
        check_partition_id(partition_id)
    except ValueError as exc:
        return bad_request(str(exc))
    if not await known(ref):
        return not_found(ref)
    state, error = await state_or_error(ref)
    current = state.partition(partition_id) if state is not None else None
    detail: dict[str, Any] = await db.acall(_partition_detail, ref, partition_id)
    user = await request.auser()
    detail["audit"] = audit_for(user, detail["audit"])
    detail["events"] = events_for(user, detail["events"])
    detail.update(
        partition=current.as_json() if current is not None else None,
        error=error,
        generated_at=state.generated_at if state else None,
        last_event_id=state.last_event_id if state else None,
        lag_rules=lag_rules().as_json(),
    )
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
        ref = query_ref(request)
        default = settings.LEASEBOARD_EXPIRY + settings.LEASEBOARD_INTERVAL
        quiet = float(request.GET.get("quiet") or default)
        if not 0 < quiet <= 3600:
            raise ValueError(f"quiet must be between 0 and 3600 seconds, got {quiet}")
    except ValueError as exc:
        return bad_request(str(exc))
    if not await known(ref):
        return not_found(ref)
    watched = host.running(ref)
    latest = watched.fresh(max_age=10.0) if watched is not None else None
    partitions = len(latest.partitions) if latest is not None else None
    staff = can_act(await request.auser())
    found: dict[str, Any] = await db.acall(_history, ref, quiet, partitions, staff)
    return JsonResponse(found)


@read_only
def api_audit(request: HttpRequest) -> JsonResponse:
    """The audit log of the hub, newest first (``after`` an id; ``target`` a worker or partition)."""
    try:
        ref = query_ref(request)
        limit = int_param(request, "limit", 50, 1, EVENTS_MAX)
        after = int_param(request, "after", 0, 0)
    except ValueError as exc:
        return bad_request(str(exc))
    assert limit is not None and after is not None
    if not known_sync(ref):
        return not_found(ref)
    entries = actions.recent_audit(ref, limit, request.GET.get("target") or None, after)
    return JsonResponse(audit_for(request.user, entries), safe=False)


@read_only
def api_refusals(request: HttpRequest) -> JsonResponse:
    """Attempts refused before an operator's action, counted (``control/refusals.py``): addresses and
    accounts for staff only."""
    try:
        limit = int_param(request, "limit", 50, 1, EVENTS_MAX)
    except ValueError as exc:
        return bad_request(str(exc))
    assert limit is not None
    return JsonResponse(refusals.summary(can_act(request.user), limit))


# --- actions ----------------------------------------------------------------------------------
