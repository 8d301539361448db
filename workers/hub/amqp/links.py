"""What every link handler does the same way: refuse an attach, reject a delivery, stop an oversize one."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from proton import Condition, Delivery, Disposition, Link

if TYPE_CHECKING:
    from workers.hub.amqp.connection import AmqpConnection

log = logging.getLogger("leaseboard.amqp")


def refuse(conn: AmqpConnection, link: Link, condition: str, description: str) -> None:
    """Answers an attach with an attach echoing the peer's terminus (the SDK reads a null one as
    a broken link, not as a refusal) and at once a closing detach carrying the error; logs it."""
    log.warning(
        "connection %d from %s: refused link %r (%s %s): %s: %s",
        conn.id,
        conn.peer,
        link.name,
        "source" if link.is_sender else "target",
        (link.remote_source.address if link.is_sender else link.remote_target.address),
        condition,
        description,
    )
    link.source.copy(link.remote_source)
    link.target.copy(link.remote_target)
    link.open()
    close(link, condition, description)


def close(link: Link, condition: str, description: str) -> None:
    """Detaches ``link`` (closed) with an error."""
    link.condition = Condition(condition, description)
    link.close()


def reject(delivery: Delivery, condition: str, description: str) -> None:
    """Sets ``delivery``'s outcome to rejected with an error (the caller settles it)."""
    delivery.local.condition = Condition(condition, description)
    delivery.update(Disposition.REJECTED)


def detach_oversize(conn: AmqpConnection, link: Link, size: int) -> None:
    """Detaches ``link`` with amqp:link:message-size-exceeded (a transfer passed the link's
    max-message-size: the spec's answer) and logs it."""
    limit = conn.limits.max_message_size
    log.warning(
        "connection %d from %s: a message of more than %d bytes on link %r (limit %d); detaching it",
        conn.id,
        conn.peer,
        size,
        link.name,
        limit,
    )
    description = f"the message is larger than the link's max-message-size of {limit} bytes"
    close(link, "amqp:link:message-size-exceeded", description)
