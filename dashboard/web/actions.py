"""The admin actions' endpoints: a preview (the dry run) and an apply, staff only, with a CSRF token.
The actions themselves are ``control/``'s."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from balancer.errors import StoreError
from balancer.model import HubRef

from ..control import actions, logins
from ..live.state import parse_ref
from .access import STAFF_REQUIRED, can_act
from .common import db

Parsed = tuple[HubRef, actions.Request, str, Any]


async def _action_request(request: HttpRequest) -> Parsed | JsonResponse:
    user = await request.auser()
    try:
        request.body  # noqa: B018 (read once, here: Django refuses a body over DATA_UPLOAD_MAX_MEMORY_SIZE)
    except RequestDataTooBig:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return JsonResponse({"error": f"the body is larger than {limit} bytes", "code": "too_large"}, status=413)
    if not can_act(user):  # counted, not read (control/refusals.py): the audit log is the operators'
        await db.acall(logins.refused_attempt, request, user.get_username() if user.is_authenticated else "")
        return JsonResponse({"error": STAFF_REQUIRED, "code": "forbidden"}, status=403)
    if _from_another_site(request):
        await db.acall(logins.refused_attempt, request, user.get_username(), "csrf")
        return JsonResponse({"error": OTHER_SITE, "code": "csrf"}, status=403)
    try:
        data = _json(request.body) if request.content_type == "application/json" else request.POST
        if not isinstance(data, dict) and not hasattr(data, "get"):
            raise ValueError("the body must be a JSON object")
        ref = parse_ref(data.get("hub"), data.get("consumer_group"))
        return ref, actions.parse(data), user.get_username(), data
    except TooManyFieldsSent:
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        return JsonResponse({"error": f"too many form fields: at most {limit}", "code": "bad_request"}, status=400)
    except (ValueError, actions.Refused) as exc:
        return JsonResponse({"error": str(exc), "code": "bad_request"}, status=400)


OTHER_SITE = "refused: the request's Referer names another site"


def _from_another_site(request: HttpRequest) -> bool:
    """A Referer naming another host, on a request without an Origin. Django compares the Origin header
    whenever there is one, but the Referer only over HTTPS: over plain HTTP (the development
    settings) a page elsewhere could act with a stolen token. Browsers send one or the other."""
    if request.META.get("HTTP_ORIGIN"):
        return False
    referer = str(request.META.get("HTTP_REFERER") or "")
    return bool(referer) and urlsplit(referer).netloc != request.get_host()


def _json(body: bytes) -> Any:
    try:
        return json.loads(body or b"{}")
    except RecursionError:
        raise ValueError("the body is nested too deeply to be read") from None


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
