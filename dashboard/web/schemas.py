"""The parts of the console's OpenAPI document (``openapi.py``): the query parameters, the objects
the API answers with and takes, and the shared responses, built from the same constants the views
check against.
"""

from __future__ import annotations

from typing import Any

from ..control.action import Argument, Kind
from ..control.registry import MAX_FIELD, NAMES, REGISTRY
from ..live.console import Lease
from ..live.lag import STATUSES
from .common import CATEGORIES, EVENTS_MAX, ID_MAX

Schema = dict[str, Any]

STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
NUMBER: Schema = {"type": "number"}
BOOLEAN: Schema = {"type": "boolean"}


def nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


def obj(properties: dict[str, Schema], *, optional: tuple[str, ...] = ()) -> Schema:
    """An object with ``properties``, all required but ``optional``; further keys allowed."""
    return {
        "type": "object",
        "properties": properties,
        "required": [k for k in properties if k not in optional],
        "additionalProperties": True,
    }


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def counts(values: tuple[str, ...] | None = None) -> Schema:
    """An object of whole numbers, by key (the keys named when given)."""
    if values is None:
        return {"type": "object", "additionalProperties": INTEGER}
    return obj(dict.fromkeys(values, INTEGER))


# --- parameters ---------------------------------------------------------------------------------

# The names ``state.parse_ref`` accepts (matched whole); empty or missing means the configured one.
HUB_PATTERN = r"^([A-Za-z0-9][A-Za-z0-9._-]{0,254})?$"
CONSUMER_GROUP_PATTERN = r"^(\$?[A-Za-z0-9][A-Za-z0-9._-]*)?$"
PARTITION_PATTERN = r"^(0|[1-9][0-9]{0,5})$"
_CATEGORY = "|".join(CATEGORIES)
KIND_PATTERN = rf"^({_CATEGORY})?(,({_CATEGORY})?)*$"


def query(name: str, schema: Schema, description: str, example: Any = None) -> Schema:
    found: Schema = {
        "name": name, "in": "query", "required": False, "schema": schema, "allowEmptyValue": True,
        "description": f"{description} Empty is the same as missing.",
    }  # fmt: skip
    if example is not None:
        found["example"] = example
    return found


def whole(low: int, high: int = ID_MAX) -> Schema:
    return {"type": "integer", "minimum": low, "maximum": high}


PARAMETERS: dict[str, Schema] = {
    "hub": query(
        "hub", {"type": "string", "maxLength": 255, "pattern": HUB_PATTERN},
        "The event hub: letters, digits, '.', '-', '_', starting with a letter or digit, at most 255 "
        "characters. Missing: the configured hub.", "sensors",
    ),
    "consumer_group": query(
        "consumer_group", {"type": "string", "maxLength": 255, "pattern": CONSUMER_GROUP_PATTERN},
        "The consumer group: like a hub name, optionally after one leading '$'. Missing: the configured "
        "consumer group.", "$Default",
    ),
    "limit": query("limit", whole(1, EVENTS_MAX), f"How many to return (1 to {EVENTS_MAX})."),
    "kind": query(
        "kind", {"type": "string", "pattern": KIND_PATTERN},
        f"Comma-separated event categories, among: {', '.join(CATEGORIES)}.", "claim,steal",
    ),
    "partition": query("partition", STRING, "Only the events of this partition id."),
    "worker": query("worker", STRING, "Only the events that name this worker (owner, previous owner or reporter)."),
}  # fmt: skip

HUB_PARAMETERS = [{"$ref": "#/components/parameters/hub"}, {"$ref": "#/components/parameters/consumer_group"}]


# --- objects --------------------------------------------------------------------------------------

LAG_STATUSES = [s.value for s in STATUSES]
LEASES = [lease.value for lease in Lease]

