"""A producer's link: transfers in, appended to the embedded hub, settled with the outcome.

The client's sender attaches to ``<hub>`` (the hub picks the partition: by partition key, else
round-robin) or ``<hub>/Partitions/<id>``. Each delivery is one event or one batch (message format
0x80013700) and is appended in one write before it is accepted, so an accepted event is in the log
(not fsynced: it survives a crashed process, not a power cut). What cannot be stored is rejected
with an error and logged; a delivery over the link's max-message-size detaches the link.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from proton import Delivery, Disposition, Link

from workers.hub.amqp.links import detach_oversize, reject
from workers.hub.amqp.messages import BadMessage, parse
from workers.hub.embedded import EmbeddedHub

if TYPE_CHECKING:
    from workers.hub.amqp.connection import AmqpConnection

log = logging.getLogger("leaseboard.amqp")
CREDIT = 100


class ProducerLink:
    def __init__(
        self,
        conn: AmqpConnection,
        link: Link,
        hub: EmbeddedHub,
        partition_id: str | None,
        on_append: Callable[[str, int], None],
    ) -> None:
        self.conn, self.link, self.hub, self.partition_id = conn, link, hub, partition_id
        self._on_append = on_append
        self._buffer = bytearray()
        self._too_big = False
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.max_message_size = conn.limits.max_message_size
        link.rcv_settle_mode = Link.RCV_FIRST
        link.open()
        link.flow(CREDIT)

    def on_flow(self) -> None:
        pass

    def on_delivery(self, delivery: Delivery) -> None:
        link = self.link
        if delivery.aborted:
            self.conn.pop_format(link)
            self._buffer.clear()
            delivery.settle()
            return
        if delivery.readable:
            chunk = link.recv(delivery.pending) or b""
            if not self._too_big:
                self._buffer += chunk
        if not self._too_big and len(self._buffer) > self.conn.limits.max_message_size:
            self._too_big = True
            detach_oversize(self.conn, link, len(self._buffer))
            self._buffer.clear()
        if delivery.partial:
            return
        payload, self._buffer = bytes(self._buffer), bytearray()
        message_format = self.conn.pop_format(link)
        link.advance()
        if self._too_big:
            reject(delivery, "amqp:link:message-size-exceeded", "the message is larger than the link allows")
        else:
            self._store(delivery, payload, message_format)
        delivery.settle()
        if link.credit < CREDIT // 2 and not self._too_big:
            link.flow(CREDIT - link.credit)

    def on_detach(self) -> None:
        self._buffer.clear()

    def _store(self, delivery: Delivery, payload: bytes, message_format: int) -> None:
        try:
            incoming = parse(payload, message_format)
            # A keyed event on a partition's link (the SDK's buffered producer sends them so, having
            # placed the key itself) is stored on that partition, with its key.
            events = self.hub.send_batch(
                incoming.bodies,
                partition_key=incoming.partition_key,
                partition_id=self.partition_id,
                amqp=incoming.amqp,
            )
        except BadMessage as exc:
            log.warning("connection %d from %s: event refused: %s", self.conn.id, self.conn.peer, exc)
            reject(delivery, exc.condition, str(exc))
            return
        except (ValueError, TypeError) as exc:  # the hub's own checks: key too long, unknown partition
            log.warning("connection %d from %s: event refused: %s", self.conn.id, self.conn.peer, exc)
            reject(delivery, "com.microsoft:argument-error", str(exc))
            return
        except OSError as exc:
            log.error("hub %s: appending failed: %s", self.hub.name, exc)
            reject(delivery, "amqp:internal-error", f"the hub could not store the event: {exc.strerror or exc}")
            return
        delivery.update(Disposition.ACCEPTED)
        if events:
            self._on_append(events[0].partition_id, len(events))
