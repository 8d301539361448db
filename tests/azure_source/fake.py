"""A stand-in for ``azure.eventhub.EventHubConsumerClient`` at the SDK's boundary, and SDK events.

Azure cannot be reached from the test machine, so the adapter's client is replaced by
``FakeConsumerClient``: the methods the adapter calls, with the SDK's own signatures (a test
compares them), driven by a script. Everything that crosses the boundary is the SDK's own type:
events are ``azure.eventhub.EventData`` decoded by the SDK's AMQP decoder from an encoded message,
the callback gets a real ``azure.eventhub.PartitionContext``, errors are the SDK's exceptions built
by its own transport mapping.

The boundary a reader uses is the SDK's per-partition consumer: ``_create_consumer`` gives a
``FakeConsumer`` that does what the SDK's ``EventHubConsumer`` does, minus the network: ``_open``
fails with the scripted open errors first (``fail_open``), ``_handle_exception`` maps and closes as
the SDK's transport does, and ``receive(batch=True, max_batch_size)`` opens if needed (swallowing a
failed open and returning, as the SDK does), then waits at most 0.2 s (the SDK's socket timeout)
for the script and hands the next events to the callback in batches of at most ``max_batch_size``
or raises the next scripted error (what the SDK raises once its retries are spent).

``LegacyFakeConsumerClient`` lacks ``_create_consumer`` (an azure-eventhub the reader does not
know): the reader then calls ``receive_batch``, which does what the SDK's single-partition receive
does: it calls ``on_partition_initialize``, then hands the scripted events to ``on_event_batch``
(setting the context's last received event first, as the SDK's processor does, which is where
``last_enqueued_event_properties`` come from), reports a scripted error to ``on_error`` and goes on
(the SDK closes the consumer and re-creates it later), and returns only when ``close()`` is called.
"""

from __future__ import annotations

import datetime
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from azure.eventhub import CloseReason, EventData, PartitionContext
from azure.eventhub._pyamqp._decode import decode_payload
from azure.eventhub._pyamqp._encode import encode_payload
from azure.eventhub._pyamqp.error import AMQPConnectionError, AMQPLinkError, ErrorCondition
from azure.eventhub._pyamqp.message import Message
from azure.eventhub._pyamqp.types import TYPE, VALUE, AMQPTypes
from azure.eventhub._transport._pyamqp_transport import PyamqpTransport
from azure.eventhub.exceptions import EventHubError

NAMESPACE = "leaseboard-test.servicebus.windows.net"
KEY = "c2VjcmV0LWtleS10aGF0LW11c3Qtbm90LWJlLXByaW50ZWQ="
CONNECTION_STRING = f"Endpoint=sb://{NAMESPACE}/;SharedAccessKeyName=listen;SharedAccessKey={KEY}"
T0_MS = 1_700_000_000_000  # enqueued times of scripted events start here (milliseconds, as on the wire)


def sdk_event(
    sequence_number: int,
    *,
    body: bytes | list[bytes] = b"",
    offset: str | None = None,
    partition_key: str | None = None,
    enqueued_ms: int | None = None,
    last_enqueued: int | None = None,
) -> EventData:
    """An EventData as the SDK hands it to a callback: the message is encoded to AMQP and decoded
    by the SDK's decoder, annotated by "the service" with sequence number, offset (100 bytes per
    event unless given), enqueued time and, if ``last_enqueued`` is given, the partition's
    last-enqueued properties (what ``track_last_enqueued_event_properties`` asks for)."""
    annotations: dict[Any, Any] = {
        b"x-opt-sequence-number": {TYPE: AMQPTypes.long, VALUE: sequence_number},
        b"x-opt-offset": offset if offset is not None else str(sequence_number * 100),
        b"x-opt-enqueued-time": {TYPE: AMQPTypes.timestamp, VALUE: enqueued_ms or T0_MS + sequence_number},
    }
    if partition_key is not None:
        annotations[b"x-opt-partition-key"] = partition_key
    delivery: dict[Any, Any] | None = None
    if last_enqueued is not None:
        delivery = {
            b"last_enqueued_sequence_number": {TYPE: AMQPTypes.long, VALUE: last_enqueued},
            b"last_enqueued_offset": str(last_enqueued * 100),
            b"last_enqueued_time_utc": {TYPE: AMQPTypes.timestamp, VALUE: T0_MS + last_enqueued},
            b"runtime_info_retrieval_time_utc": {TYPE: AMQPTypes.timestamp, VALUE: T0_MS + last_enqueued + 5},
        }
    data = body if isinstance(body, list) else [body]
    wire = encode_payload(
        bytearray(), Message(data=data, message_annotations=annotations, delivery_annotations=delivery)
    )
    return EventData._from_message(decode_payload(memoryview(wire)))


