"""Azure Event Hubs as an event source (``--source eventhubs``), through azure-eventhub's sync client.

The connection string comes from ``EVENTHUB_CONNECTION_STRING`` (or ``connection_string=``); it is
checked, and the hub is asked for its partition ids, when the source is built, so a wrong string,
a rejected key or an unknown hub is one clear ``EventHubsConfigError`` at start. No message of
this module contains the shared access key.

Readers. The SDK's receive is callback-driven and blocks until its client is closed, so each reader
runs ``EventHubConsumerClient.receive_batch`` for its one partition on a thread of its own, with a
client of its own (closing a client stops every receive on it, and one client refuses to receive a
partition twice, which a hand-off inside one process would need for a moment). Batches go into a
bounded queue; while it is full the SDK's callback waits, the SDK stops pulling, and the service
keeps the rest (backpressure, not memory growth). ``receive`` takes from the queue without waiting.

Exclusive receivers. Readers pass ``owner_level`` (the service's epoch, 0 by default as in
Microsoft's processor): when a partition moves, the new owner's receiver makes the service cut off
the previous one, even if that worker has not yet noticed it lost its lease. The old reader's
``receive`` then raises ``PartitionStolen``.

Failure modes of the bridge:
- After its own retries the SDK reports a receive error (or a failure of the partition listing it
  does on its own at start, with no context) to ``on_error``, closes that consumer and,
  in single-partition mode, re-creates it later from the *original* starting position (its
  in-memory checkpoint store knows nothing of our progress). A stolen partition would be stolen
  back and events read again. So the first reported error closes the client for good and
  ``receive`` raises (``PartitionStolen`` or ``ReaderFailed``); the runtime restarts the pump from
  its checkpoint if it still owns the partition.
- ``close`` may be called while the SDK's thread waits in our callback for room in the queue: it
  wakes it, closes the client and joins the thread (bounded; a thread still in the SDK after that
  is a daemon and is logged, never waited on forever). The SDK's own load-balancing thread of a
  closed client notices at its next wake-up (up to about 36 s later; a daemon holding nothing).

Lag. Readers ask the service to attach the partition's last-enqueued properties to every delivery
(``track_last_enqueued_event_properties``); ``properties`` answers from those while a reader of this
source has fresh ones, and asks the service otherwise.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from azure.eventhub import EventData, EventHubConsumerClient, PartitionContext, parse_connection_string
from azure.eventhub.amqp import AmqpMessageBodyType
from azure.eventhub.exceptions import AuthenticationError, EventHubError

from workers.sources.base import PartitionProperties, PartitionTaken, Position, ReceivedEvent

__all__ = ["EventHubsConfigError", "EventHubsReader", "EventHubsSource", "PartitionStolen", "ReaderFailed"]

log = logging.getLogger("leaseboard.eventhubs")

ENV_CONNECTION_STRING = "EVENTHUB_CONNECTION_STRING"
ENV_CONSUMER_GROUP = "LEASEBOARD_CONSUMER_GROUP"
_FORMAT = (
    "Endpoint=sb://<namespace>.servicebus.windows.net/;SharedAccessKeyName=<policy>;SharedAccessKey=<key>"
    "[;EntityPath=<event hub>] (the portal shows it under the namespace's or hub's Shared access policies)"
)


class EventHubsConfigError(ValueError):
    """The connection string is missing or wrong, the service refused it, or the hub is not there."""


class ReaderFailed(RuntimeError):
    """The receiver of one partition stopped with an error; ``__cause__`` is the SDK's exception."""

    def __init__(self, message: str, partition_id: str) -> None:
        super().__init__(message)
        self.partition_id = partition_id


class PartitionStolen(ReaderFailed, PartitionTaken):
    """The service disconnected the receiver because another one, with the same or a higher owner
    level, opened the partition: another worker (or Microsoft's processor) owns it now."""


