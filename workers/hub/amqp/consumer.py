"""A consumer's link: one partition of the embedded hub, read from a starting position, sent as credit allows.

Exclusive receivers (Event Hubs' epochs, the SDKs' owner level, link property
``com.microsoft:epoch``) are kept per hub, consumer group and partition by :class:`Receivers`:

- a receiver with an owner level displaces every receiver with a lower or equal one and every
  receiver without one (equal levels: the newest wins), which are detached with ``amqp:link:stolen``;
- a receiver with a lower owner level than one attached is refused (also ``amqp:link:stolen``,
  with a description that says why);
- a receiver without an owner level is refused while one with an owner level is attached;
- a sixth receiver of one partition and consumer group is refused (``amqp:resource-limit-exceeded``,
  with Event Hubs' description): Event Hubs allows five.

The registry lives in one server process: two ``runhub`` processes on one hub directory would not
see each other's receivers.

Events are read from the partition's log without locks (``workers.hub.reader.HubReader``) on the server's
loop, as many as the link has credit for, and sent presettled: delivery is at most once per link,
as with Event Hubs; a receiver that needs more reattaches from its last event.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from proton import Delivery, Link

from workers.hub.amqp.addresses import BadAddress, StartAt
from workers.hub.amqp.links import close
from workers.hub.amqp.messages import encode, millis, runtime_metrics
from workers.hub.embedded import EmbeddedHub
from workers.hub.log import CorruptLog, LogFile
from workers.hub.reader import HubReader
from workers.sources.base import Position, ReceivedEvent

if TYPE_CHECKING:
    from workers.hub.amqp.connection import AmqpConnection

log = logging.getLogger("leaseboard.amqp")
STOLEN = "amqp:link:stolen"
OUT_OF_RANGE = "com.microsoft:argument-out-of-range"
TOO_MANY = "amqp:resource-limit-exceeded"
MAX_RECEIVERS = 5  # per partition and consumer group, as in Event Hubs (its quotas page)


def open_reader(hub: EmbeddedHub, partition_id: str, start: StartAt) -> tuple[HubReader, float | None]:
    """A reader at ``start`` and, for a start by enqueued time, the time in milliseconds events
    must be after (at, if inclusive; it is then applied by the caller). Raises BadAddress."""
    try:
        if start.field == "time":
            return hub.reader(partition_id, Position()), float(start.value)
        if start.field == "offset":
            if start.value == "-1":
                return hub.reader(partition_id, Position()), None
            if start.value == "@latest":
                return hub.reader(partition_id, Position(latest=True)), None
            if not start.inclusive:
                return hub.reader(partition_id, Position(offset=start.value)), None
            return _at_offset(hub, partition_id, int(start.value)), None
        sequence = int(start.value) - (1 if start.inclusive else 0)
        if sequence < 0:
            return hub.reader(partition_id, Position()), None
        return hub.reader(partition_id, Position(sequence_number=sequence)), None
    except ValueError as exc:
        raise BadAddress(str(exc), OUT_OF_RANGE) from None


def _at_offset(hub: EmbeddedHub, partition_id: str, offset: int) -> HubReader:
    # An inclusive offset: the reader starts at the record there, which must be intact.
    log_file = LogFile(str(hub.path / f"{partition_id}.log"), hub.name, partition_id)
    found = log_file.record_at(offset)
    if found is None:
        log_file.close()
        raise ValueError(f"hub {hub.name!r} partition {partition_id}: no event starts at offset {offset}")
    return HubReader(log_file, offset, found[0])


class ConsumerLink:
    """Our sender of one partition to one receiver."""

    def __init__(
        self,
        conn: AmqpConnection,
        link: Link,
        hub: EmbeddedHub,
        partition_id: str,
        consumer_group: str,
        start: StartAt,
        owner_level: int | None,
        metrics: bool,
        on_credit: Callable[[], None],
    ) -> None:
        self.conn, self.link, self.hub = conn, link, hub
        self._on_credit = on_credit
        self.partition_id = partition_id
        self.consumer_group = consumer_group
        self.owner_level = owner_level
        self.metrics = metrics
        self.gone = False
        self.sent = 0
        self._reader, self._after_ms = open_reader(hub, partition_id, start)
        self._inclusive = start.inclusive
        self._pending: deque[ReceivedEvent] = deque()  # read from the log, not sent yet
        self._tags = 0

    def open(self) -> None:
        link = self.link
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = Link.SND_SETTLED
        link.open()

    @property
    def ready(self) -> bool:
        return not self.gone and not self.conn.paused and self.link.credit > 0

    def pump(self, budget: int, max_bytes: int = 1 << 20) -> int:
        """Sends up to ``budget`` events the link has credit for, stopping once ``max_bytes`` went
        out (large events must not pile up in memory ahead of the socket); returns how many."""
        if not self.ready:
            return 0
        link = self.link
        if not self._pending:
            try:
                self._pending.extend(self._next(min(link.credit, budget)))
            except CorruptLog as exc:
                log.error("%s; detaching the receiver of partition %s", exc, self.partition_id)
                self.detach("amqp:internal-error", str(exc))
                return 0
        if not self._pending:
            return 0
        metrics = runtime_metrics(self.hub.properties(self.partition_id), time.time()) if self.metrics else b""
        sent = size = 0
        while self._pending and sent < budget and link.credit > 0 and size < max_bytes:
            payload = encode(self._pending.popleft(), metrics)
            self._tags += 1
            delivery = link.delivery(str(self._tags))
            link.send(payload)
            link.advance()
            delivery.settle()
            sent += 1
            size += len(payload)
        self.sent += sent
        return sent

    def _next(self, count: int) -> list[ReceivedEvent]:
        while True:
            events = self._reader.receive(count)
            if self._after_ms is None or not events:
                return events
            after, inclusive = self._after_ms, self._inclusive
            kept = [e for e in events if (t := millis(e.enqueued_time)) > after or (inclusive and t == after)]
            if kept:
                self._after_ms = None  # enqueued times never go back within a partition
                return kept

    def detach(self, condition: str, description: str) -> None:
        """Detaches the link with an error (the peer is told at the next flush)."""
        if not self.gone:
            close(self.link, condition, description)
            self.on_detach()

    def on_flow(self) -> None:
        self._on_credit()  # the server's pump sends what the credit allows

    def on_delivery(self, delivery: Delivery) -> None:
        delivery.settle()

    def on_detach(self) -> None:
        if not self.gone:
            self.gone = True
            self._reader.close()


class Receivers:
    """The receivers attached per (hub, consumer group, partition), for owner-level exclusivity."""

    def __init__(self) -> None:
        self._by_partition: dict[tuple[str, str, str], list[ConsumerLink]] = defaultdict(list)

    def admit(self, new: ConsumerLink) -> tuple[str, str] | None:
        """Registers ``new`` and detaches the receivers it displaces; returns the AMQP condition and
        description ``new`` is refused with instead (then nothing changes)."""
        key = (new.hub.name, new.consumer_group.lower(), new.partition_id)
        current = [r for r in self._by_partition[key] if not r.gone]
        levels = [r.owner_level for r in current if r.owner_level is not None]
        if new.owner_level is None:
            if levels:
                return STOLEN, (
                    f"At least one receiver for the endpoint is created with epoch of '{max(levels)}', and so"
                    " non-epoch receiver is not allowed. Either reconnect with a higher epoch, or make sure all"
                    " epoch receivers are closed or disconnected."
                )
            if len(current) >= MAX_RECEIVERS:
                names = ", ".join(r.link.name for r in current)
                return TOO_MANY, (
                    f"Exceeded the maximum number of allowed receivers per partition in a consumer group which is"
                    f" {MAX_RECEIVERS}. Partition {new.partition_id} of consumer group '{new.consumer_group}';"
                    f" list of connected receivers - {names}."
                )
            current.append(new)
        else:
            if levels and max(levels) > new.owner_level:
                return STOLEN, (
                    f"Receiver '{new.link.name}' with epoch '{new.owner_level}' cannot be created because a receiver"
                    f" with a higher epoch '{max(levels)}' already exists for partition {new.partition_id} of"
                    f" consumer group '{new.consumer_group}'."
                )
            for old in current:
                old.detach(
                    STOLEN,
                    f"New receiver '{new.link.name}' with higher epoch of '{new.owner_level}' is created hence"
                    f" current receiver '{old.link.name}' with epoch '{old.owner_level}' is getting disconnected."
                    " If you are recreating the receiver, make sure a higher epoch is used.",
                )
                log.info(
                    "partition %s of %s/%s: receiver %r (owner level %s, connection %d) displaced by %r (owner"
                    " level %s, connection %d)",
                    new.partition_id,
                    new.hub.name,
                    new.consumer_group,
                    old.link.name,
                    old.owner_level,
                    old.conn.id,
                    new.link.name,
                    new.owner_level,
                    new.conn.id,
                )
                if old.conn is not new.conn:
                    old.conn.flush()
            current = [new]
        self._by_partition[key] = current
        return None

    def all(self) -> list[ConsumerLink]:
        return [r for rs in self._by_partition.values() for r in rs if not r.gone]

    def prune(self) -> None:
        for key in [k for k, rs in self._by_partition.items() if all(r.gone for r in rs)]:
            del self._by_partition[key]
