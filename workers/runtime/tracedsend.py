"""The embedded producer's side of tracing (``manage.py produce``): while tracing is on, each event is
sent inside a ``send <hub>`` span (PRODUCER) whose context goes with it as a W3C ``traceparent``
application property, as Azure's SDKs do, so the worker that handles it continues the trace.
"""

from __future__ import annotations

from typing import Any, cast

from workers.hub.embedded import EmbeddedHub
from workers.runtime.tracecarrier import properties_section
from workers.runtime.tracing import Tracing, setup
from workers.sources.base import ReceivedEvent


def traced_sends(hub: EmbeddedHub, name: str) -> EmbeddedHub:
    """``hub`` itself while tracing is off (``tracing.setup``, service ``leaseboard-producer``); else
    ``hub`` whose ``send`` puts each event in a span and its context on the event."""
    tracing = setup("leaseboard-producer")
    return hub if tracing is None else cast(EmbeddedHub, TracedSends(hub, tracing, name))


class TracedSends:
    """``send`` as ``EmbeddedHub.send``, in a ``send <hub>`` span; anything else is the hub's."""

    def __init__(self, hub: EmbeddedHub, tracing: Tracing, name: str) -> None:
        self._hub = hub
        self._tracing = tracing
        self._name = f"send {name}"
        self._attributes = {
            "messaging.system": "eventhubs",
            "messaging.destination.name": name,
            "messaging.operation.type": "send",
        }

    def send(self, body: bytes, *, partition_key: str | None = None, partition_id: str | None = None) -> ReceivedEvent:
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

        span = self._tracing.tracer.start_span(self._name, kind=SpanKind.PRODUCER, attributes=self._attributes)
        carrier: dict[str, str] = {}
        self._tracing.propagator.inject(carrier, context=set_span_in_context(span))
        try:
            sent = self._hub.send_batch(
                [body], partition_key=partition_key, partition_id=partition_id, amqp=[properties_section(carrier)]
            )[0]
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            span.end()
            raise
        span.set_attribute("messaging.destination.partition.id", sent.partition_id)
        span.set_attribute("leaseboard.sequence_number", sent.sequence_number)
        span.end()
        return sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hub, name)
