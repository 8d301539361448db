"""Event Hubs link addresses and starting-position filters.

Addresses, as the SDKs write them (scheme and host optional, keywords in any case)::

    $cbs                                                      claims-based authorization
    $management                                               hub and partition properties
    amqps://host:port/<hub>                                   send; the hub picks the partition
    amqps://host:port/<hub>/Partitions/<id>                   send to one partition
    amqps://host:port/<hub>/ConsumerGroups/<cg>/Partitions/<id>   receive one partition

A receiver's source carries an ``apache.org:selector-filter:string`` filter such as
``amqp.annotation.x-opt-offset > '-1'``: offset, sequence number or enqueued time (milliseconds),
``>`` or ``>=``; offset ``-1`` is the start of the partition and ``@latest`` its end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

CBS = "$cbs"
MANAGEMENT = "$management"
SELECTOR = "apache.org:selector-filter:string"
SELECTOR_CODE = 0x0000468C00000004
_FILTER = re.compile(
    r"^\s*amqp\.annotation\.(x-opt-offset|x-opt-sequence-number|x-opt-enqueued-time)\s*(>=|>)\s*'([^']*)'\s*$",
    re.IGNORECASE,
)


class BadAddress(ValueError):
    """An address or filter this hub does not serve; ``condition`` is the AMQP error to answer."""

    def __init__(self, description: str, condition: str = "amqp:not-found") -> None:
        super().__init__(description)
        self.condition = condition


@dataclass(frozen=True, slots=True)
class Address:
    """A parsed entity address. ``kind`` is "cbs", "management", "hub" (send, any partition),
    "partition" (send to ``partition_id``) or "consumer" (receive ``partition_id`` as ``consumer_group``)."""

    kind: str
    hub: str = ""
    partition_id: str | None = None
    consumer_group: str | None = None

    @property
    def entity(self) -> str:
        """The path a SAS token's resource must cover, lowercased: ``hub[/consumergroups/cg]``."""
        if self.consumer_group is not None:
            return f"{self.hub}/consumergroups/{self.consumer_group}".lower()
        return self.hub.lower()


@dataclass(frozen=True, slots=True)
class StartAt:
    """Where a receiver starts: ``field`` is "offset", "sequence" or "time"; ``value`` as written."""

    field: str
    value: str
    inclusive: bool

    @classmethod
    def earliest(cls) -> StartAt:
        return cls("offset", "-1", False)


def parse_address(address: str | None) -> Address:
    """The entity ``address`` names. Raises BadAddress."""
    if not address:
        raise BadAddress("the link has no address")
    text = address.strip()
    if text.lower() in (CBS, MANAGEMENT):
        return Address("cbs" if text.lower() == CBS else "management")
    path = urlsplit(text).path if "://" in text else text
    parts = [unquote(p) for p in path.strip("/").split("/")]
    if len(parts) == 1 and parts[0].lower() in (CBS, MANAGEMENT):
        return Address("cbs" if parts[0].lower() == CBS else "management")
    if not parts or not parts[0]:
        raise BadAddress(f"address {address!r} names no event hub")
    hub, rest = parts[0], [p.lower() for p in parts[1:]]
    if not rest:
        return Address("hub", hub)
    if len(rest) == 2 and rest[0] == "partitions":
        return Address("partition", hub, parts[2])
    if len(rest) == 4 and rest[0] == "consumergroups" and rest[2] == "partitions":
        return Address("consumer", hub, parts[4], parts[2])
    raise BadAddress(
        f"address {address!r} is not <hub>, <hub>/Partitions/<id> or <hub>/ConsumerGroups/<group>/Partitions/<id>"
    )


def parse_filter(filters: dict[Any, Any] | None) -> StartAt:
    """The starting position of a receiver's source filter map (earliest when there is none).
    Raises BadAddress (condition ``amqp:invalid-field``) for a filter this hub cannot apply."""
    if not filters:
        return StartAt.earliest()
    for key, value in filters.items():
        described = getattr(value, "descriptor", None)
        if str(key) != SELECTOR and str(described) != SELECTOR and described != SELECTOR_CODE:
            continue
        expression = getattr(value, "value", value)
        if isinstance(expression, bytes):
            expression = expression.decode("utf-8", "replace")
        match = _FILTER.match(str(expression))
        if match is None:
            raise BadAddress(f"unsupported selector {expression!r}", "amqp:invalid-field")
        name, operator, literal = match.groups()
        field = {"x-opt-offset": "offset", "x-opt-sequence-number": "sequence", "x-opt-enqueued-time": "time"}
        start = StartAt(field[name.lower()], literal, operator == ">=")
        _check(start)
        return start
    return StartAt.earliest()


def _check(start: StartAt) -> None:
    value = start.value
    if start.field == "offset" and (value in ("-1", "@latest") or value.isdigit()):
        return
    if start.field in ("sequence", "time") and re.fullmatch(r"-?\d+", value):
        return
    raise BadAddress(f"bad {start.field} {value!r} in the receiver's filter", "amqp:invalid-field")
