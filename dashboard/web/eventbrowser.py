"""The event browser: a partition's events as the hub holds them, ``/api/partitions/<id>/events`` and
the partition page's panel that pages through it (``eventbrowser.js``).

A page is a run of consecutive sequence numbers, named by where it starts or ends: ``from=newest``
(the default: the last ``count`` events), ``earliest``, ``sequence:N``, ``offset:X`` (the event at
that offset) or ``time:<ISO 8601>`` (the first enqueued then or later), or a cursor of the page
before: ``before=N`` (the ``count`` events before sequence number N) or ``after=N`` (those after
it). ``order`` lists it newest first (the default) or oldest first. At most COUNT_MAX events and
about READ_BUDGET bytes are read (the event that crosses it is the last read); a run that ends
(``newest``, ``before``) and was cut by the bytes is read once more from later on (``read_page``), so
that it still ends where asked: at most twice READ_BUDGET then.

The events are read from the configured source (``state.with_source``: the embedded hub, or Event
Hubs through the SDK) with ``browse`` (``workers.sources.base.Browsing``): no lease, no checkpoint,
no exclusive link, so no worker notices. Bodies are decoded as JSON, text or hex
(``workers.deadletter.decode``) and shown to staff only unless ``LEASEBOARD_EVENT_BODIES`` is
``readers`` (``access.sees_event_bodies``). A hub that cannot be read is a 503, a bad parameter, an
unknown partition or a position naming no event a 400.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from balancer.model import HubRef
from workers.deadletter.decode import body_view, json_safe, properties_of
from workers.sources.base import Browsed, EventSource, PartitionProperties, Start

from ..control.resets import parse_time
from ..live.state import with_source
from .access import sees_event_bodies
from .common import bad_request, check_partition_id, int_param, known, not_found, query_ref
from .degrade import unavailable_json
from .methods import read_only

log = logging.getLogger(__name__)

COUNT_DEFAULT = 20
COUNT_MAX = 100
READ_BUDGET = 4 * 1024 * 1024  # bytes of bodies and sections read a request (one event more at most)
SEQUENCE_MAX = 2**63 - 1
FROM_PATTERN = r"^(newest|earliest|sequence:(0|[1-9][0-9]{0,18})|offset:(0|[1-9][0-9]{0,19})|time:[^\x00]{1,64})$"
CURSOR_PATTERN = r"^(0|[1-9][0-9]{0,18})$"
ORDERS = ("newest", "oldest")
_FROM = re.compile(FROM_PATTERN)
_CURSOR = re.compile(CURSOR_PATTERN)


@dataclass(frozen=True, slots=True)
class Ask:
    """The page asked for: its run starts at ``start`` (inclusive), or ends at ``end`` (inclusive;
    None with ``start``; the last event for ``from=newest``)."""

    position: str  # as the answer repeats it: "newest", "sequence:5", "before:9", ...
    start: Start | None = None
    end: int | None = None


def _cursor(name: str, raw: str) -> int:
    if not _CURSOR.fullmatch(raw) or int(raw) > SEQUENCE_MAX:
        raise ValueError(f"{name} must be a sequence number (a page's older or newer), got {raw!r}")
    return int(raw)


def parse_ask(query: Any) -> Ask:
    """The position of a query (``from``, ``before``, ``after``); ValueError saying what is wrong."""
    given = [name for name in ("from", "before", "after") if query.get(name, "") != ""]
    if len(given) > 1:
        raise ValueError(f"give one of from, before and after, not {' and '.join(given)}")
    if query.get("before", ""):
        before = _cursor("before", query["before"])
        return Ask(f"before:{before}", end=before - 1)
    if query.get("after", ""):
        after = _cursor("after", query["after"])
        return Ask(f"after:{after}", start=Start(sequence_number=after + 1))
    raw = query.get("from", "") or "newest"
    found = _FROM.fullmatch(raw)
    kind, _, value = raw.partition(":")
    if found is None and kind not in ("sequence", "offset"):
        if kind == "time":
            raise ValueError(f"from=time: needs an ISO 8601 time like 2026-11-30T12:00:00Z, got {value!r}")
        raise ValueError(f"from must be newest, earliest, sequence:N, offset:X or time:<ISO 8601>, got {raw!r}")
    if found is None:
        raise ValueError(f"from={kind}: needs a whole number of at least 0 (digits only), got {value!r}")
    if kind in ("sequence", "offset") and int(value) > SEQUENCE_MAX:  # a hub's are 64-bit signed
        raise ValueError(f"from={kind}: needs a whole number of at most {SEQUENCE_MAX}, got {value!r}")
    if kind == "newest":
        return Ask("newest", end=None)
    if kind == "earliest":
        return Ask("earliest", start=Start(sequence_number=0))
    if kind == "sequence":
        return Ask(raw, start=Start(sequence_number=int(value)))
    if kind == "offset":
        return Ask(raw, start=Start(offset=value))
    when = parse_time(value)
    if when is None:
        raise ValueError(f"from=time: needs an ISO 8601 time like 2026-11-30T12:00:00Z, got {value!r}")
    return Ask(raw, start=Start(enqueued_time=when))


def plan(ask: Ask, props: PartitionProperties, count: int) -> tuple[Start, int, int] | None:
    """(start, most events, last sequence number wanted) of the read; None when the run is empty.
    ValueError for a sequence number past the partition's end."""
    first, last = props.begin_sequence_number, props.last_enqueued_sequence_number
    if ask.start is None:  # a run that ends: at the newest event, or before a cursor
        end = last if ask.end is None else min(ask.end, last)
        if end < first:
            return None
        low = max(first, end - count + 1)
        return Start(sequence_number=low), end - low + 1, end
    wanted = ask.start.sequence_number
    if wanted is not None and ask.position.startswith("sequence:") and wanted > last + 1:
        held = f"{first}..{last}" if last >= first else "none yet"
        raise ValueError(f"partition {props.partition_id} has no event {wanted}: it holds {held}")
    if last < first or (wanted is not None and wanted > last):
        return None
    if wanted is not None:  # retention may have removed the first ones: the run starts at the first kept
        return Start(sequence_number=max(first, wanted)), count, last
    return ask.start, count, last


