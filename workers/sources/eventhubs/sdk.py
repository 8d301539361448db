"""The part of azure-eventhub this package uses: the consumer client (a protocol, so tests can hand
in a fake), the per-partition consumer a reader drives (private to the SDK: see ``open_consumer``),
and the SDK's values turned into ours (positions, events, partition properties)."""

from __future__ import annotations

import contextlib
import datetime
import inspect
import logging
import socket
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from azure.eventhub import EventData, EventHubConsumerClient, PartitionContext
from azure.eventhub.amqp import AmqpMessageBodyType

from workers.sources.base import PartitionProperties, Position, ReceivedEvent

log = logging.getLogger("leaseboard.eventhubs")


class ConsumerClient(Protocol):
    """The part of ``azure.eventhub.EventHubConsumerClient`` this package calls."""

    def get_partition_ids(self) -> list[str]: ...

    def get_partition_properties(self, partition_id: str) -> dict[str, Any]: ...

    def receive_batch(
        self, on_event_batch: Callable[[PartitionContext, list[EventData]], None], **kwargs: Any
    ) -> None: ...

    def close(self) -> None: ...


ClientFactory = Callable[[str, str, str], ConsumerClient]  # (connection string, hub, consumer group)


class Consumer(Protocol):
    """The part of the SDK's private ``azure.eventhub._consumer.EventHubConsumer`` a reader drives:
    one AMQP receiver of one partition, the object ``EventProcessor`` drives per partition."""

    running: bool  # its link has been opened (False again after a failure closed it)

    def receive(self, batch: bool = False, max_batch_size: int = 300, max_wait_time: float | None = None) -> None: ...

    def _open(self) -> bool: ...

    def _handle_exception(self, exception: Exception) -> Exception: ...

    def close(self) -> None: ...


_CONSUMER_METHODS = ("receive", "_open", "_handle_exception", "close")
# KEEP_ALIVE. The SDK's consumer (always, from _create_consumer) starts a keep-alive thread that
# calls the connection's listen() every 30 s, beside the thread that receives. Each reads frames
# under the socket's lock but processes them after it, so the two can hand transfers over in the
# wrong order: the partition suite saw event 1984 before 1983 (the pump's sequence guard then took
# 1983 for a repeat, and it was never handled) one second after a paused pump resumed, when the
# receiving thread, held in the reader's full queue, began reading again beside the keep-alive.
# The reader's thread calls receive() without pause (0.2 s socket timeout), which services the
# connection; while it waits for room in the queue nothing reads, and a service that closes the idle
# connection meanwhile is reconnected to at the next receive, from the last event handed over.
_fallback_logged = threading.Lock()  # acquired once: the fallback is logged once per process


def open_consumer(
    client: ConsumerClient,
    *,
    consumer_group: str,
    partition_id: str,
    starting_position: str | int,
    on_events: Callable[[list[EventData]], None],
    owner_level: int | None,
    prefetch: int,
) -> Consumer | None:
    """The SDK's consumer of ``partition_id``, made exactly as ``EventProcessor`` makes it for a
    single-partition ``receive_batch`` with no checkpoint store (exclusive of the starting position,
    last-enqueued properties tracked), not yet connected; ``on_events`` gets each batch.

    ``EventHubConsumerClient._create_consumer`` and the consumer's ``receive``, ``_open`` and
    ``_handle_exception`` are private (checked on azure-eventhub 5.15, the range pinned in pyproject.toml). None, logged
    once per process, when ``client`` lacks them or their signatures changed: the caller then uses
    the public ``receive_batch``."""
    create = getattr(client, "_create_consumer", None)
    kwargs: dict[str, Any] = {
        "event_position_inclusive": False,
        "owner_level": owner_level,
        "prefetch": prefetch,
        "track_last_enqueued_event_properties": True,
    }
    args = (consumer_group, partition_id, starting_position, on_events)
    if not callable(create) or not _binds(create, *args, **kwargs):
        _fall_back(f"{type(client).__name__}._create_consumer is missing or takes other arguments")
        return None
    consumer = create(*args, **kwargs)
    if hasattr(consumer, "_keep_alive"):
        consumer._keep_alive = None  # no keep-alive thread: see KEEP_ALIVE
    missing = [name for name in _CONSUMER_METHODS if not callable(getattr(consumer, name, None))]
    if missing or not hasattr(consumer, "running") or not _binds(consumer.receive, True, 1, None):
        _fall_back(f"{type(consumer).__name__} lacks {', '.join(missing) or 'running'} or takes other arguments")
        close = getattr(consumer, "close", None)
        if callable(close):
            close()  # never opened: nothing on the wire
        return None
    return cast(Consumer, consumer)


