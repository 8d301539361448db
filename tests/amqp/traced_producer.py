"""Microsoft's producer with Azure's tracing on, for ``test_sdk_tracing``: run as
``python -m tests.amqp.traced_producer CONNECTION_STRING HUB COUNT``, it sends COUNT events to
partition 0 in one batch inside a ``traced send`` span; the SDK's spans, and the ``traceparent`` it
puts on each event, come from azure-core-tracing-opentelemetry. Spans go over OTLP/HTTP to
``OTEL_EXPORTER_OTLP_ENDPOINT``, flushed before the process exits.

A process of its own: the OpenTelemetry provider it sets is global, and the test process stays untraced.
"""

from __future__ import annotations

import sys

from azure.core.settings import settings
from azure.eventhub import EventData, EventHubProducerClient
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


def main(connection_string: str, hub: str, count: int) -> None:
    settings.tracing_implementation = "opentelemetry"
    provider = TracerProvider(resource=Resource.create({"service.name": "sdk-producer"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    client = EventHubProducerClient.from_connection_string(connection_string, eventhub_name=hub)
    with trace.get_tracer("tests.traced_producer").start_as_current_span("traced send"), client:
        batch = client.create_batch(partition_id="0")
        for i in range(count):
            batch.add(EventData(f'{{"n": {i}}}'.encode()))
        client.send_batch(batch)
    provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