class ConsumerClient(Protocol):
    """The part of ``azure.eventhub.EventHubConsumerClient`` this module calls."""

    def get_partition_ids(self) -> list[str]: ...

    def get_partition_properties(self, partition_id: str) -> dict[str, Any]: ...

    def receive_batch(
        self, on_event_batch: Callable[[PartitionContext, list[EventData]], None], **kwargs: Any
    ) -> None: ...

    def close(self) -> None: ...


ClientFactory = Callable[[str, str, str], ConsumerClient]  # (connection string, hub, consumer group)


def sdk_client(connection_string: str, hub: str, consumer_group: str) -> ConsumerClient:
    """A real ``EventHubConsumerClient``; it connects on first use, not here."""
    return EventHubConsumerClient.from_connection_string(
        connection_string, consumer_group=consumer_group, eventhub_name=hub
    )


@dataclass(frozen=True, slots=True)
class LastEnqueued:
    """The partition's last-enqueued event as the service attached it to a delivery."""

    sequence_number: int
    offset: str | None
    enqueued_time: float | None


class EventHubsSource:
    """Implements ``workers.sources.base.EventSource`` on one event hub and consumer group.

    ``owner_level`` is the epoch of every reader (None: non-exclusive receivers, which the service
    never cuts off: two owners of one partition would both read it). ``owner_id`` only labels
    threads and messages. Raises EventHubsConfigError as described in the module docstring."""

    def __init__(
        self,
        hub: str,
        *,
        connection_string: str | None = None,
        consumer_group: str | None = None,
        owner_level: int | None = 0,
        owner_id: str | None = None,
        refresh_seconds: float = 5.0,
        tracked_max_age: float = 5.0,
        queue_events: int = 300,
        client_factory: ClientFactory = sdk_client,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if owner_level is not None and (isinstance(owner_level, bool) or not isinstance(owner_level, int)):
            raise TypeError(f"owner_level must be a whole number or None, got {owner_level!r}")
        if queue_events < 1:
            raise ValueError(f"queue_events must be at least 1, got {queue_events}")
        given = connection_string if connection_string is not None else os.environ.get(ENV_CONNECTION_STRING, "")
        self._connection_string = given.strip()
        self._secrets = _secrets(self._connection_string)
        self.hub = hub
        self.consumer_group = consumer_group or os.environ.get(ENV_CONSUMER_GROUP) or "$Default"
        self.namespace = self._check_connection_string()
        self.owner_level = owner_level
        self.owner_id = owner_id
        self._refresh_seconds = refresh_seconds
        self._tracked_max_age = tracked_max_age
        self._queue_events = queue_events
        self._factory = client_factory
        self._clock = clock
        self._lock = threading.Lock()  # one management request at a time on the shared client
        self._ids: tuple[str, ...] | None = None
        self._ids_at = 0.0
        self._ids_failing = False
        self._properties: dict[str, tuple[float, PartitionProperties]] = {}
        self._tracked: dict[str, tuple[float, LastEnqueued]] = {}
        self._readers: weakref.WeakSet[EventHubsReader] = weakref.WeakSet()
        try:
            self._client = client_factory(self._connection_string, hub, self.consumer_group)
            self._ids = self._fetch_ids()
        except AuthenticationError as exc:
            raise EventHubsConfigError(
                f"Event Hubs namespace {self.namespace} refused the credentials of {ENV_CONNECTION_STRING} for"
                f" event hub {hub!r}: {self._redact(exc)}"
            ) from None
        except Exception as exc:
            raise EventHubsConfigError(
                f"cannot read event hub {hub!r} in namespace {self.namespace} (consumer group"
                f" {self.consumer_group!r}): {type(exc).__name__}: {self._redact(exc)}"
            ) from None
        self._ids_at = clock()
        log.info(
            "event hub %s/%s: %d partitions, consumer group %r",
            self.namespace,
            hub,
            len(self._ids),
            self.consumer_group,
        )

    # -- the EventSource protocol ------------------------------------------------------------------

    def partition_ids(self) -> tuple[str, ...]:
        """The hub's partition ids, asked of the service at most every ``refresh_seconds``. While
        the service cannot be asked, the last answer (partitions are never removed, so it is a
        true subset) with a warning at the first failure."""
        now = self._clock()
        if self._ids is not None and now - self._ids_at < self._refresh_seconds:
            return self._ids
        try:
            ids = self._fetch_ids()
        except Exception as exc:
            if self._ids is None:
                raise
            if not self._ids_failing:
                log.warning(
                    "event hub %s: cannot refresh partition ids (%s); using the last %d",
                    self.hub,
                    self._redact(exc),
                    len(self._ids),
                )
            self._ids_failing, self._ids_at = True, now
            return self._ids
        if self._ids is not None and len(ids) > len(self._ids):
            log.info("event hub %s grew from %d to %d partitions", self.hub, len(self._ids), len(ids))
        self._ids, self._ids_at, self._ids_failing = ids, now, False
        return ids

    def properties(self, partition_id: str) -> PartitionProperties:
        """The partition's properties: from a reader's tracked last-enqueued event when that was
        delivered within ``tracked_max_age`` and is not behind the service's last answer (which
        gives the beginning sequence number), else asked of the service. Raises ValueError for an
        unknown partition, the SDK's EventHubError when the service cannot answer."""
        self._check_partition(partition_id)
        now = self._clock()
        asked = self._properties.get(partition_id)
        tracked = self._tracked.get(partition_id)
        # A delivery's annotation may predate the last answer (events wait in the SDK's buffer and
        # our queue): last-enqueued sequence numbers only grow, so the smaller one is the stale one.
        if (
            asked is not None
            and tracked is not None
            and now - tracked[0] <= self._tracked_max_age
            and tracked[1].sequence_number >= asked[1].last_enqueued_sequence_number
        ):
            last = tracked[1]
            return PartitionProperties(
                partition_id=partition_id,
                begin_sequence_number=asked[1].begin_sequence_number,
                last_enqueued_sequence_number=last.sequence_number,
                last_enqueued_offset=last.offset,
                last_enqueued_time=last.enqueued_time,
                is_empty=False,  # the service has just delivered an event of it
            )
        with self._lock:
            raw = self._client.get_partition_properties(partition_id)
        props = _properties(partition_id, raw)
        self._properties[partition_id] = (self._clock(), props)
        return props

    def reader(self, partition_id: str, position: Position) -> EventHubsReader:
        """A reader of ``partition_id`` starting after ``position``, on a client of its own.
        Raises ValueError for an unknown partition, TypeError for a position of another type."""
        if not isinstance(position, Position):
            raise TypeError(f"position must be a workers.sources.base.Position, got {type(position).__name__}")
        self._check_partition(partition_id)
        reader = EventHubsReader(
            self._factory(self._connection_string, self.hub, self.consumer_group),
            hub=self.hub,
            partition_id=partition_id,
            starting_position=starting_position(position),
            owner_level=self.owner_level,
            owner_id=self.owner_id,
            queue_events=self._queue_events,
            on_tracked=self._note_tracked,
        )
        self._readers.add(reader)
        return reader

    def close(self) -> None:
        """Closes every reader of this source and the management client."""
        for reader in list(self._readers):
            reader.close()
        try:
            self._client.close()
        except Exception as exc:  # closing a half-broken connection must not mask why we close
            log.warning("event hub %s: closing the client failed: %s", self.hub, self._redact(exc))

    def __enter__(self) -> EventHubsSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ------------------------------------------------------------------------------------

    def _check_connection_string(self) -> str:
        """The namespace's host name. Raises EventHubsConfigError."""
        if not self._connection_string:
            raise EventHubsConfigError(
                f"{ENV_CONNECTION_STRING} is not set; --source eventhubs needs the connection string of the"
                f" Event Hubs namespace or hub: {_FORMAT}"
            )
        try:
            parsed = parse_connection_string(self._connection_string)
        except Exception as exc:
            raise EventHubsConfigError(
                f"{ENV_CONNECTION_STRING} is not a valid Event Hubs connection string ({self._redact(exc)});"
                f" expected {_FORMAT}"
            ) from None
        if parsed.eventhub_name and parsed.eventhub_name != self.hub:
            raise EventHubsConfigError(
                f"{ENV_CONNECTION_STRING} is for event hub {parsed.eventhub_name!r} (EntityPath) but the hub to"
                f" read is {self.hub!r}; set --hub or LEASEBOARD_HUB to {parsed.eventhub_name!r}, or use a"
                " namespace-level connection string"
            )
        return parsed.fully_qualified_namespace

    def _fetch_ids(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(str(pid) for pid in self._client.get_partition_ids())

    def _check_partition(self, partition_id: str) -> None:
        if not isinstance(partition_id, str):
            raise TypeError(f"partition ids are strings like '0', got {partition_id!r}")
        ids = self.partition_ids()
        if partition_id not in ids and self._clock() - self._ids_at >= 1.0:
            self._ids_at = float("-inf")  # it may have just been added: ask once more, at most every second
            ids = self.partition_ids()
        if partition_id not in ids:
            raise ValueError(f"event hub {self.hub!r} has no partition {partition_id!r}; its ids are {', '.join(ids)}")

    def _note_tracked(self, partition_id: str, last: LastEnqueued) -> None:
        self._tracked[partition_id] = (self._clock(), last)

    def _redact(self, error: object) -> str:
        text = str(error)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


class EventHubsReader:
    """Receives one partition on a background thread into a bounded queue (see the module)."""

    def __init__(
        self,
        client: ConsumerClient,
        *,
        hub: str,
        partition_id: str,
        starting_position: str | int,
        owner_level: int | None,
        owner_id: str | None = None,
        queue_events: int = 300,
        max_batch_size: int = 100,
        join_seconds: float = 10.0,
        on_tracked: Callable[[str, LastEnqueued], None] | None = None,
    ) -> None:
        self.partition_id = partition_id
        self.last_enqueued: LastEnqueued | None = None
        self._client = client
        self._label = f"event hub {hub} partition {partition_id}" + (f" (owner {owner_id})" if owner_id else "")
        self._capacity = queue_events
        self._join_seconds = join_seconds
        self._on_tracked = on_tracked
        self._cond = threading.Condition()
        self._queue: deque[ReceivedEvent] = deque()
        self._error: ReaderFailed | None = None
        self._closed = False
        self._kwargs: dict[str, Any] = {
            "partition_id": partition_id,
            "starting_position": starting_position,
            "starting_position_inclusive": False,
            "owner_level": owner_level,
            "track_last_enqueued_event_properties": True,
            # Batches no bigger than the queue: what waits for room is at most one queue's worth.
            "max_batch_size": min(max_batch_size, queue_events),
            "prefetch": queue_events,
            "on_error": self._on_error,
        }
        self._thread = threading.Thread(
            target=self._run, name=f"eventhubs {hub}/{partition_id}" + (f" {owner_id}" if owner_id else ""), daemon=True
        )
        self._thread.start()

    def receive(self, max_events: int) -> list[ReceivedEvent]:
        """Up to ``max_events`` next events in sequence order; [] when none are there yet.

        Raises PartitionStolen at once when another receiver took the partition (queued events
        are dropped: the new owner reads them), ReaderFailed once the queue is drained after any
        other receive error, ValueError if closed or ``max_events`` < 1."""
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events must be a whole number of at least 1, got {max_events!r}")
        with self._cond:
            if self._closed:
                raise ValueError(f"{self._label}: reader is closed")
            if isinstance(self._error, PartitionStolen):
                self._queue.clear()
                raise self._error
            out = [self._queue.popleft() for _ in range(min(max_events, len(self._queue)))]
            if out:
                self._cond.notify_all()  # room again for a callback waiting on a full queue
                return out
            if self._error is not None:
                raise self._error
            return out

    def close(self) -> None:
        """Stops receiving and waits (at most ``join_seconds``) for the receive thread to end."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        self._close_client()
        if threading.current_thread() is not self._thread:
            self._thread.join(self._join_seconds)
            if self._thread.is_alive():
                log.warning(
                    "%s: receive thread still inside the SDK %gs after close; left behind (daemon)",
                    self._label,
                    self._join_seconds,
                )

    def __enter__(self) -> EventHubsReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def receiving(self) -> bool:
        """Whether the receive thread is still running."""
        return self._thread.is_alive()

    # -- the SDK's side (its receive thread) -------------------------------------------------------

    def _run(self) -> None:
        try:
            self._client.receive_batch(self._on_batch, **self._kwargs)
        except Exception as exc:
            self._fail(exc)
        else:
            with self._cond:
                ended_alone = not self._closed and self._error is None
            if ended_alone:
                self._fail(RuntimeError("the SDK's receive returned without being closed"))

    def _on_batch(self, context: PartitionContext, batch: Sequence[EventData]) -> None:
        try:
            events = [received(self.partition_id, event) for event in batch]
            last = _last_enqueued(context.last_enqueued_event_properties)
        except Exception as exc:  # the SDK would only log it and go on past the event
            self._fail(exc)
            return
        if last is not None:
            self.last_enqueued = last
            if self._on_tracked is not None:
                self._on_tracked(self.partition_id, last)
        with self._cond:
            # Backpressure: while the queue is full the SDK's thread waits here and pulls nothing
            # more; the service holds the rest. close() and a failure wake it.
            while len(self._queue) >= self._capacity and not self._closed and self._error is None:
                self._cond.wait()
            if not self._closed and self._error is None:
                self._queue.extend(events)

    def _on_error(self, context: PartitionContext | None, error: Exception) -> None:
        self._fail(error)

    def _fail(self, error: BaseException) -> None:
        with self._cond:
            if self._closed or self._error is not None:
                return
            if is_stolen(error):
                failure: ReaderFailed = PartitionStolen(
                    f"{self._label}: another receiver took the partition (the service cut this one off:"
                    f" {_first_line(error)}); it is owned elsewhere now",
                    self.partition_id,
                )
                log.warning("%s", failure)
            else:
                failure = ReaderFailed(
                    f"{self._label}: receiving failed: {type(error).__name__}: {_first_line(error)}", self.partition_id
                )
                log.warning("%s", failure)
            failure.__cause__ = error
            self._error = failure
            self._cond.notify_all()
        # Stop the SDK before it re-creates the consumer from the original starting position.
        self._close_client()

    def _close_client(self) -> None:
        try:
            self._client.close()
        except Exception as exc:
            log.warning("%s: closing the client failed: %s", self._label, exc)


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
    )


def is_stolen(error: BaseException) -> bool:
    """Whether ``error`` (or what it wraps) is the service disconnecting a receiver for another
    one on the same partition: AMQP condition ``amqp:link:stolen``, or an epoch refusal."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, EventHubError) and current.error == "link:stolen":
            return True
        condition = getattr(current, "condition", None)
        condition = getattr(condition, "value", condition)
        if condition in (b"amqp:link:stolen", "amqp:link:stolen"):
            return True
        if "epoch" in str(current).lower():
            return True
        current = current.__cause__ or current.__context__
    return False


def _properties(partition_id: str, raw: dict[str, Any]) -> PartitionProperties:
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


def _last_enqueued(tracked: dict[str, Any] | None) -> LastEnqueued | None:
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


def _secrets(connection_string: str) -> list[str]:
    """The values of the secret parts of a connection string, longest first."""
    found = []
    for part in connection_string.split(";"):
        name, _, value = part.partition("=")
        if name.strip().lower() in ("sharedaccesskey", "sharedaccesssignature") and value.strip():
            found.append(value.strip())
    return sorted(found, key=len, reverse=True)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