PARTITION = obj({
    "id": STRING, "owner": nullable(STRING), "status": {"type": "string", "enum": LEASES},
    "last_modified": nullable(NUMBER), "sequence_number": nullable(INTEGER),
    "last_enqueued_sequence_number": nullable(INTEGER), "last_enqueued_time": nullable(NUMBER),
    "checkpoint_modified": nullable(NUMBER), "lag": nullable(INTEGER), "pinned_to": nullable(STRING),
    "lag_seconds": nullable(NUMBER), "lag_status": nullable({"type": "string", "enum": LAG_STATUSES}),
    "events_per_second": nullable(NUMBER),
})  # fmt: skip

WORKER = obj({
    "id": STRING, "owned": INTEGER, "draining": BOOLEAN, "last_seen": nullable(NUMBER), "alive": BOOLEAN,
    "events_per_second": nullable(NUMBER), "purgeable": BOOLEAN,
})  # fmt: skip

LAG_RULES = obj({"window": INTEGER, "sample_seconds": NUMBER, "stop_seconds": NUMBER})

CAPACITY = obj({
    "desired_workers": INTEGER, "keda_desired_workers": nullable(INTEGER), "keda_threshold": INTEGER,
    "partitions": INTEGER, "target_catchup_seconds": NUMBER, "backlog": nullable(INTEGER), "workers": INTEGER,
    "enqueue_rate": nullable(NUMBER), "processing_rate": nullable(NUMBER), "per_worker_rate": nullable(NUMBER),
    "measured_capacity": BOOLEAN, "span_seconds": nullable(NUMBER), "reason": nullable(STRING),
})  # fmt: skip

SUMMARY = obj({
    "partitions": INTEGER, "owned": INTEGER, "by_status": counts(tuple(LEASES)),
    "by_lag_status": counts(tuple(LAG_STATUSES)), "lag": nullable(INTEGER), "workers": INTEGER,
    "workers_alive": INTEGER, "workers_draining": INTEGER, "capacity": nullable(ref("Capacity")),
})  # fmt: skip

STATE = obj(
    {
        "namespace": STRING, "hub": STRING, "consumer_group": STRING, "generated_at": NUMBER, "expiry": NUMBER,
        "last_event_id": INTEGER,
        "source": obj({"name": STRING, "available": BOOLEAN, "error": nullable(STRING)}),
        "partitions": array(ref("Partition")), "workers": array(ref("Worker")),
        "sampled_at": nullable(NUMBER), "lag_rules": nullable(ref("LagRules")), "version": nullable(INTEGER),
        "summary": ref("Summary"),
        "stale": {"type": "boolean", "description": "true: the store cannot be read; this is the last known state"},
        "error": {"type": "string", "description": "why the state is stale (only when it is)"},
    },
    optional=("error",),
)  # fmt: skip

EVENT = obj({
    "id": INTEGER, "kind": STRING, "category": STRING, "namespace": STRING, "hub": STRING, "consumer_group": STRING,
    "partition_id": {"type": "string", "description": "a partition id; '*' for a worker's drain or undrain"},
    "owner_id": nullable(STRING), "previous_owner": nullable(STRING), "reporter": STRING,
    "reason": STRING, "at": NUMBER, "handoff": BOOLEAN,
})  # fmt: skip

AUDIT_ENTRY = obj({
    "id": INTEGER, "at": NUMBER,
    "user": {"type": "string", "description": "the user name for staff; '(staff only)' for other readers"},
    "action": STRING, "target": STRING, "value": STRING, "reason": STRING,
    "outcome": {"type": "string", "enum": ["applied", "refused", "failed"]}, "message": STRING, "moves": INTEGER,
})  # fmt: skip

SAMPLE = obj({
    "at": NUMBER, "owner": nullable(STRING), "sequence_number": nullable(INTEGER),
    "checkpoint_modified": nullable(NUMBER), "last_enqueued_sequence_number": nullable(INTEGER),
    "lag": nullable(INTEGER), "lag_seconds": nullable(NUMBER), "status": nullable(STRING),
})  # fmt: skip

