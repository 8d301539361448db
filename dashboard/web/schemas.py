"""The parts of the console's OpenAPI document (``openapi.py``): the query parameters, the objects
the API answers with and takes, and the shared responses, built from the same constants the views
check against.
"""

from __future__ import annotations

from ..live.console import Lease
from ..live.lag import STATUSES
from .action_schemas import PREVIEW, action_body
from .deadletter_schemas import SCHEMAS as DEAD_LETTER_SCHEMAS
from .eventbrowser_schemas import SCHEMAS as EVENT_BROWSER_SCHEMAS
from .group_schemas import SCHEMAS as GROUP_SCHEMAS
from .schema_parts import (
    BOOLEAN,
    INTEGER,
    NUMBER,
    STRING,
    Schema,
    array,
    counts,
    nullable,
    obj,
    ref,
)

# --- objects --------------------------------------------------------------------------------------

LAG_STATUSES = [s.value for s in STATUSES]
LEASES = [lease.value for lease in Lease]

PARTITION = obj(
    {
        "id": STRING,
        "owner": nullable(STRING),
        "status": {"type": "string", "enum": LEASES},
        "last_modified": nullable(NUMBER),
        "sequence_number": nullable(INTEGER),
        "last_enqueued_sequence_number": nullable(INTEGER),
        "last_enqueued_time": nullable(NUMBER),
        "checkpoint_modified": nullable(NUMBER),
        "lag": nullable(INTEGER),
        "pinned_to": nullable(STRING),
        "lag_seconds": nullable(NUMBER),
        "lag_status": nullable({"type": "string", "enum": LAG_STATUSES}),
        "events_per_second": nullable(NUMBER),
    }
)

WORKER = obj(
    {
        "id": STRING,
        "owned": INTEGER,
        "draining": BOOLEAN,
        "last_seen": nullable(NUMBER),
        "alive": BOOLEAN,
        "events_per_second": nullable(NUMBER),
        "purgeable": BOOLEAN,
        "avoiding": {
            "type": "array",
            "items": STRING,
            "description": "partitions this worker gave up because they were stuck on it (its reader kept "
            "failing) and takes no more for now; '*': it cannot read the hub at all and takes none",
        },
    }
)

LAG_RULES = obj({"window": INTEGER, "sample_seconds": NUMBER, "stop_seconds": NUMBER})

CAPACITY = obj(
    {
        "desired_workers": INTEGER,
        "keda_desired_workers": nullable(INTEGER),
        "keda_threshold": INTEGER,
        "partitions": INTEGER,
        "target_catchup_seconds": NUMBER,
        "backlog": nullable(INTEGER),
        "workers": INTEGER,
        "enqueue_rate": nullable(NUMBER),
        "processing_rate": nullable(NUMBER),
        "per_worker_rate": nullable(NUMBER),
        "measured_capacity": BOOLEAN,
        "span_seconds": nullable(NUMBER),
        "reason": nullable(STRING),
    }
)

SUMMARY = obj(
    {
        "partitions": INTEGER,
        "owned": INTEGER,
        "by_status": counts(tuple(LEASES)),
        "by_lag_status": counts(tuple(LAG_STATUSES)),
        "lag": nullable(INTEGER),
        "workers": INTEGER,
        "workers_alive": INTEGER,
        "workers_draining": INTEGER,
        "capacity": nullable(ref("Capacity")),
    }
)

STATE = obj(
    {
        "namespace": STRING,
        "hub": STRING,
        "consumer_group": STRING,
        "generated_at": NUMBER,
        "expiry": NUMBER,
        "last_event_id": INTEGER,
        "source": obj({"name": STRING, "available": BOOLEAN, "error": nullable(STRING)}),
        "partitions": array(ref("Partition")),
        "workers": array(ref("Worker")),
        "sampled_at": nullable(NUMBER),
        "lag_rules": nullable(ref("LagRules")),
        "version": nullable(INTEGER),
        "summary": ref("Summary"),
        "stale": {"type": "boolean", "description": "true: the store cannot be read; this is the last known state"},
        "error": {"type": "string", "description": "why the state is stale (only when it is)"},
    },
    optional=("error",),
)

