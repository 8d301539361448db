"""Handlers for the tracing tests (``--handler tests.workers.traced_handlers.…``): each starts a span of
its own, which must come out as a child of the worker's ``process`` span (the span is current during
the call)."""

from __future__ import annotations

from opentelemetry import trace

from workers.handlers import PartitionContext, batch_handler
from workers.sources.base import ReceivedEvent

_tracer = trace.get_tracer("tests.traced_handlers")


def one(event: ReceivedEvent, ctx: PartitionContext) -> None:
    with _tracer.start_as_current_span("handler work"):
        pass


@batch_handler(max_events=5)  # type: ignore[untyped-decorator]  # batch_handler(...) is typed as Any
def batch(events: list[ReceivedEvent], ctx: PartitionContext) -> None:
    with _tracer.start_as_current_span("handler work"):
        pass
