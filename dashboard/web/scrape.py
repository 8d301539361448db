"""``/metrics``: the Prometheus text of the configured hub and consumer group."""

from __future__ import annotations

from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from balancer.model import HubRef

from ..live import metrics
from ..live.health import DATABASE, DATABASE_ERRORS, health, report
from ..live.host import host
from ..live.state import parse_ref
from ..models import EventLog
from .common import db, state_or_error
from .consumers import open_sockets
from .methods import read_only
from .pipeline import PipelineCollector


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
        state, _ = await state_or_error(ref)
    logged: dict[str, int] = {}
    extra: list[Collector] = [metrics.ConsoleLoad(host.running_count(), open_sockets(), await host.tasks_count())]
    try:
        logged = await db.acall(_logged_by_kind, ref)
        extra.append(await db.acall(PipelineCollector, ref.hub))
        database_up = True
    except DATABASE_ERRORS as exc:  # the event log's and the pipeline's series wait for the database
        report(exc)
        database_up = False
    else:
        health.ok(DATABASE)
    body = metrics.render(ref, state, logged, extra=extra, database_up=database_up)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