EVENT = obj(
    {
        "id": INTEGER,
        "kind": STRING,
        "category": STRING,
        "namespace": STRING,
        "hub": STRING,
        "consumer_group": STRING,
        "partition_id": {"type": "string", "description": "a partition id; '*' for a worker's drain or undrain"},
        "owner_id": nullable(STRING),
        "previous_owner": nullable(STRING),
        "reporter": STRING,
        "reason": STRING,
        "at": NUMBER,
        "handoff": BOOLEAN,
    }
)

AUDIT_ENTRY = obj(
    {
        "id": INTEGER,
        "at": NUMBER,
        "user": {"type": "string", "description": "the user name for staff; '(staff only)' for other readers"},
        "action": STRING,
        "target": STRING,
        "value": STRING,
        "reason": STRING,
        "outcome": {"type": "string", "enum": ["applied", "refused", "failed"]},
        "message": STRING,
        "moves": INTEGER,
    }
)

REFUSAL_KINDS = ["login", "lockout", "action", "csrf"]
REFUSALS = obj(
    {
        "totals": obj({kind: INTEGER for kind in REFUSAL_KINDS}),
        "counts": array(
            obj(
                {
                    "kind": {"type": "string", "enum": REFUSAL_KINDS},
                    "source": {**nullable(STRING), "description": "the client's address (staff only: null)"},
                    "user": {**nullable(STRING), "description": "the existing account tried, or '' (staff only)"},
                    "count": INTEGER,
                    "first_at": NUMBER,
                    "last_at": NUMBER,
                }
            )
        ),
        "kept": {**INTEGER, "description": "counts kept (at most 1,000: the least recent go first)"},
    }
)

SAMPLE = obj(
    {
        "at": NUMBER,
        "owner": nullable(STRING),
        "sequence_number": nullable(INTEGER),
        "checkpoint_modified": nullable(NUMBER),
        "last_enqueued_sequence_number": nullable(INTEGER),
        "lag": nullable(INTEGER),
        "lag_seconds": nullable(NUMBER),
        "status": nullable(STRING),
    }
)

PARTITION_DETAIL = obj(
    {
        "partition": nullable(ref("Partition")),
        "error": nullable({"type": "string", "description": "why the current state could not be read"}),
        "generated_at": nullable(NUMBER),
        "last_event_id": nullable(INTEGER),
        "lag_rules": ref("LagRules"),
        "timeline": array(
            obj(
                {
                    "owner": STRING,
                    "since": NUMBER,
                    "came": STRING,
                    "came_reason": STRING,
                    "from": nullable(STRING),
                    "until": nullable(NUMBER),
                    "ended": nullable(STRING),
                    "ended_reason": nullable(STRING),
                    "event_id": nullable(INTEGER),
                }
            )
        ),
        "events": array(ref("Event")),
        "samples": array(ref("LagSample")),
        "checkpoints": array(
            obj(
                {
                    "sequence_number": INTEGER,
                    "at": NUMBER,
                    "owner": nullable(STRING),
                    "moved": nullable(INTEGER),
                }
            )
        ),
        "audit": array(ref("AuditEntry")),
    }
)

HISTORY = obj(
    {
        "episodes": array(
            obj(
                {
                    "started": NUMBER,
                    "ended": NUMBER,
                    "seconds": NUMBER,
                    "first_id": INTEGER,
                    "last_id": INTEGER,
                    "trigger": STRING,
                    "moves": INTEGER,
                    "claims": INTEGER,
                    "events": INTEGER,
                    "kinds": counts(),
                    "partitions": INTEGER,
                    "workers": array(STRING),
                    "balanced": nullable(BOOLEAN),
                    "counts": counts(),
                }
            )
        ),
        "quiet": NUMBER,
        "partitions": nullable(INTEGER),
        "events": INTEGER,
        "truncated": BOOLEAN,
    }
)