def shown(browsed: Browsed, bodies: bool) -> dict[str, Any]:
    """One event as the API shows it (its body only when ``bodies``)."""
    event = browsed.event
    properties = properties_of(event.amqp) if browsed.properties is None else json_safe(browsed.properties)
    return {
        "partition_id": event.partition_id,
        "sequence_number": event.sequence_number,
        "offset": event.offset,
        "enqueued_time": event.enqueued_time,
        "partition_key": event.partition_key,
        "properties": properties,
        "body": body_view(event.body) if bodies else None,
    }


def read_page(source: EventSource, partition_id: str, ask: Ask, count: int) -> dict[str, Any]:
    """The events of a page, oldest first, and the partition's bounds. Blocking (reads the hub)."""
    browse = getattr(source, "browse", None)
    if browse is None:
        raise ConnectionError(f"the event source {type(source).__name__} cannot browse")
    props = source.properties(partition_id)  # ValueError for an unknown partition
    planned = plan(ask, props, count)
    if planned is None:
        return {"properties": props, "events": []}
    start, most, until = planned
    group = settings.LEASEBOARD_BROWSE_CONSUMER_GROUP or None
    events: list[Browsed] = browse(partition_id, start, most, READ_BUDGET, until=until, consumer_group=group)
    cut = sum(len(b.event.body) + len(b.event.amqp) for b in events) >= READ_BUDGET
    if cut and ask.start is None and events[-1].event.sequence_number < until:
        # The byte bound cut a run that ends at ``until`` (the newest, or before a cursor) short of its
        # end: read again as many of its last events as fitted, so that the page ends where it was asked
        # to. Bodies grow towards the end: this read may be cut too, and its page ends earlier then.
        again = Start(sequence_number=until - len(events) + 1)
        events = browse(partition_id, again, len(events), READ_BUDGET, until=until, consumer_group=group)
    events = [b for b in events if b.event.sequence_number <= until][:count]
    return {"properties": props, "events": events}


def answer(ref: HubRef, partition_id: str, ask: Ask, order: str, count: int, read: dict[str, Any], bodies: bool) -> Any:
    """The ``/api/partitions/<id>/events`` document."""
    props: PartitionProperties = read["properties"]
    events: list[Browsed] = read["events"]
    first, last = props.begin_sequence_number, props.last_enqueued_sequence_number
    low = events[0].event.sequence_number if events else None
    high = events[-1].event.sequence_number if events else None
    bytes_read = sum(len(b.event.body) + len(b.event.amqp) for b in events)
    listed = [shown(b, bodies) for b in (reversed(events) if order == "newest" else events)]
    return {
        "hub": ref.hub,
        "consumer_group": ref.consumer_group,
        "partition_id": partition_id,
        "generated_at": time.time(),
        "source": settings.LEASEBOARD_SOURCE,
        "position": ask.position,
        "order": order,
        "count": count,
        "events": listed,
        "older": low if low is not None and low > first else None,
        "newer": high if high is not None and high < last else None,
        "first_sequence_number": first if last >= first else None,
        "last_sequence_number": last if last >= 0 else None,
        "bytes_read": bytes_read,
        "cut": bytes_read >= READ_BUDGET,
        "bodies_shown": bodies,
    }


def _query(request: HttpRequest, partition_id: str) -> tuple[HubRef, Ask, str, int]:
    ref = query_ref(request)
    check_partition_id(partition_id)
    ask = parse_ask(request.GET)
    order = request.GET.get("order", "") or "newest"
    if order not in ORDERS:
        raise ValueError(f"order must be newest or oldest, got {order!r}")
    count = int_param(request, "count", COUNT_DEFAULT, 1, COUNT_MAX)
    assert count is not None
    return ref, ask, order, count


@read_only
async def api_partition_events(request: HttpRequest, partition_id: str) -> HttpResponse:
    """200 with a page of the partition's events; 400 for a bad parameter, an unknown partition or a
    position naming no event; 404 for an unknown hub or consumer group; 503 when the hub cannot be read."""
    try:
        ref, ask, order, count = _query(request, partition_id)
    except ValueError as exc:
        return bad_request(str(exc))
    if not await known(ref):
        return not_found(ref)
    bodies = sees_event_bodies(await request.auser())
    try:
        read = await asyncio.to_thread(with_source, ref.hub, lambda s: read_page(s, partition_id, ask, count))
    except ValueError as exc:
        return bad_request(str(exc))
    except Exception as exc:  # the hub is a foreign system: whatever it raises is an outage of it, not a 500
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        log.warning("event browser: hub %r partition %s cannot be read: %s", ref.hub, partition_id, reason)
        return unavailable_json(f"event source unavailable: {reason}")
    if read is None:
        return unavailable_json(
            f"event source unavailable: the {settings.LEASEBOARD_SOURCE} hub {ref.hub!r} cannot be opened"
        )
    return JsonResponse(answer(ref, partition_id, ask, order, count, read, bodies))
