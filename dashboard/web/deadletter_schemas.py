"""``/api/deadletters`` in the console's OpenAPI document (``openapi.py``, ``schemas.py``): its query
parameters and the page of dead letters it answers with."""

from __future__ import annotations

from .deadletters import CURSOR_PATTERN, LIMIT_MAX
from .schema_parts import INTEGER, NUMBER, PARTITION_PATTERN, STRING, Schema, array, nullable, obj, query, ref, whole

BODY = obj(
    {
        "encoding": {
            "type": "string",
            "enum": ["json", "text", "hex"],
            "description": "json: the whole body is JSON (value: it); text: UTF-8 text; hex: anything else",
        },
        "value": {"description": "the body as JSON, as text, or as hex digits"},
        "size": {**INTEGER, "description": "the body's bytes"},
        "truncated": {"type": "boolean", "description": "only its first 64 KiB are shown"},
    }
)

DEAD_LETTER = obj(
    {
        "partition_id": STRING,
        "sequence_number": INTEGER,
        "offset": nullable(STRING),
        "enqueued_time": nullable(NUMBER),
        "partition_key": nullable(STRING),
        "set_aside_at": nullable(NUMBER),
        "owner_id": nullable(STRING),
        "attempts": nullable(INTEGER),
        "error": {**nullable(STRING), "description": "the handler's error; its text for staff only"},
        "properties": {"type": "object", "additionalProperties": True, "description": "application properties"},
        "body": {**nullable(BODY), "description": "the body, decoded; null for readers who are not staff"},
        "replayed": nullable(
            obj(
                {
                    "replayed_at": NUMBER,
                    "user": nullable(STRING),
                    "to": {
                        **nullable(STRING),
                        "description": "the new event's partition:sequence when known, or 'in place by <worker>', or "
                        "'in place (pending)'",
                    },
                }
            )
        ),
        "in_place_failed": {
            **nullable(
                obj(
                    {
                        "replayed_at": NUMBER,
                        "user": nullable(STRING),
                        "owner": nullable(STRING),
                        "error": {**nullable(STRING), "description": "its text for staff only"},
                    }
                )
            ),
            "description": "the last replay in place, when its handler call failed (the dead letter is not replayed)",
        },
    }
)

DEAD_LETTERS = obj(
    {
        "hub": STRING,
        "consumer_group": STRING,
        "partition": nullable(STRING),
        "generated_at": NUMBER,
        "entries": array(ref("DeadLetter")),
        "next": {**nullable(STRING), "description": "the cursor of the next page (its after); null: no more"},
        "limit": INTEGER,
        "bytes_read": {**INTEGER, "description": "bytes of dead-letter files read for this page"},
        "partitions": {**array(STRING), "description": "the partitions with a dead-letter file"},
    }
)

SCHEMAS: dict[str, Schema] = {"DeadLetters": DEAD_LETTERS, "DeadLetter": DEAD_LETTER}

PARAMETERS: list[Schema] = [
    query("partition", {"type": "string", "pattern": PARTITION_PATTERN}, "Only this partition's dead letters.", "0"),
    query(
        "after",
        {"type": "string", "pattern": CURSOR_PATTERN},
        "Where the page starts: the next of the page before ('<partition>:<byte position>').",
    ),
    query("limit", whole(1, LIMIT_MAX), f"How many to return (1 to {LIMIT_MAX}, default 50)."),
]