PIPELINE = obj(
    {
        "hub": STRING,
        "generated_at": NUMBER,
        "chart": obj(
            {
                "sensors": array(STRING),
                "series": array(obj({"minute": NUMBER, "events": counts(), "alerts": INTEGER})),
            }
        ),
        "alerts": array(
            obj(
                {
                    "partition_id": STRING,
                    "sequence_number": INTEGER,
                    "home": STRING,
                    "kind": STRING,
                    "sensor": STRING,
                    "sensor_id": STRING,
                    "event": STRING,
                    "event_time": NUMBER,
                    "enqueued_time": NUMBER,
                    "raised_at": NUMBER,
                    "raised_by": {"type": "string", "enum": ["landing", "pipeline"]},
                    "latency_seconds": NUMBER,
                }
            )
        ),
        "batches": array(
            obj(
                {
                    "batch_id": INTEGER,
                    "finished_at": NUMBER,
                    "events": INTEGER,
                    "input_rows": nullable(INTEGER),
                    "duplicates": nullable(INTEGER),
                    "alerts": INTEGER,
                    "unreadable_files": INTEGER,
                    "write_seconds": NUMBER,
                    "duration_seconds": nullable(NUMBER),
                    "newest_enqueued": nullable(NUMBER),
                    "latency_seconds": nullable(NUMBER),
                    "max_latency_seconds": nullable(NUMBER),
                }
            )
        ),
        "lag": obj(
            {
                "newest_landed": nullable(NUMBER),
                "newest_aggregated": nullable(NUMBER),
                "seconds": nullable(NUMBER),
                "partitions_landed": INTEGER,
            }
        ),
        "totals": counts(("events", "alerts", "batches", "duplicates", "unreadable_files", "dead_letters")),
        "unreadable_files": array(
            obj({"path": STRING, "error": STRING, "size": nullable(INTEGER), "found_at": NUMBER})
        ),
        "dead_letters": array(
            {
                "type": "object",
                "additionalProperties": True,
                "description": (
                    "an event set aside by a handler (written by the workers); its error text for staff only"
                ),
            }
        ),
        "latency": ref("PipelineLatency"),
    }
)

LATENCY_FIGURES = {"p50": nullable(NUMBER), "p95": nullable(NUMBER)}
PIPELINE_LATENCY = obj(
    {
        "window_seconds": INTEGER,
        "alerts": obj({"count": INTEGER, **LATENCY_FIGURES}),
        "aggregates": obj({"events": INTEGER, **LATENCY_FIGURES, "estimated": BOOLEAN}),
    }
)
PIPELINE_LATENCY["description"] = (
    "Seconds from enqueued to committed over the last window_seconds: of each alert raised (exact), and "
    "of each event aggregated (estimated from the batches finished, their events taken as spread evenly "
    "between their oldest and newest enqueued times); p50 and p95 null when there is nothing to measure."
)

ERROR = obj({"error": {"type": "string", "description": "what is wrong, in one sentence"}})
LOGIN_REQUIRED = obj({"error": STRING, "login": {"type": "string", "description": "the login page's URL"}})
ACTION_ERROR = obj({"error": STRING, "code": {"type": "string", "description": "the rule that refused it"}})

SCHEMAS: dict[str, Schema] = {
    "State": STATE,
    "Partition": PARTITION,
    "Worker": WORKER,
    "LagRules": LAG_RULES,
    "Capacity": CAPACITY,
    "Summary": SUMMARY,
    "Event": EVENT,
    "AuditEntry": AUDIT_ENTRY,
    "Refusals": REFUSALS,
    "LagSample": SAMPLE,
    "PartitionDetail": PARTITION_DETAIL,
    "History": HISTORY,
    "Pipeline": PIPELINE,
    "PipelineLatency": PIPELINE_LATENCY,
    "ActionRequest": action_body(apply=False),
    "ApplyRequest": action_body(apply=True),
    "Preview": PREVIEW,
    "Error": ERROR,
    "LoginRequired": LOGIN_REQUIRED,
    "ActionError": ACTION_ERROR,
    **GROUP_SCHEMAS,
    **DEAD_LETTER_SCHEMAS,
    **EVENT_BROWSER_SCHEMAS,
}


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
