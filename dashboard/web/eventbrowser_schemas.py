"""``/api/partitions/{partition_id}/events`` in the console's OpenAPI document (``openapi.py``,
``schemas.py``): its query parameters and the page of a partition's events it answers with."""

from __future__ import annotations

from .deadletter_schemas import BODY
from .eventbrowser import COUNT_DEFAULT, COUNT_MAX, CURSOR_PATTERN, FROM_PATTERN, ORDERS
from .schema_parts import BOOLEAN, INTEGER, NUMBER, STRING, Schema, array, nullable, obj, query, ref, whole

EVENT = obj(
    {
        "partition_id": STRING,
        "sequence_number": INTEGER,
        "offset": STRING,
        "enqueued_time": {**NUMBER, "description": "seconds since the epoch, the hub's clock"},
        "partition_key": nullable(STRING),
        "properties": {"type": "object", "additionalProperties": True, "description": "application properties"},
        "body": {**nullable(BODY), "description": "the body, decoded; null for whoever may not see bodies"},
    }
)

CURSOR = {
    **nullable(INTEGER),
    "description": "a sequence number to page on with; null: nothing further (at the time of reading)",
}

HUB_EVENTS = obj(
    {
        "hub": STRING,
        "consumer_group": STRING,
        "partition_id": STRING,
        "generated_at": NUMBER,
        "source": {**STRING, "description": "the event source read: embedded or eventhubs"},
        "position": {**STRING, "description": "the position asked for: newest, sequence:N, before:N, ..."},
        "order": {"type": "string", "enum": list(ORDERS)},
        "count": INTEGER,
        "events": array(ref("HubEvent")),
        "older": {**CURSOR, "description": "before= of the page of older events; null: none is retained"},
        "newer": {**CURSOR, "description": "after= of the page of newer events; null: none yet"},
        "first_sequence_number": {**nullable(INTEGER), "description": "the first retained event; null: empty"},
        "last_sequence_number": {**nullable(INTEGER), "description": "the last enqueued event; null: empty"},
        "bytes_read": {**INTEGER, "description": "bytes of the bodies and AMQP sections of the events shown"},
        "cut": {**BOOLEAN, "description": "the page ended at the byte bound (about 4 MiB), not at count"},
        "bodies_shown": {**BOOLEAN, "description": "false: bodies are for staff only (LEASEBOARD_EVENT_BODIES)"},
    }
)

SCHEMAS: dict[str, Schema] = {"HubEvents": HUB_EVENTS, "HubEvent": EVENT}

PARAMETERS: list[Schema] = [
    query(
        "from",
        {"type": "string", "pattern": FROM_PATTERN},
        "Where the page is: newest (the default: the last events), earliest, sequence:N (from that sequence "
        "number on), offset:X (from the event at that offset on) or time:<ISO 8601> (from the first event "
        "enqueued then or later; no zone: UTC). Not with before or after.",
        "sequence:0",
    ),
    query("before", {"type": "string", "pattern": CURSOR_PATTERN}, "The events before this sequence number."),
    query("after", {"type": "string", "pattern": CURSOR_PATTERN}, "The events after this sequence number."),
    query("count", whole(1, COUNT_MAX), f"How many events at most (1 to {COUNT_MAX}, default {COUNT_DEFAULT})."),
    query("order", {"type": "string", "enum": ["", *ORDERS]}, "newest (the default) or oldest first."),
]
