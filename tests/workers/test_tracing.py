"""Traces end to end: real ``runworkers`` and ``produce`` processes exporting OpenTelemetry spans over
OTLP/HTTP to a real receiver (``tests.support.otlp``) on a loopback port; and tracing left off when no
``OTEL_*`` variable asks for it. Waiting is polling with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from balancer.model import BalancerEvent, EventKind, HubRef
from tests.support.otlp import Collector, Received, collector
from tests.support.processes import ROOT, SqlSite, manage, sql_site_fixtures
from workers.handlers import PartitionContext, is_async
from workers.runtime import tracing
from workers.runtime.tracecarrier import properties_section, trace_headers
from workers.runtime.tracing import wanted
from workers.sources.base import ReceivedEvent

PARTITIONS = 2
REF = HubRef("localhost", "traced", "$Default")
OTEL = {"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SERVICE_NAME": "traced-workers"}
PID, FIRST, LAST = (
    "messaging.destination.partition.id",
    "leaseboard.sequence_number.first",
    "leaseboard.sequence_number.last",
)


@dataclass
class Site(SqlSite):
    def start(self, handler: str, endpoint: str) -> subprocess.Popen[bytes]:
        command = manage(
            *("runworkers", "--count", "1", "--owner-prefix", "W", "--store", "sql", "--source", "embedded"),
            *("--hub", REF.hub, "--interval", "0.5", "--expiry", "3", "--handler", handler),
            *("--checkpoint-events", "100", "--checkpoint-seconds", "0.5", "--shutdown-timeout", "5"),
        )
        return self.spawn("workers", command, {**self.env, **OTEL, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})


environment, site = sql_site_fixtures(Site, REF, partitions=PARTITIONS)


@pytest.fixture(name="otlp")
def otlp_fixture() -> Iterator[Collector]:
    with collector() as running:
        yield running


def traceparent(n: int) -> tuple[str, str, str]:
    """(traceparent, trace id, span id) of a made-up producer span, number ``n``."""
    trace_id, span_id = f"{n + 1:032x}", f"{n + 1:016x}"
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


@pytest.mark.slow
async def test_each_handled_event_is_a_span_under_its_producer_s_context_with_checkpoints_and_ownership(
    site: Site, otlp: Collector
) -> None:
    sent: dict[tuple[str, int], tuple[str, str]] = {}  # (partition, sequence) -> producer's (trace id, span id)
    for pid in site.hub.partition_ids():
        for _ in range(3):
            header, trace_id, span_id = traceparent(len(sent))
            event = site.hub.send_batch([b"{}"], partition_id=pid, amqp=[properties_section({"traceparent": header})])
            sent[(pid, event[0].sequence_number)] = (trace_id, span_id)
    site.hub.send(b"{}", partition_id="0")  # no context: a root span
    site.start("tests.workers.traced_handlers.one", otlp.endpoint)

    def processed() -> list[Received] | None:
        spans = otlp.spans("process traced")
        return spans if len(spans) >= len(sent) + 1 else None

    spans = await site.until(processed, 60, "a process span per event")
    assert len(spans) == len(sent) + 1
    for span in spans:
        assert span.kind == "consumer" and span.service == "traced-workers"
        assert span.attributes["messaging.destination.name"] == REF.hub
        assert span.attributes["messaging.consumer.group.name"] == REF.consumer_group
        assert span.attributes["leaseboard.owner_id"] == "W-0"
        assert span.attributes["leaseboard.ownership"] == "claim"
        where = (span.attributes[PID], span.attributes[FIRST])
        if where in sent:
            assert (span.trace_id, span.parent_span_id) == sent[where]
        else:
            assert where == ("0", 3) and span.parent_span_id == ""  # the event without a context: a root
    work = otlp.spans("handler work")
    assert {(w.trace_id, w.parent_span_id) for w in work} >= {(s.trace_id, s.span_id) for s in spans}

    def checkpointed() -> dict[str, int] | None:
        found = {
            s.attributes[PID]: e["leaseboard.checkpoint.sequence_number"]
            for s in otlp.spans()
            for name, e in s.events
            if name == "checkpoint"
        }
        return found if found == {"0": 3, "1": 2} else None

    await site.until(checkpointed, 30, "checkpoint span events at each partition's last event")
    claims = [s for s in otlp.spans() if s.event("claim") is not None]
    assert sorted(s.attributes[PID] for s in claims) == ["0", "1"]

    site.processes["workers"].send_signal(signal.SIGTERM)
    await site.until(lambda: site.processes["workers"].poll() is not None, 30, "the worker to exit")
    assert site.processes["workers"].returncode == 0
    releases = [s for s in otlp.spans() if s.event("release") is not None]
    assert sorted(s.attributes[PID] for s in releases) == ["0", "1"]


@pytest.mark.slow
async def test_produce_puts_its_span_s_context_on_each_event_and_a_batch_span_links_to_them(
    site: Site, otlp: Collector
) -> None:
    env = {**site.env, **OTEL, "OTEL_SERVICE_NAME": "traced-producer", "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint}
    produce = manage("produce", "--hub", REF.hub, "--count", "10", "--rate", "0", "--seed", "1")
    subprocess.run(produce, cwd=ROOT, env=env, check=True, timeout=120, capture_output=True)
    sends = await site.until(lambda: len(otlp.spans("send traced")) >= 10 and otlp.spans("send traced"), 30, "sends")
    assert {s.kind for s in sends} == {"producer"} and {s.service for s in sends} == {"traced-producer"}
    site.start("tests.workers.traced_handlers.batch", otlp.endpoint)

    def batches() -> list[Received] | None:
        spans = otlp.spans("process traced")
        total = sum(s.attributes["messaging.batch.message_count"] for s in spans)
        return spans if total >= 10 else None

    spans = await site.until(batches, 60, "process spans of batches covering the 10 events")
    assert sorted(link for s in spans for link in s.links) == sorted((s.trace_id, s.span_id) for s in sends)
    for span in spans:
        assert len(span.links) == span.attributes["messaging.batch.message_count"]
        assert span.attributes[LAST] - span.attributes[FIRST] + 1 == len(span.links)
    assert len({(s.attributes[PID], s.attributes["leaseboard.sequence_number"]) for s in sends}) == 10


def test_trace_headers_read_traceparent_or_else_diagnostic_id() -> None:
    header = traceparent(7)[0]
    assert trace_headers(properties_section({"traceparent": header, "tracestate": "a=b", "x": "y"})) == {
        "traceparent": header,
        "tracestate": "a=b",
    }
    assert trace_headers(properties_section({"Diagnostic-Id": header})) == {"traceparent": header}
    assert trace_headers(b"") == {} and trace_headers(b"\x00\x53\x74") == {}


def test_tracing_is_wanted_only_when_an_endpoint_or_exporter_is_named() -> None:
    assert not wanted({})
    assert not wanted({"OTEL_SERVICE_NAME": "x"})
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert not wanted({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert not wanted({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})


CHECK_OFF = """
import json, sys, django
django.setup()
from opentelemetry import trace
from balancer.model import HubRef
from workers.handlers import PartitionContext
from workers.runtime import tracing
from workers.wiring import build_fleet
ref = HubRef("localhost", "sensors", "$Default")
def handler(event, ctx): pass
print(json.dumps({
    "setup": tracing.setup() is None,
    "handler": tracing.traced(handler, PartitionContext(ref, "0", "w")) is handler,
    "pump": tracing.pump_trace(ref, "0", "w") is None,
    "sdk": sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk")),
    "provider": type(trace.get_tracer_provider()).__name__,
}))
"""


def test_with_no_otel_variable_set_nothing_is_initialised() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["DJANGO_SETTINGS_MODULE"] = "dashboard.settings"
    done = subprocess.run([sys.executable, "-c", CHECK_OFF], cwd=ROOT, env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    found = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert found == {"setup": True, "handler": True, "pump": True, "sdk": [], "provider": "ProxyTracerProvider"}


@pytest.fixture(name="spans")
def spans_fixture(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process with a provider of its own (not the global one), spans kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_active", tracing.Tracing(provider))
    yield exporter
    provider.shutdown()


def event(sequence: int, header: str | None = None) -> ReceivedEvent:
    amqp = properties_section({"traceparent": header}) if header else b""
    return ReceivedEvent("0", sequence, str(sequence), 0.0, None, b"{}", amqp)


def finished(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


async def test_an_async_handler_s_failure_is_recorded_and_its_span_waits_for_the_checkpoint(
    spans: InMemorySpanExporter,
) -> None:
    ctx = PartitionContext(REF, "0", "W-0")

    async def handler(received: ReceivedEvent, ctx: PartitionContext) -> None:
        if received.sequence_number == 1:
            raise ValueError("bad event")

    wrapped = tracing.traced(handler, ctx)
    assert wrapped is not handler and is_async(wrapped)
    header, trace_id, span_id = traceparent(1)
    await wrapped(event(0, header), ctx)
    assert finished(spans, "process traced") == []  # open until its checkpoint or the next call
    with pytest.raises(ValueError):
        await wrapped(event(1), ctx)
    first = finished(spans, "process traced")
    assert len(first) == 1 and first[0].parent is not None
    assert (f"{first[0].parent.trace_id:032x}", f"{first[0].parent.span_id:016x}") == (trace_id, span_id)
    pump = tracing.pump_trace(REF, "0", "W-0")
    assert pump is not None
    pump.checkpointed(1, "1", 2)
    failed = finished(spans, "process traced")[1]
    assert failed.status.status_code.name == "ERROR"
    assert [e.name for e in failed.events] == ["exception", "checkpoint"]
    assert failed.end_time is not None and failed.events[-1].timestamp >= failed.end_time


def test_a_claim_gets_a_span_of_its_own_and_a_release_ends_the_open_span(spans: InMemorySpanExporter) -> None:
    ctx = PartitionContext(REF, "0", "W-0")
    wrapped = tracing.traced(lambda received, ctx: None, ctx)

    def change(kind: EventKind) -> BalancerEvent:
        return BalancerEvent(kind, REF, "0", "W-0", None, "W-0", "test", 0.0)

    tracing.ownership(change(EventKind.CLAIM))
    (claim,) = finished(spans, "claim traced")
    assert [e.name for e in claim.events] == ["claim"] and claim.attributes is not None
    assert claim.attributes["messaging.destination.partition.id"] == "0"
    wrapped(event(0), ctx)
    tracing.ownership(change(EventKind.RELEASE))
    (process,) = finished(spans, "process traced")
    assert [e.name for e in process.events] == ["release"] and process.attributes is not None
    assert process.attributes["leaseboard.ownership"] == "claim"