PARTITION_DETAIL = obj({
    "partition": nullable(ref("Partition")),
    "error": nullable({"type": "string", "description": "why the current state could not be read"}),
    "generated_at": nullable(NUMBER), "last_event_id": nullable(INTEGER), "lag_rules": ref("LagRules"),
    "timeline": array(obj({
        "owner": STRING, "since": NUMBER, "came": STRING, "came_reason": STRING, "from": nullable(STRING),
        "until": nullable(NUMBER), "ended": nullable(STRING), "ended_reason": nullable(STRING),
        "event_id": nullable(INTEGER),
    })),
    "events": array(ref("Event")), "samples": array(ref("LagSample")),
    "checkpoints": array(obj({
        "sequence_number": INTEGER, "at": NUMBER, "owner": nullable(STRING), "moved": nullable(INTEGER),
    })),
    "audit": array(ref("AuditEntry")),
})  # fmt: skip

HISTORY = obj({
    "episodes": array(obj({
        "started": NUMBER, "ended": NUMBER, "seconds": NUMBER, "first_id": INTEGER, "last_id": INTEGER,
        "trigger": STRING, "moves": INTEGER, "claims": INTEGER, "events": INTEGER, "kinds": counts(),
        "partitions": INTEGER, "workers": array(STRING), "balanced": nullable(BOOLEAN), "counts": counts(),
    })),
    "quiet": NUMBER, "partitions": nullable(INTEGER), "events": INTEGER, "truncated": BOOLEAN,
})  # fmt: skip

PIPELINE = obj({
    "hub": STRING, "generated_at": NUMBER,
    "chart": obj({
        "sensors": array(STRING),
        "series": array(obj({"minute": NUMBER, "events": counts(), "alerts": INTEGER})),
    }),
    "alerts": array(obj({
        "partition_id": STRING, "sequence_number": INTEGER, "home": STRING, "kind": STRING, "sensor": STRING,
        "sensor_id": STRING, "event": STRING, "event_time": NUMBER, "raised_at": NUMBER,
    })),
    "batches": array(obj({
        "batch_id": INTEGER, "finished_at": NUMBER, "events": INTEGER, "input_rows": nullable(INTEGER),
        "duplicates": nullable(INTEGER), "alerts": INTEGER, "unreadable_files": INTEGER, "write_seconds": NUMBER,
        "duration_seconds": nullable(NUMBER), "newest_enqueued": nullable(NUMBER),
        "latency_seconds": nullable(NUMBER), "max_latency_seconds": nullable(NUMBER),
    })),
    "lag": obj({
        "newest_landed": nullable(NUMBER), "newest_aggregated": nullable(NUMBER), "seconds": nullable(NUMBER),
        "partitions_landed": INTEGER,
    }),
    "totals": counts(("events", "alerts", "batches", "duplicates", "unreadable_files", "dead_letters")),
    "unreadable_files": array(obj({"path": STRING, "error": STRING, "size": nullable(INTEGER), "found_at": NUMBER})),
    "dead_letters": array({
        "type": "object", "additionalProperties": True,
        "description": "an event set aside by a handler (written by the workers); its error text for staff only",
    }),
})  # fmt: skip

# The body's fields as ``registry.parse`` reads them: any value is taken as its text (a number as its
# digits; null and false as empty), the flags are on for true, "true", "on", "1" or 1. One variant per
# action of the registry, naming the arguments it needs (``Action.target``, ``Action.value``).
TEXT = f"read as text (any value is taken as its string form); at most {MAX_FIELD} characters"
FLAG = 'on for true, "true", "on", "1" or 1; anything else is off'
NAMED = {"maxLength": MAX_FIELD, "pattern": r"\S"}  # an argument an action needs: not blank
COMMON_FIELDS: dict[str, Schema] = {
    "reason": {"maxLength": MAX_FIELD, "description": f"why (kept in the audit log), {TEXT}"},
    "hub": nullable(PARAMETERS["hub"]["schema"]),  # null or empty: the configured one
    "consumer_group": nullable(PARAMETERS["consumer_group"]["schema"]),
    "force": {"description": f"reset a partition a worker owns: {FLAG}"},
    "confirm_last": {"description": f"drain the last live worker: {FLAG}"},
}
APPLY_FIELDS: dict[str, Schema] = {
    "reason": {**NAMED, "description": f"why (required: kept in the audit log), {TEXT}"},
    "confirmed": {"enum": [True, "true", "on", "1"], "description": "the action was previewed"},
}
EXAMPLE_ARGUMENT = {Kind.WORKER: "w1", Kind.PARTITION: "0", Kind.POSITION: "earliest"}


