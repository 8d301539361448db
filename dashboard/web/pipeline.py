"""The Pipeline page: the Spark job's results (``workers.models``), its lag and its bad input.

``page`` renders ``pipeline.html``; its script polls ``api`` (``/api/pipeline?hub=``) every few
seconds. ``pipeline_state`` assembles that JSON from the database, the landing markers
(``workers.landing``: the newest landed event per partition) and the dead-letter files.
``PipelineCollector`` gives ``/metrics`` the same figures, whichever process runs the job.

Lag is newest landed against newest aggregated, both in enqueued time (the hub's clock): how far
the aggregates trail what the workers have landed. A batch's latency is the time from the
enqueueing of its newest event to the commit of its results. ``latency`` is the live latency of the
alerts and aggregates over the last minute (``pipeline_latency``); the alerts also stream live over
``/ws/pipeline/`` (``pipeline_feed``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Count, F, Max, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from workers.alerts import ALERTS_KEPT
from workers.landing_files import landing_root, read_markers
from workers.models import Alert, MinuteSummary, PipelineBatch, UnreadableFile
from workers.pipeline import cluster

from ..live.state import parse_ref
from .access import can_act, dead_letters_for
from .common import bad_request, int_param
from .methods import read_only
from .pipeline_latency import latency

SENSORS = ("motion", "door", "window", "glass_break", "smoke")
MINUTES = 30  # minutes of aggregates in the chart
LATEST = 20  # alerts, batches, unreadable files and dead letters listed
DEAD_LETTER_READ_LIMIT = 4 * 1024 * 1024  # bytes read per dead-letter file; beyond it, lines are only counted


def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def dead_letters(hub: str, latest: int = LATEST) -> dict[str, Any]:
    """{"count": distinct events set aside, "latest": newest entries (without bodies)} from the files."""
    folder = Path(getattr(settings, "LEASEBOARD_DEADLETTER_DIR", Path(settings.VAR_DIR) / "deadletter")) / hub
    keys: set[tuple[str, int]] = set()
    unparsed = 0  # lines of files too big to read whole (counted, not deduplicated)
    entries: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        try:
            with path.open("rb") as f:
                size = path.stat().st_size
                if size > DEAD_LETTER_READ_LIMIT:
                    unparsed += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
                    f.seek(size - DEAD_LETTER_READ_LIMIT)
                    lines = f.read().splitlines()[1:]  # the first is cut
                else:
                    lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            if size <= DEAD_LETTER_READ_LIMIT:
                keys.add((str(entry.get("partition_id")), int(entry.get("sequence_number", -1))))
            entry.pop("body_base64", None)
            entry.pop("amqp_base64", None)
            entries.append(entry)
    entries.sort(key=lambda e: e.get("set_aside_at") or 0.0)
    return {"count": len(keys) + unparsed, "latest": entries[-latest:][::-1]}


def _chart(hub: str) -> dict[str, Any]:
    """Events per minute per sensor type (and alerts per minute), the last MINUTES minutes that have data."""
    newest = MinuteSummary.objects.filter(hub=hub).aggregate(m=Max("minute"))["m"]
    if newest is None:
        return {"sensors": list(SENSORS), "series": []}
    first = newest - timedelta(minutes=MINUTES - 1)
    series: dict[datetime, dict[str, Any]] = {
        first + timedelta(minutes=i): {"events": dict.fromkeys(SENSORS, 0), "alerts": 0} for i in range(MINUTES)
    }
    sensors = list(SENSORS)
    for row in MinuteSummary.objects.filter(hub=hub, minute__gte=first):
        point = series.get(row.minute)
        if point is None:
            continue  # not on a minute boundary: not written by the pipeline
        if row.sensor not in sensors:
            sensors.append(row.sensor)
        point["events"][row.sensor] = point["events"].get(row.sensor, 0) + row.events
        point["alerts"] += row.alerts
    return {"sensors": sensors, "series": [{"minute": m.timestamp(), **p} for m, p in sorted(series.items())]}


def _lag(hub: str) -> dict[str, Any]:
    markers = read_markers(landing_root(), hub)
    landed = max((m.get("enqueued_time", 0.0) for m in markers.values()), default=None)
    aggregated = _ts(PipelineBatch.objects.filter(hub=hub).aggregate(m=Max("newest_enqueued"))["m"])
    seconds = None
    if landed is not None and aggregated is not None:
        seconds = max(landed - aggregated, 0.0)
    return {
        "newest_landed": landed,
        "newest_aggregated": aggregated,
        "seconds": seconds,
        "partitions_landed": len(markers),
    }


def _totals(hub: str) -> dict[str, Any]:
    counts = MinuteSummary.objects.filter(hub=hub).aggregate(events=Sum("events"), alerts=Sum("alerts"))
    batches = PipelineBatch.objects.filter(hub=hub)
    read = batches.filter(input_rows__isnull=False).aggregate(duplicates=Sum(F("input_rows") - F("events")))
    return {
        "events": counts["events"] or 0,
        "alerts": counts["alerts"] or 0,
        "batches": batches.aggregate(n=Count("id"))["n"],
        "duplicates": read["duplicates"] or 0,
        "unreadable_files": UnreadableFile.objects.filter(hub=hub).count(),
    }


def _spark(hub: str) -> dict[str, Any] | None:
    """The master and executors the driver last published (``workers.pipeline.cluster``), or None."""
    folder = Path(getattr(settings, "LEASEBOARD_PIPELINE_DIR", Path(settings.VAR_DIR) / "pipeline")) / hub
    return cluster.read(folder)


def newest_alerts(hub: str, count: int = LATEST) -> list[dict[str, Any]]:
    """The ``count`` newest alerts of ``hub`` by event time (the table's order on the page), newest first."""
    return [a.as_json() for a in Alert.objects.filter(hub=hub).order_by("-event_time", "-id")[:count]]


def pipeline_state(hub: str, alerts: int = LATEST) -> dict[str, Any]:
    """The ``/api/pipeline`` document of ``hub``, listing its ``alerts`` newest alerts."""
    newest_batches = list(PipelineBatch.objects.filter(hub=hub).order_by("-finished_at", "-id")[:LATEST])
    letters = dead_letters(hub)
    return {
        "hub": hub,
        "generated_at": time.time(),
        "chart": _chart(hub),
        "alerts": newest_alerts(hub, alerts),
        "batches": [b.as_json() for b in reversed(newest_batches)],
        "lag": _lag(hub),
        "totals": {**_totals(hub), "dead_letters": letters["count"]},
        "unreadable_files": [
            u.as_json() for u in UnreadableFile.objects.filter(hub=hub).order_by("-found_at", "-id")[:LATEST]
        ],
        "dead_letters": letters["latest"],
        "spark": _spark(hub),
        "latency": latency(hub),
    }


def _hub(request: HttpRequest) -> str:
    return parse_ref(request.GET.get("hub"), None).hub


@require_GET
def page(request: HttpRequest) -> HttpResponse:
    """The Pipeline page (its script polls ``api``)."""
    try:
        hub = _hub(request)
    except ValueError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain")
    context = {"hub": hub, "poll_seconds": 3, "alert_rows": LATEST, "can_act": can_act(request.user)}
    return render(request, "pipeline.html", context)


@read_only
def api(request: HttpRequest) -> JsonResponse:
    """200 with ``pipeline_state`` (dead letters' error texts for staff only); 400 for a bad hub name
    or a bad ``?alerts=`` (how many newest alerts to list: 1 to ALERTS_KEPT, default LATEST)."""
    try:
        hub = _hub(request)
        alerts = int_param(request, "alerts", LATEST, 1, ALERTS_KEPT)
    except ValueError as exc:
        return bad_request(str(exc))
    assert alerts is not None
    state = pipeline_state(hub, alerts)
    state["dead_letters"] = dead_letters_for(request.user, state["dead_letters"])
    return JsonResponse(state)


class PipelineCollector(Collector):
    """The pipeline's ``leaseboard_pipeline_…`` series, read from the database when built (sync code:
    build it outside the event loop), yielded at scrape."""

    def __init__(self, hub: str) -> None:
        self.hub = hub
        self.totals = _totals(hub)
        self.lag = _lag(hub)["seconds"]
        self.dead = dead_letters(hub, latest=0)["count"]

    def collect(self) -> Iterator[Metric]:
        labels = ["hub"]
        for name, doc, key in (
            ("leaseboard_pipeline_aggregated_events", "Distinct events in the pipeline's aggregates.", "events"),
            ("leaseboard_pipeline_raised_alerts", "Alerts the pipeline raised.", "alerts"),
            ("leaseboard_pipeline_committed_batches", "Micro-batches the pipeline committed.", "batches"),
            ("leaseboard_pipeline_dropped_duplicates", "Landed rows dropped as duplicates.", "duplicates"),
            ("leaseboard_pipeline_skipped_files", "Unreadable landing files reported and skipped.", "unreadable_files"),
        ):
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric([self.hub], self.totals[key])
            yield family
        dead = GaugeMetricFamily(
            "leaseboard_pipeline_dead_letter_events", "Events set aside in the hub's dead-letter files.", labels=labels
        )
        dead.add_metric([self.hub], self.dead)
        yield dead
        if self.lag is not None:
            lag = GaugeMetricFamily(
                "leaseboard_pipeline_lag_seconds",
                "Enqueued time of the newest landed event minus that of the newest aggregated one.",
                labels=labels,
            )
            lag.add_metric([self.hub], self.lag)
            yield lag
