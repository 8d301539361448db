"""Attempts refused before they reached an operator's action, counted, not kept as text (issue 37).

Anyone can send a wrong password, an action without a staff login or a POST without the CSRF token,
as often as they like and with whatever text they like. Such an attempt is no operator's act, so it
is not on the audit log: it adds one to a count per kind, client address and account
(``models.Refusal``), where the account is one only when it exists (a known user name tried, or the
non-staff user who was logged in): nothing an unauthenticated sender wrote is stored, and the
operators' entries stay what they did. At most ``KEPT`` counts are kept (those whose last attempt is
oldest go first), each attempt is one ``leaseboard_refused_attempts_total{kind}``, and a source's
refusals of one kind are logged at most every ``LOG_EVERY`` seconds. ``/api/refusals`` shows the
counts, the addresses and accounts to staff only.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import F, Sum

from ..live.metrics import REFUSED_ATTEMPTS
from ..models import Refusal
from .request import storable

log = logging.getLogger("dashboard.control.logins")

KINDS = ("login", "lockout", "action", "csrf")
KEPT = 1000  # counts at most (one per kind, address and account)
LOG_EVERY = 60.0  # seconds between two log lines of one source's refusals of one kind
_logged: dict[tuple[str, str], float] = {}  # (kind, source) -> when last logged, in this process

for _kind in KINDS:  # every series exists from the start, at 0
    REFUSED_ATTEMPTS.labels(_kind)


def account(name: str) -> str:
    """``name`` when it is an existing account's user name, else "" (what was typed is not kept)."""
    if not name or len(name) > 150 or not storable(name):
        return ""
    return name if get_user_model().objects.filter(username=name).exists() else ""


def count(kind: str, source: str, user: str = "") -> None:
    """One more refusal of ``kind`` from ``source`` for the account ``user`` ("" for none) (sync ORM)."""
    assert kind in KINDS, kind
    REFUSED_ATTEMPTS.labels(kind).inc()
    source, now = (source if storable(source) else "unknown")[:255], time.time()
    key = {"kind": kind, "source": source, "user": user[:150]}
    if not Refusal.objects.filter(**key).update(count=F("count") + 1, last_at=now):
        try:
            with transaction.atomic():
                Refusal.objects.create(**key, count=1, first_at=now, last_at=now)
        except IntegrityError:  # another request made it meanwhile
            Refusal.objects.filter(**key).update(count=F("count") + 1, last_at=now)
        else:
            _trim()
    if now - _logged.get((kind, source), 0.0) >= LOG_EVERY:
        if len(_logged) > 10 * KEPT:
            _logged.clear()
        _logged[(kind, source)] = now
        named = f" for {user!r}" if user else ""
        log.warning("refused %s attempt from %s%s (counted: /api/refusals)", kind, source, named)


def _trim() -> None:
    extra = Refusal.objects.count() - KEPT
    if extra > 0:
        oldest = list(Refusal.objects.order_by("last_at", "id").values_list("id", flat=True)[:extra])
        Refusal.objects.filter(id__in=oldest).delete()


def summary(staff: bool, limit: int = 50) -> dict[str, Any]:
    """The counts, most recent first (at most ``limit``), and their totals by kind (sync ORM)."""
    rows = Refusal.objects.order_by("-last_at", "-id")[:limit]
    totals = {kind: 0 for kind in KINDS}
    for kind, total in Refusal.objects.values_list("kind").annotate(total=Sum("count")):
        totals[kind] = int(total or 0)
    return {"totals": totals, "counts": [row.as_json(staff) for row in rows], "kept": Refusal.objects.count()}