def _argument(argument: Argument, role: str) -> Schema:
    return {**NAMED, "description": f"{role}: {argument.help} ({argument.kind.value}), {TEXT}",
            "example": EXAMPLE_ARGUMENT[argument.kind]}  # fmt: skip


def action_body(apply: bool) -> Schema:
    """The body of a preview (or, with ``apply``, of an apply): one variant per action."""
    variants = []
    for name in NAMES:
        declared = REGISTRY[name]
        fields: dict[str, Schema] = {"action": {"type": "string", "enum": [name]}}
        if declared.target is not None:
            fields["target"] = _argument(declared.target, "the target")
        if declared.value is not None:
            fields["value"] = _argument(declared.value, "the value")
        fields.update(COMMON_FIELDS)
        if apply:
            fields.update(APPLY_FIELDS)
        required = [k for k in ("action", "target", "value", "reason", "confirmed") if k in fields]
        if not apply:
            required.remove("reason")
        variants.append({"type": "object", "title": name, "properties": fields, "required": required,
                         "additionalProperties": True})  # fmt: skip
    return {
        "description": "A worker or partition the fleet does not have is a 400 (code unknown_worker or "
        "unknown_partition); what the fleet's state forbids is a 409.",
        "oneOf": variants,
    }


PREVIEW = obj({
    "action": STRING, "target": STRING, "value": STRING, "summary": STRING,
    "moves": array(obj({
        "partition_id": STRING, "before": nullable(STRING), "after": nullable(STRING), "caused": BOOLEAN,
        "after_known": BOOLEAN,
    })),
    "notes": array(STRING), "needs_confirmation": BOOLEAN,
    "checkpoint": nullable({"type": "object", "additionalProperties": True}),
    "strategy": nullable(STRING), "strategy_source": nullable(STRING), "strategy_basis": nullable(STRING),
})  # fmt: skip

ERROR = obj({"error": {"type": "string", "description": "what is wrong, in one sentence"}})
LOGIN_REQUIRED = obj({"error": STRING, "login": {"type": "string", "description": "the login page's URL"}})
ACTION_ERROR = obj({"error": STRING, "code": {"type": "string", "description": "the rule that refused it"}})

SCHEMAS: dict[str, Schema] = {
    "State": STATE, "Partition": PARTITION, "Worker": WORKER, "LagRules": LAG_RULES, "Capacity": CAPACITY,
    "Summary": SUMMARY, "Event": EVENT, "AuditEntry": AUDIT_ENTRY, "LagSample": SAMPLE,
    "PartitionDetail": PARTITION_DETAIL, "History": HISTORY, "Pipeline": PIPELINE,
    "ActionRequest": action_body(apply=False), "ApplyRequest": action_body(apply=True), "Preview": PREVIEW,
    "Error": ERROR, "LoginRequired": LOGIN_REQUIRED,
    "ActionError": ACTION_ERROR,
}  # fmt: skip


# --- responses ------------------------------------------------------------------------------------


def json_body(schema: Schema, description: str) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


HTML = {"text/html": {"schema": STRING}}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before asking again", "schema": STRING}}

RESPONSES: dict[str, Schema] = {
    "BadRequest": json_body(
        ref("Error"), "A parameter is malformed, or there are more than Django parses (the message says which)."
    ),
    "LoginRequired": json_body(ref("LoginRequired"), "Anonymous reading is off (LEASEBOARD_ANONYMOUS_READ=false)."),
    "UnknownHub": json_body(ref("Error"), "No worker has run this hub and consumer group on this store."),
    "NotAllowed": {
        "description": "Another method than the one documented.",
        "headers": {"Allow": {"schema": STRING}},
        "content": HTML,
    },
    "Unavailable": {**json_body(ref("Error"), "The store or the database is down."), "headers": RETRY_AFTER},
}
