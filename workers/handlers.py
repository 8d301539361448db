"""The handler API: what a worker calls with each event, and the demo handler.

A handler is a callable ``handler(event: ReceivedEvent, ctx: PartitionContext)``. It is called
one event at a time per partition, partitions concurrently (``003_1736e87014fbc6da.txt``: shared
state across partitions must be synchronized). A plain function runs in the partition's own
thread, so it may block; an ``async def`` handler runs on the event loop and must not block.
A batch handler, marked with ``@batch_handler(max_events=...)``, takes ``list[ReceivedEvent]``.

What a handler returns is ignored. If it raises, the pump retries and then sets the event aside
(see ``workers.runtime.pump``); raising ``MalformedEvent`` sets it aside at once, without retries.

The pump hands an event on only while its lease is held, but a handler that takes time (or a thread
that waits for a CPU) may reach the point where its work becomes visible (a file renamed into place,
a transaction committed) after the lease ran out and another worker started. Such a handler asks
``ctx.holds()`` last, just before that point, and raises ``NotHeld`` when it says no: the event (or
batch) is then neither retried at once nor set aside; it stays with the pump, which pauses as for
any lease that may have run out, and handles it again once renewed (the next owner starts from the
last checkpoint, which it is not past). ``LandingHandler`` does so (``workers.landing``).
``--handler dotted.path`` is resolved by ``resolve_handler``; a class found there is
instantiated once, without arguments, so a handler may keep state in ``self``.
"""

from __future__ import annotations

import inspect
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, TypeVar, cast

from balancer.model import HubRef
from workers.sources.base import ReceivedEvent

from .sensors import SensorEvent

Handler = Callable[..., Any]
F = TypeVar("F", bound=Callable[..., Any])
BATCH_ATTRIBUTE = "leaseboard_batch_size"


def _always() -> bool:
    return True


@dataclass
class PartitionContext:
    """What a handler knows about where an event came from. ``state`` lives as long as this
    worker's pump of the partition (it starts empty after every change of owner). ``holds()``: True
    while this worker's lease of the partition is certainly valid (cheap, from any thread; always
    True for a context made by hand)."""

    ref: HubRef
    partition_id: str
    owner_id: str
    state: dict[str, Any] = field(default_factory=dict)
    holds: Callable[[], bool] = field(default=_always, repr=False, compare=False)


class NotHeld(Exception):
    """Raised by a handler that found ``ctx.holds()`` False before making its work visible: the pump
    keeps the event (or batch) and pauses until the lease is renewed or lost (see the module)."""


class MalformedEvent(ValueError):
    """Raised by a handler for an event that can never be handled (bad body): no retries."""


class HandlerNotFound(ValueError):
    """``--handler`` does not name a usable callable; the message says what is wrong."""


def batch_handler(fn: F | None = None, *, max_events: int = 100) -> Any:
    """Mark ``fn`` as a batch handler taking up to ``max_events`` events per call.

    Usable bare (``@batch_handler``) or with arguments (``@batch_handler(max_events=500)``).
    """
    if max_events < 1:
        raise ValueError(f"max_events must be at least 1, got {max_events}")

    def mark(f: F) -> F:
        setattr(f, BATCH_ATTRIBUTE, max_events)
        return f

    return mark(fn) if fn is not None else mark


def batch_size(handler: Handler) -> int | None:
    """The batch size of a batch handler; None for a one-event-at-a-time handler."""
    size = getattr(handler, BATCH_ATTRIBUTE, None)
    return int(size) if size is not None else None


def is_async(handler: Handler) -> bool:
    """True when calling ``handler`` returns a coroutine (an ``async def`` function or ``__call__``)."""
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - the bound __call__ of an instance
    return call is not None and inspect.iscoroutinefunction(call)


def resolve_handler(path: str) -> Handler:
    """The handler named ``path`` ("package.module.attribute"). Raises HandlerNotFound."""
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise HandlerNotFound(f"handler must be a dotted path like 'package.module.function', got {path!r}")
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise HandlerNotFound(f"handler {path!r}: cannot import module {module_name!r}: {exc}") from exc
    try:
        target: Any = getattr(module, attribute)
    except AttributeError:
        raise HandlerNotFound(f"handler {path!r}: module {module_name!r} has no attribute {attribute!r}") from None
    if inspect.isclass(target):
        try:
            target = target()
        except TypeError as exc:
            raise HandlerNotFound(f"handler {path!r}: a handler class must take no arguments: {exc}") from exc
    if not callable(target):
        raise HandlerNotFound(f"handler {path!r} is a {type(target).__name__}, not a callable")
    return cast(Handler, target)


# The demo handler ------------------------------------------------------------------------------


def parse_sensor_event(body: bytes) -> SensorEvent:
    """The sensor reading in ``body``. Raises MalformedEvent if it is not one (bad JSON, fields)."""
    try:
        return SensorEvent.from_json(body)
    except ValueError as exc:
        raise MalformedEvent(str(exc)) from exc


class SensorCounts:
    """Counts sensor readings per partition and sensor; the landing of a later issue replaces it.

    One instance serves every partition of every worker in the process, hence the lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, Counter[str]] = {}

    def __call__(self, event: ReceivedEvent, ctx: PartitionContext) -> None:
        reading = parse_sensor_event(event.body)
        with self._lock:
            self._counts.setdefault(event.partition_id, Counter())[reading.sensor] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Counts so far: partition id -> sensor -> readings."""
        with self._lock:
            return {p: dict(c) for p, c in self._counts.items()}


count_sensor_events = SensorCounts()
DEFAULT_HANDLER = "workers.handlers.count_sensor_events"
