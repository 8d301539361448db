"""A real OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` with a protobuf body (gzip or not),
decoded with ``opentelemetry-proto``, on a free loopback port, in a thread of the test's process.

``Collector.spans()`` is every span received so far, flattened (``Received``): what the tests assert
on. Wait for spans with ``tests.support.waiting`` (the exporters send in batches, every
``OTEL_BSP_SCHEDULE_DELAY`` milliseconds).
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

HOST = "127.0.0.1"
KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class Received:
    """One span as a collector got it; ids in lowercase hex ("" for no parent)."""

    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]  # (trace id, span id)
    service: str
    error: bool

    def event(self, name: str) -> dict[str, Any] | None:
        """The attributes of this span's first event called ``name``, None if it has none."""
        return next((attributes for event, attributes in self.events if event == name), None)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


def decode(body: bytes) -> list[Received]:
    """The spans of one export request's protobuf body."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out: list[Received] = []
    for resource_spans in request.resource_spans:
        service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    Received(
                        name=span.name,
                        kind=KINDS.get(span.kind, str(span.kind)),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        attributes=_attributes(span.attributes),
                        events=[(e.name, _attributes(e.attributes)) for e in span.events],
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        service=service,
                        error=span.status.code == 2,
                    )
                )
    return out


@dataclass
class Collector:
    """The receiver's server and what it got: ``endpoint`` is its base URL (``OTEL_EXPORTER_OTLP_ENDPOINT``)."""

    server: ThreadingHTTPServer
    received: list[Received] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.server.server_address[1]}"

    def spans(self, name: str | None = None, service: str | None = None) -> list[Received]:
        """The spans received so far (called ``name``, of ``service``, where given)."""
        with self.lock:
            found = list(self.received)
        return [s for s in found if (name is None or s.name == name) and (service is None or s.service == service)]

    def take(self, body: bytes) -> None:
        spans = decode(body)
        with self.lock:
            self.received += spans
            self.requests += 1


class _Handler(BaseHTTPRequestHandler):
    server: Any  # a ThreadingHTTPServer with ``collector`` set

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        encoding = (self.headers.get("Content-Encoding") or "").lower()
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        try:
            self.server.collector.take(body)
        except Exception as exc:  # a body that is not an export request: the exporter sees a 400
            self.send_error(400, str(exc))
            return
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the exporters post every batch: not for the test's output


@contextmanager
def collector() -> Iterator[Collector]:
    """A receiver on a free loopback port for the block; stopped after it."""
    server = ThreadingHTTPServer((HOST, 0), _Handler)
    server.daemon_threads = True
    received = Collector(server)
    server.collector = received  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, name="otlp-collector", daemon=True)
    thread.start()
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