def sdk_error(condition: ErrorCondition | bytes, description: str) -> EventHubError:
    """The exception the SDK raises for an AMQP link error, through its own mapping."""
    error = PyamqpTransport._create_eventhub_exception(
        AMQPLinkError(condition, description=description), is_consumer=True
    )
    assert isinstance(error, EventHubError)
    return error


STOLEN_DESCRIPTION = (
    "New receiver 'nil' with higher epoch of '0' is created hence current receiver 'nil' with epoch '0' is getting"
    " disconnected. If you are recreating the receiver, make sure a higher epoch is used."
    " Reference:5b1f, TrackingId:9c2e, SystemTracker:leaseboard-test:eventhub:sensors~0|$default, Timestamp:2024-01-01"
)


def stolen_error() -> EventHubError:
    """What the SDK raises when the service detaches a receiver because another took the partition."""
    return sdk_error(ErrorCondition.LinkStolen, STOLEN_DESCRIPTION)


def refused_error() -> AMQPConnectionError:
    """What the SDK's transport raises inside ``_open`` when the service refuses the connection."""
    return AMQPConnectionError(
        ErrorCondition.SocketError,
        description="Failed to initiate the connection due to exception: [Errno 111] Connection refused",
    )


def utc(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


def sdk_properties(
    partition_id: str, *, begin: int, last: int, offset: str, when: datetime.datetime | None, empty: bool
) -> dict[str, Any]:
    """A partition's properties as ``EventHubConsumerClient.get_partition_properties`` returns them."""
    return {
        "eventhub_name": "sensors",
        "id": partition_id,
        "beginning_sequence_number": begin,
        "last_enqueued_sequence_number": last,
        "last_enqueued_offset": offset,
        "last_enqueued_time_utc": when,
        "is_empty": empty,
    }


@dataclass
class Hub:
    """What "the service" knows, shared by every fake client of one test."""

    partitions: list[str] = field(default_factory=lambda: [str(i) for i in range(4)])
    properties: dict[str, dict[str, Any]] = field(default_factory=dict)
    ids_error: Exception | None = None
    calls: dict[str, int] = field(default_factory=lambda: {"get_partition_ids": 0, "get_partition_properties": 0})
    # Set: every get_partition_ids waits until it is cleared, as a request sent into a network cut does.
    ids_hang: threading.Event | None = None


@dataclass
class RetryConfig:
    """The retry settings of the SDK's client configuration (``client._config``), fast by default."""

    max_retries: int = 3
    backoff_factor: float = 0.01
    backoff_max: float = 120.0


class LegacyFakeConsumerClient:
    """Same methods and signatures as EventHubConsumerClient's public ones that the adapter calls."""

    def __init__(self, hub: Hub, connection_string: str, eventhub_name: str, consumer_group: str) -> None:
        self.hub = hub
        self.connection_string = connection_string
        self.eventhub_name = eventhub_name
        self.consumer_group = consumer_group
        self.receive_kwargs: dict[str, Any] | None = None  # what receive_batch was called with
        self.consumer_kwargs: dict[str, Any] | None = None  # what _create_consumer was called with
        self.consumer: FakeConsumer | None = None
        self.delivered = 0  # events whose callback has returned
        self.in_callback = False
        self.returned = False  # receive_batch has returned, or the consumer was closed
        self.closed = False
        self.ends_alone = False  # receive_batch returns without close (a misbehaving SDK)
        self.opens = 0  # attempts to open the consumer's connection
        self.max_batch_size: int | None = None  # the largest batch the reader takes, either way
        self._config = RetryConfig()
        self._open_errors: deque[Exception] = deque()
        self._script: deque[list[EventData] | Exception] = deque()
        self.changed = threading.Condition()

    @property
    def started(self) -> bool:
        """The reader has asked to receive (either way)."""
        return self.receive_kwargs is not None or self.consumer_kwargs is not None

    @property
    def asked(self) -> dict[str, Any]:
        """What the reader asked of the SDK, either way, in receive_batch's words."""
        if self.consumer_kwargs is not None:
            kwargs = dict(self.consumer_kwargs)
            kwargs["starting_position"] = kwargs.pop("event_position")
            kwargs["starting_position_inclusive"] = kwargs.pop("event_position_inclusive")
            return kwargs
        assert self.receive_kwargs is not None, "the reader has not asked to receive"
        return self.receive_kwargs

    # -- the SDK's methods -------------------------------------------------------------------------

    def get_partition_ids(self) -> list[str]:
        self.hub.calls["get_partition_ids"] += 1
        if self.hub.ids_hang is not None:
            self.hub.ids_hang.wait(30)
        if self.hub.ids_error is not None:
            raise self.hub.ids_error
        return list(self.hub.partitions)

    def get_partition_properties(self, partition_id: str) -> dict[str, Any]:
        self.hub.calls["get_partition_properties"] += 1
        return dict(self.hub.properties[partition_id])

    def receive_batch(
        self,
        on_event_batch: Callable[[PartitionContext, list[EventData]], None],
        *,
        max_batch_size: int = 300,
        max_wait_time: float | None = None,
        partition_id: str | None = None,
        owner_level: int | None = None,
        prefetch: int = 300,
        track_last_enqueued_event_properties: bool = False,
        starting_position: Any = None,
        starting_position_inclusive: bool | dict[str, bool] = False,
        on_error: Callable[[PartitionContext, Exception], None] | None = None,
        on_partition_initialize: Callable[[PartitionContext], None] | None = None,
        on_partition_close: Callable[[PartitionContext, CloseReason], None] | None = None,
        **kwargs: Any,
    ) -> None:
        with self.changed:
            self.max_batch_size = max_batch_size
            self.receive_kwargs = {
                "max_batch_size": max_batch_size,
                "max_wait_time": max_wait_time,
                "partition_id": partition_id,
                "owner_level": owner_level,
                "prefetch": prefetch,
                "track_last_enqueued_event_properties": track_last_enqueued_event_properties,
                "starting_position": starting_position,
                "starting_position_inclusive": starting_position_inclusive,
                "on_error": on_error,
                "on_partition_initialize": on_partition_initialize,
                "on_partition_close": on_partition_close,
                **kwargs,
            }
            self.changed.notify_all()
        context = PartitionContext(NAMESPACE, self.eventhub_name, self.consumer_group, partition_id or "")
        if on_partition_initialize is not None:
            on_partition_initialize(context)
        while True:
            with self.changed:
                self.changed.wait_for(lambda: self.closed or self.ends_alone or bool(self._script))
                if self.closed or (self.ends_alone and not self._script):
                    break
                item = self._next(max_batch_size)
            try:
                if isinstance(item, Exception):
                    if on_error is not None:
                        on_error(context, item)
                    if on_partition_close is not None:
                        on_partition_close(context, CloseReason.OWNERSHIP_LOST)
                else:
                    context._last_received_event = item[-1]  # as EventProcessor._on_event_received does
                    on_event_batch(context, item)
            finally:
                self._done(item)
        if on_partition_close is not None and self.closed:
            on_partition_close(context, CloseReason.SHUTDOWN)
        with self.changed:
            self.returned = True
            self.changed.notify_all()

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()

    # -- the script --------------------------------------------------------------------------------

    def feed(self, *items: list[EventData] | Exception) -> None:
        """Events (a list is what the service delivers at once) or an error, in order."""
        with self.changed:
            self._script.extend(items)
            self.changed.notify_all()

    def fail_open(self, *errors: Exception) -> None:
        """The next attempts to open the consumer's connection raise these (the transport's errors)."""
        with self.changed:
            self._open_errors.extend(errors)

    def end_alone(self) -> None:
        with self.changed:
            self.ends_alone = True
            self.changed.notify_all()

    def wait_for(self, predicate: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
        """Waits (woken by every change, no sleeping) until ``predicate()``; fails after ``timeout``."""
        with self.changed:
            if not self.changed.wait_for(predicate, timeout):
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")

    def _next(self, max_batch_size: int) -> list[EventData] | Exception:
        """The script's next item, at most ``max_batch_size`` events of it (holding ``changed``)."""
        item = self._script.popleft()
        if isinstance(item, list) and len(item) > max_batch_size:
            self._script.appendleft(item[max_batch_size:])
            item = item[:max_batch_size]
        self.in_callback = True
        self.changed.notify_all()
        return item

    def _done(self, item: list[EventData] | Exception) -> None:
        with self.changed:
            self.in_callback = False
            if isinstance(item, list):
                self.delivered += len(item)
            self.changed.notify_all()


class FakeConsumerClient(LegacyFakeConsumerClient):
    """With the SDK's private ``_create_consumer`` too, which the reader drives directly."""

    def _create_consumer(
        self,
        consumer_group: str,
        partition_id: str,
        event_position: str | int | datetime.datetime,
        on_event_received: Callable[[list[EventData]], None],
        **kwargs: Any,
    ) -> FakeConsumer:
        with self.changed:
            self.consumer_kwargs = {
                "consumer_group": consumer_group,
                "partition_id": partition_id,
                "event_position": event_position,
                **kwargs,
            }
            self.consumer = FakeConsumer(self, on_event_received)
            self.changed.notify_all()
            return self.consumer


class FakeConsumer:
    """The SDK's ``EventHubConsumer`` as the reader drives it (see the module)."""

    SOCKET_TIMEOUT = 0.2  # the longest a receive waits for the service, as the SDK's

    def __init__(self, client: LegacyFakeConsumerClient, on_event_received: Callable[[list[EventData]], None]) -> None:
        self._client = client
        self._on_event_received = on_event_received
        self._name = "EHConsumer-fake"
        self.running = False
        self.closed = False

    def _open(self) -> bool:
        client = self._client
        with client.changed:
            client.opens += 1
            client.changed.notify_all()
            if client._open_errors:
                raise client._open_errors.popleft()
        self.running = True
        return True

    def _handle_exception(self, exception: Exception) -> Exception:
        handled = PyamqpTransport._handle_exception(exception, self)
        assert isinstance(handled, Exception)
        return handled

    def _close_handler(self) -> None:
        self.running = False

    def _close_connection(self) -> None:
        self.running = False

    def receive(self, batch: bool = False, max_batch_size: int = 300, max_wait_time: float | None = None) -> None:
        assert batch and max_wait_time is None, "the reader asks for batches, handed over as they come"
        client = self._client
        client.max_batch_size = max_batch_size
        if not self.running:
            try:
                self._open()
            except Exception:
                return  # what the SDK's receive does with a failed open: nothing, as if closed
        with client.changed:
            client.changed.wait_for(lambda: self.closed or client.closed or bool(client._script), self.SOCKET_TIMEOUT)
            if self.closed or not client._script:
                return
            item = client._next(max_batch_size)
        try:
            if isinstance(item, Exception):
                self.running = False
                raise item
            self._on_event_received(item)
        finally:
            client._done(item)

    def close(self) -> None:
        self.running = False
        self.closed = True
        with self._client.changed:
            self._client.returned = True
            self._client.changed.notify_all()


class Clients:
    """The adapter's client factory: a new fake per call, all sharing one Hub; [0] is the source's.
    ``legacy``: clients without ``_create_consumer``, so readers fall back to ``receive_batch``."""

    def __init__(self, hub: Hub, *, legacy: bool = False) -> None:
        self.hub = hub
        self.legacy = legacy
        self.made: list[LegacyFakeConsumerClient] = []
        self.open_errors: list[Exception] = []  # the next client's first opens fail with these

    def __call__(self, connection_string: str, eventhub_name: str, consumer_group: str) -> LegacyFakeConsumerClient:
        kind = LegacyFakeConsumerClient if self.legacy else FakeConsumerClient
        client = kind(self.hub, connection_string, eventhub_name, consumer_group)
        client.fail_open(*self.open_errors)
        self.open_errors = []
        self.made.append(client)
        return client

    @property
    def last(self) -> LegacyFakeConsumerClient:
        return self.made[-1]