@dataclass(frozen=True)
class Retries:
    """The SDK client's retry settings (``retry_total``, ``retry_backoff_factor``,
    ``retry_backoff_max``), as its own retrying operations apply them."""

    total: int = 3
    backoff_factor: float = 0.8
    backoff_max: float = 120.0

    @classmethod
    def of(cls, client: object) -> Retries:
        config, default = getattr(client, "_config", None), cls()
        return cls(
            int(getattr(config, "max_retries", default.total)),
            float(getattr(config, "backoff_factor", default.backoff_factor)),
            float(getattr(config, "backoff_max", default.backoff_max)),
        )

    def backoff(self, retried: int) -> float | None:
        """Seconds to wait before retry number ``retried + 1``; None when there is none."""
        wait = self.backoff_factor * 2**retried  # the SDK's default, exponential
        return None if retried >= self.total or wait > self.backoff_max else wait


def interrupt(consumer: Consumer, thread: threading.Thread) -> None:
    """Shuts down the socket ``thread`` is blocked on inside ``consumer``'s connection, so that it
    returns: the SDK reads the TLS and AMQP handshakes with no timeout, so a service that accepts
    the connection and then says nothing holds the thread forever. The socket is the transport's,
    or, during the TLS handshake (where the SDK does not hold it yet), the one in the thread's
    frames. Does nothing when there is none."""
    sockets = []
    handler = getattr(consumer, "_handler", None)
    transport = getattr(getattr(handler, "_connection", None), "_transport", None)
    sockets.append(getattr(transport, "sock", None))
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        sockets.extend(value for value in frame.f_locals.values() if isinstance(value, socket.socket))
        frame = frame.f_back
    for sock in sockets:
        if isinstance(sock, socket.socket) and sock.fileno() != -1:
            with contextlib.suppress(OSError):  # not connected yet, or already closed
                sock.shutdown(socket.SHUT_RDWR)


