"""OpenTelemetry traces of the workers (and of ``produce``), exported over OTLP/HTTP.

Off unless the standard OpenTelemetry variables ask for it (``wanted``): then nothing of the SDK is
imported, ``traced`` hands the handler back as it is and the sink's hook returns at once, so the
per-event cost is nil. On, ``setup`` builds a ``TracerProvider`` from the environment the way the
SDK reads it (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, the span
limits, ``OTEL_EXPORTER_OTLP_*`` for the exporter, ``OTEL_BSP_*`` for the batch processor) and makes
it the global provider, so a handler's own spans (and Azure's SDK's) join the same traces. Spans
leave through a ``BatchSpanProcessor``: ending a span only queues it, and a full queue drops spans
rather than wait, so handling never blocks on a collector.

What is traced (docs/tracing.md):

- ``process <hub>`` (CONSUMER), one per handler call: a child of the context the producer put on
  the event (``traceparent``, or ``Diagnostic-Id``: ``tracecarrier.py``); for a batch handler, a
  root with one link per event that carries a context. Partition, consumer group, hub, owner and
  sequence numbers are attributes; a failed call records its exception.
- A checkpoint is a ``checkpoint`` span event on the span of the last event it covers. That span is
  kept open, its end time already set aside, until the checkpoint is written, the next call starts
  or the partition changes hands, so a partition's spans reach the collector within about
  ``LEASEBOARD_CHECKPOINT_SECONDS`` of being handled.
- Ownership changes of a partition by one of this process's workers are span events too: a release,
  a loss or a heal on that open span when there is one (release and lost end it), else, and for
  every claim, expire and steal, on a short ``<kind> <hub>`` span of its own. Every ``process`` span
  also says how its worker got the partition (``leaseboard.ownership``).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from balancer.model import BalancerEvent, EventKind, HubRef
from workers.handlers import BATCH_ATTRIBUTE, Handler, PartitionContext, batch_size, is_async
from workers.runtime.tracecarrier import TRACEPARENT, trace_headers
from workers.sources.base import ReceivedEvent

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, SpanContext, Tracer

log = logging.getLogger("leaseboard.tracing")

# The collector's base URL for every signal (spans are POSTed to <it>/v1/traces); set, it turns tracing on.
ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
# The full URL spans are POSTed to, for traces alone (wins over OTEL_EXPORTER_OTLP_ENDPOINT); set, it turns tracing on.
TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
# Span exporters, comma-separated: otlp (OTLP/HTTP, the default), console, none (tracing off), or an installed
# exporter's entry point name; set to anything but none, it turns tracing on.
EXPORTERS = "OTEL_TRACES_EXPORTER"
# true: no tracing, whatever else is set.
DISABLED = "OTEL_SDK_DISABLED"
# The OTLP protocol: only http/protobuf is spoken here (another value is warned about, and HTTP used).
PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
# The OTLP protocol for traces alone (wins over OTEL_EXPORTER_OTLP_PROTOCOL).
TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"

ACQUIRED = frozenset({EventKind.CLAIM, EventKind.EXPIRE, EventKind.STEAL})
PARTITION_CHANGES = ACQUIRED | {EventKind.RELEASE, EventKind.LOST, EventKind.HEAL}
ENDING = frozenset({EventKind.RELEASE, EventKind.LOST})

_lock = threading.Lock()
_configured = False
_active: Tracing | None = None


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """True when the environment asks for traces: an OTLP endpoint or an exporter is named, the
    exporter is not ``none`` and the SDK is not disabled. ``OTEL_SERVICE_NAME`` alone does not."""
    if env.get(DISABLED, "").strip().lower() == "true":
        return False
    exporters = env.get(EXPORTERS, "").strip().lower()
    if exporters == "none":
        return False
    return bool(exporters or env.get(ENDPOINT, "").strip() or env.get(TRACES_ENDPOINT, "").strip())


def setup(service: str = "leaseboard-workers", env: Mapping[str, str] = os.environ) -> Tracing | None:
    """Tracing for this process once (later calls return the first one's result): None when the
    environment does not ask for it (``wanted``). ``service`` is the service name unless
    ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` names one."""
    global _configured, _active
    with _lock:
        if not _configured:
            _configured = True
            _active = _start(service, env) if wanted(env) else None
        return _active


def active() -> Tracing | None:
    """This process's tracing, None while off."""
    return _active


def _start(service: str, env: Mapping[str, str]) -> Tracing:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service}))
    provider = TracerProvider(resource=resource)  # the sampler and span limits from OTEL_*, shut down at exit
    for exporter in _exporters(env):
        provider.add_span_processor(BatchSpanProcessor(exporter))  # OTEL_BSP_* from the environment
    trace.set_tracer_provider(provider)
    tracing = Tracing(provider)
    atexit.register(tracing.close)  # after the provider's own hook, so it runs first: open spans end, then flush
    log.info("tracing on: service %s, exporters %s", resource.attributes.get(SERVICE_NAME), env.get(EXPORTERS, "otlp"))
    return tracing


def _exporters(env: Mapping[str, str]) -> Iterator[SpanExporter]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (otlp by default); an unknown one is logged and skipped."""
    for name in [n.strip().lower() for n in env.get(EXPORTERS, "otlp").split(",") if n.strip()] or ["otlp"]:
        if name in ("otlp", "otlp_proto_http"):
            protocol = env.get(TRACES_PROTOCOL) or env.get(PROTOCOL) or "http/protobuf"
            if protocol != "http/protobuf":
                log.warning("%s=%s: spans are exported over OTLP/HTTP (http/protobuf) all the same", PROTOCOL, protocol)
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            yield OTLPSpanExporter()  # OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, _HEADERS, _TIMEOUT, _COMPRESSION ...
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            yield ConsoleSpanExporter()
        elif name != "none":
            from importlib.metadata import entry_points

            found = entry_points(group="opentelemetry_traces_exporter", name=name)
            if not found:
                log.warning("%s: no span exporter named %r is installed; skipped", EXPORTERS, name)
                continue
            yield next(iter(found)).load()()


def traced(handler: Handler, ctx: PartitionContext) -> Handler:
    """``handler`` itself while tracing is off; else the same handler (sync or async, batch size kept)
    calling it inside a ``process`` span of ``ctx``'s partition."""
    tracing = _active
    if tracing is None:
        return handler
    pump = tracing.pump(ctx.ref, ctx.partition_id, ctx.owner_id)
    size = batch_size(handler)
    wrapper: Any = (_AsyncTraced if is_async(handler) else _Traced)(handler, pump, size is not None)
    if size is not None:
        setattr(wrapper, BATCH_ATTRIBUTE, size)
    return wrapper  # type: ignore[no-any-return]


def pump_trace(ref: HubRef, partition_id: str, owner_id: str) -> PumpTrace | None:
    """The spans of one worker's partition, None while tracing is off (the checkpointer's hook)."""
    return None if _active is None else _active.pump(ref, partition_id, owner_id)


def ownership(event: BalancerEvent) -> None:
    """The sink's hook: ``event`` as a span event, while tracing is on."""
    if _active is not None and event.kind in PARTITION_CHANGES:
        _active.ownership(event)


class Tracing:
    """One process's tracer, the W3C propagator, and the spans of its workers' partitions."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("leaseboard")
        self.propagator = TraceContextTextMapPropagator()
        self._pumps: dict[tuple[HubRef, str, str], PumpTrace] = {}
        self.acquired: dict[tuple[HubRef, str, str], str] = {}  # how each worker got each partition
        self._lock = threading.Lock()

    def pump(self, ref: HubRef, partition_id: str, owner_id: str) -> PumpTrace:
        key = (ref, partition_id, owner_id)
        with self._lock:
            found = self._pumps.get(key)
            if found is None:
                found = self._pumps[key] = PumpTrace(self, key)
            return found

    def context_of(self, event: ReceivedEvent) -> Context | None:
        """The producer's context on ``event`` (a valid ``traceparent``), else None."""
        from opentelemetry.trace import get_current_span

        headers = dict(event.trace_context) or trace_headers(event.amqp)
        if TRACEPARENT not in headers:
            return None
        context = self.propagator.extract(headers)
        return context if get_current_span(context).get_span_context().is_valid else None

    def span_context_of(self, event: ReceivedEvent) -> SpanContext | None:
        from opentelemetry.trace import get_current_span

        context = self.context_of(event)
        return None if context is None else get_current_span(context).get_span_context()

    def ownership(self, event: BalancerEvent) -> None:
        """``event`` as a span event: a release, a loss or a heal on the partition's open span, if
        any (a release or a loss ends it); a claim (a new ownership) on a short span of its own."""
        key = (event.ref, event.partition_id, event.reporter)
        change = {
            "leaseboard.new_owner": event.owner_id or "",
            "leaseboard.previous_owner": event.previous_owner or "",
            "leaseboard.reason": event.reason,
            "leaseboard.handoff": event.handoff,
        }
        pump = self._pumps.get(key)
        if event.kind in ACQUIRED:
            self.acquired[key] = event.kind.value
            if pump is not None:
                pump.settle()  # a span left open by an earlier ownership is not this one's
        elif pump is not None and pump.note(event.kind.value, change, end=event.kind in ENDING):
            return
        partition = partition_attributes(event.ref, event.partition_id, event.reporter)
        self.event_span(f"{event.kind.value} {event.ref.hub}", partition, event.kind.value, change)

    def event_span(self, name: str, attributes: dict[str, Any], event: str, event_attributes: dict[str, Any]) -> None:
        """A short span with ``attributes`` holding one span event (a change with no open span to go on)."""
        from opentelemetry.trace import SpanKind

        span = self.tracer.start_span(name, kind=SpanKind.INTERNAL, attributes=attributes)
        span.add_event(event, event_attributes)
        span.end()

    def close(self) -> None:
        """End every span kept open (at exit, before the provider flushes)."""
        with self._lock:
            pumps = list(self._pumps.values())
        for pump in pumps:
            pump.settle()


def partition_attributes(ref: HubRef, partition_id: str, owner_id: str) -> dict[str, Any]:
    """The attributes every span of one worker's partition has (OpenTelemetry's messaging conventions)."""
    return {
        "messaging.system": "eventhubs",
        "server.address": ref.namespace,
        "messaging.destination.name": ref.hub,
        "messaging.consumer.group.name": ref.consumer_group,
        "messaging.destination.partition.id": partition_id,
        "leaseboard.owner_id": owner_id,
    }


class PumpTrace:
    """The ``process`` spans of one worker's partition, and the one kept open for its checkpoint.

    Started and finished in the pump's thread (or on the loop for an async handler); checkpoints and
    ownership changes come from the loop, possibly while a call runs: the open span is guarded."""

    def __init__(self, tracing: Tracing, key: tuple[HubRef, str, str]) -> None:
        ref, partition_id, owner_id = key
        self._tracing = tracing
        self._key = key
        self._name = f"process {ref.hub}"
        self._partition = partition_attributes(ref, partition_id, owner_id)
        self._attributes = {**self._partition, "messaging.operation.type": "process"}
        self._checkpoint_name = f"checkpoint {ref.hub}"
        self._open: Span | None = None
        self._open_end: int | None = None  # when its handler call ended (ns)
        self._lock = threading.Lock()

    def start(self, events: Sequence[ReceivedEvent], batch: bool) -> Span:
        """A ``process`` span for one handler call with ``events`` (the previous one ends now)."""
        from opentelemetry.trace import Link, SpanKind

        self.settle()
        tracing = self._tracing
        attributes = {
            **self._attributes,
            "leaseboard.ownership": tracing.acquired.get(self._key, "unknown"),
            "leaseboard.sequence_number.first": events[0].sequence_number,
            "leaseboard.sequence_number.last": events[-1].sequence_number,
        }
        if not batch:
            parent = tracing.context_of(events[0])
            return tracing.tracer.start_span(self._name, parent, kind=SpanKind.CONSUMER, attributes=attributes)
        attributes["messaging.batch.message_count"] = len(events)
        links = [Link(c) for c in map(tracing.span_context_of, events) if c is not None]
        return tracing.tracer.start_span(self._name, kind=SpanKind.CONSUMER, attributes=attributes, links=links)

    def finish(self, span: Span, error: BaseException | None) -> None:
        """The call of ``span`` returned (or raised ``error``): the span waits for its checkpoint."""
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        with self._lock:
            previous, self._open, self._open_end = self._open, span, time.time_ns()
        if previous is not None:
            previous.end()  # only when calls overlap (a stuck handler given up on): not kept twice

    def settle(self) -> None:
        """End the open span, if any, at the time its call ended."""
        with self._lock:
            span, end, self._open, self._open_end = self._open, self._open_end, None, None
        if span is not None:
            span.end(end_time=end)

    def note(self, name: str, attributes: dict[str, Any], *, end: bool = False) -> bool:
        """Add span event ``name`` to the open span (then end it, with ``end``); False when none is open."""
        with self._lock:
            span = self._open
            if span is None:
                return False
            span.add_event(name, attributes)
        if end:
            self.settle()
        return True

    def checkpointed(self, sequence_number: int, offset: str, events: int) -> None:
        """A checkpoint was written: a ``checkpoint`` span event on the span of the last event it covers."""
        attributes = {
            "leaseboard.checkpoint.sequence_number": sequence_number,
            "leaseboard.checkpoint.offset": offset,
            "leaseboard.checkpoint.events": events,
        }
        if not self.note("checkpoint", attributes, end=True):
            self._tracing.event_span(self._checkpoint_name, self._partition, "checkpoint", attributes)


class _Traced:
    """A sync handler called inside a ``process`` span, the span current meanwhile."""

    def __init__(self, handler: Handler, pump: PumpTrace, batch: bool) -> None:
        from opentelemetry import context, trace

        self._handler = handler
        self._pump = pump
        self._batch = batch
        self._attach, self._detach, self._current = context.attach, context.detach, trace.set_span_in_context

    def __call__(self, arg: Any, ctx: PartitionContext) -> Any:
        span = self._pump.start(arg if self._batch else (arg,), self._batch)
        token = self._attach(self._current(span))
        try:
            result = self._handler(arg, ctx)
        except BaseException as exc:
            self._detach(token)
            self._pump.finish(span, exc)
            raise
        self._detach(token)
        self._pump.finish(span, None)
        return result


class _AsyncTraced(_Traced):
    """An async handler called inside a ``process`` span."""

    async def __call__(self, arg: Any, ctx: PartitionContext) -> Any:
        span = self._pump.start(arg if self._batch else (arg,), self._batch)
        token = self._attach(self._current(span))
        try:
            result = await self._handler(arg, ctx)
        except BaseException as exc:
            self._detach(token)
            self._pump.finish(span, exc)
            raise
        self._detach(token)
        self._pump.finish(span, None)
        return result
