"""The audit log of admin actions: one ``AuditEntry`` per operator's attempt (applied, refused or
failed), counted in ``leaseboard_admin_actions`` by action and outcome. Attempts refused before they
reached an action (no staff login, a bad CSRF token) and refused logins are no operator's: they are
counted, not kept here (``refusals.py``)."""

from __future__ import annotations

import logging
import time
from typing import Any

from balancer.model import HubRef

from ..dbthread import DatabaseThread
from ..live.metrics import ADMIN_ACTIONS
from ..models import AuditEntry
from .registry import NAMES
from .request import Request

log = logging.getLogger(__name__)
_db = DatabaseThread("leaseboard-audit")  # the dashboard's one way off the event loop: dbthread.py

OUTCOMES = (AuditEntry.APPLIED, AuditEntry.REFUSED, AuditEntry.FAILED)
# The metric's action labels: every action, "login" (logins.py) and "invalid" (an attempt refused
# before its action could be read): a fixed set, whatever a client sends.
LABELS = frozenset({*NAMES, "login"})
for _action in NAMES:  # every series exists from the start, at 0
    for _outcome in OUTCOMES:
        ADMIN_ACTIONS.labels(_action, _outcome)


def save(
    ref: HubRef, request: Request, user: str, outcome: str, message: str, detail: dict[str, Any]
) -> dict[str, Any]:
    """Save the entry (sync ORM), count and log it; return it as JSON (``AuditEntry.as_json``)."""
    ADMIN_ACTIONS.labels(request.action if request.action in LABELS else "invalid", outcome).inc()
    log.info("audit: %s %s (%s): %s — %s", user, request.describe(), outcome, request.reason, message)
    entry = AuditEntry.objects.create(
        **AuditEntry.scope(ref),
        at=time.time(),
        user=user[:255],
        action=request.action[:32],
        target=request.target[:255],
        value=request.value[:255],
        reason=request.reason,
        outcome=outcome,
        message=message,
        detail=detail,
    )
    return entry.as_json()


async def record(
    ref: HubRef, request: Request, user: str, outcome: str, message: str, detail: dict[str, Any]
) -> dict[str, Any]:
    """``save``, off the event loop."""
    saved: dict[str, Any] = await _db.acall(save, ref, request, user, outcome, message, detail)
    return saved


def recent_audit(ref: HubRef, limit: int = 50, target: str | None = None, after: int = 0) -> list[dict[str, Any]]:
    """Audit entries of ``ref``, newest first (sync ORM); ``target`` keeps one worker's or partition's."""
    rows = AuditEntry.objects.filter(**AuditEntry.scope(ref), id__gt=after)
    if target is not None:
        rows = rows.filter(target=target)
    return [row.as_json() for row in rows.order_by("-id")[:limit]]