def _binds(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return False
    return True


def _fall_back(why: str) -> None:
    if _fallback_logged.acquire(blocking=False):
        log.warning(
            "azure-eventhub: %s; readers use the public receive_batch instead, whose event processor"
            " spins a CPU until its own partition listing is done (slower starts, same events)",
            why,
        )


def sdk_client(connection_string: str, hub: str, consumer_group: str) -> ConsumerClient:
    """A real ``EventHubConsumerClient``; it connects on first use, not here."""
    return EventHubConsumerClient.from_connection_string(
        connection_string, consumer_group=consumer_group, eventhub_name=hub
    )


def sdk_probe_client(connection_string: str, hub: str, consumer_group: str) -> ConsumerClient:
    """A real ``EventHubConsumerClient`` for one probe (``EventHubsSource.probe``): no retries, so a hub
    that cannot be reached fails it within the SDK's connect timeout (1 s) instead of after 15 s and more."""
    return EventHubConsumerClient.from_connection_string(
        connection_string, consumer_group=consumer_group, eventhub_name=hub, retry_total=0
    )


@dataclass(frozen=True, slots=True)
class LastEnqueued:
    """The partition's last-enqueued event as the service attached it to a delivery."""

    sequence_number: int
    offset: str | None
    enqueued_time: float | None


def starting_position(position: Position) -> str | int:
    """The SDK's ``starting_position`` for ``position``, used with ``starting_position_inclusive=False``:
    an offset (str), a sequence number (int), "@latest", or "-1" (the start of the partition)."""
    if position.offset is not None:
        return str(position.offset)
    if position.sequence_number is not None:
        if isinstance(position.sequence_number, bool) or not isinstance(position.sequence_number, int):
            raise TypeError(f"sequence number must be a whole number, got {position.sequence_number!r}")
        # -1 is "before the first event": exclusive of -1 is the start, which the SDK spells offset "-1".
        return "-1" if position.sequence_number < 0 else position.sequence_number
    return "@latest" if position.latest else "-1"


def received(partition_id: str, event: EventData) -> ReceivedEvent:
    """``event`` as a ReceivedEvent. Raises ValueError for an event without a sequence number,
    offset or enqueued time (the service always sets them)."""
    sequence, offset, enqueued = event.sequence_number, event.offset, event.enqueued_time
    if sequence is None or offset is None or enqueued is None:
        raise ValueError(
            f"partition {partition_id}: event without sequence number, offset or enqueued time"
            f" ({sequence!r}, {offset!r}, {enqueued!r})"
        )
    key = event.partition_key
    return ReceivedEvent(
        partition_id=partition_id,
        sequence_number=int(sequence),
        offset=str(offset),
        enqueued_time=enqueued.timestamp(),
        partition_key=key.decode("utf-8", "replace") if isinstance(key, bytes) else key,
        body=_body(event),
        trace_context=trace_context(event.properties),
    )


TRACE_KEYS = ("traceparent", "tracestate")
DIAGNOSTIC_ID = "diagnostic-id"  # Azure's older name of ``traceparent``, used where that is missing


def trace_context(properties: dict[Any, Any] | None) -> tuple[tuple[str, str], ...]:
    """``traceparent`` and ``tracestate`` among an event's application properties (keys of any case,
    str or bytes), a ``Diagnostic-Id`` standing in for a missing ``traceparent``; () when none."""
    found: dict[str, str] = {}
    for key, value in (properties or {}).items():
        name = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        if isinstance(name, str) and isinstance(text, str) and text:
            found[name.lower()] = text
    if "traceparent" not in found and DIAGNOSTIC_ID in found:
        found["traceparent"] = found[DIAGNOSTIC_ID]
    return tuple((key, found[key]) for key in TRACE_KEYS if key in found)


def properties(partition_id: str, raw: dict[str, Any]) -> PartitionProperties:
    """The SDK's partition properties dict as PartitionProperties."""
    last = int(raw["last_enqueued_sequence_number"])
    offset = raw.get("last_enqueued_offset")
    when = raw.get("last_enqueued_time_utc")
    nothing_yet = last < 0
    return PartitionProperties(
        partition_id=partition_id,
        begin_sequence_number=int(raw["beginning_sequence_number"]),
        last_enqueued_sequence_number=last,
        last_enqueued_offset=None if nothing_yet or offset in (None, "-1") else str(offset),
        last_enqueued_time=None if nothing_yet or when is None else _epoch(when),
        is_empty=bool(raw["is_empty"]),
    )


def last_enqueued(tracked: dict[str, Any] | None) -> LastEnqueued | None:
    """A delivery's ``last_enqueued_event_properties`` as LastEnqueued; None when it has none."""
    if not tracked or tracked.get("sequence_number") is None:
        return None
    when = tracked.get("enqueued_time")
    offset = tracked.get("offset")
    return LastEnqueued(
        int(tracked["sequence_number"]), None if offset is None else str(offset), None if when is None else _epoch(when)
    )


def _epoch(when: datetime.datetime) -> float:
    if when.tzinfo is None:  # the SDK's datetimes are UTC; a naive one is read as UTC, not local time
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def _body(event: EventData) -> bytes:
    if event.body_type == AmqpMessageBodyType.DATA:
        body = event.body
        return body if isinstance(body, bytes) else b"".join(cast(Iterable[bytes], body))
    value = event.body if event.body_type == AmqpMessageBodyType.VALUE else None
    if isinstance(value, bytes):
        return value
    return event.body_as_str().encode("utf-8")  # AMQP value or sequence bodies of other producers
