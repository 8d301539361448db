"""The OpenAPI 3 document of the console's HTTP API, served at ``/api/schema`` (``schema``).

Built in code from the same constants the views check against (event categories, limits, action
names, lag statuses), so a new category or action appears here by itself. Every status a view or
the middleware in front of it can answer is listed: 400 for a bad parameter, 401 for an anonymous
reader when ``LEASEBOARD_ANONYMOUS_READ`` is off (``access.ReadRule``), 403 for an action without a
staff session or a CSRF token (Django's CSRF page is HTML), 404 for a hub or consumer group the
store does not know, 405 for another method, 409 for an action the fleet forbids, 503 while the
store or the database is down (``degrade.py``).

The objects list the keys DESIGN.md fixes and the console's own as required; clients must accept
more (keys may only be added). ``tests/dashboard/test_schema_fuzz.py`` fuzzes a live console with
schemathesis against this document: no 500 and no response outside it.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from workers.alerts import ALERTS_KEPT

from .deadletter_schemas import PARAMETERS as DEAD_LETTER_PARAMETERS
from .eventbrowser_schemas import PARAMETERS as EVENT_BROWSER_PARAMETERS
from .methods import read_only
from .schema_parts import (
    HUB_PARAMETERS,
    PARAMETERS,
    PARTITION_PATTERN,
    STRING,
    TEXT_PARAMETER,
    Schema,
    array,
    query,
    ref,
    whole,
)
from .schemas import HTML, RESPONSES, RETRY_AFTER, SCHEMAS, json_body

P = "#/components/parameters/"


def responses(ok: Schema, *statuses: str) -> Schema:
    named = {
        "400": "BadRequest",
        "401": "LoginRequired",
        "404": "UnknownHub",
        "405": "NotAllowed",
        "503": "Unavailable",
    }
    found: Schema = {"200": ok}
    for status in statuses:
        found[status] = {"$ref": f"#/components/responses/{named[status]}"}
    return found


READ = ("400", "401", "404", "405", "503")


def get(summary: str, ok: Schema, parameters: list[Schema], *statuses: str) -> Schema:
    return {"get": {"summary": summary, "parameters": parameters, "responses": responses(ok, *statuses)}}


def action(summary: str, body: str, ok: Schema) -> Schema:
    refused = "The action cannot be done as asked: bad input, an unknown worker or partition, no confirmation."
    return {
        "post": {
            "summary": summary,
            "security": [{"session": [], "csrf_cookie": [], "csrf": []}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": ref(body)}}},
            "responses": {
                "200": ok,
                "400": {
                    "description": f"{refused} Django's HTML page: a body it will not read (over "
                    "DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MB, or, as a form, over DATA_UPLOAD_MAX_NUMBER_FIELDS, 1000).",
                    "content": {"application/json": {"schema": ref("ActionError")}, **HTML},
                },
                "401": {"$ref": "#/components/responses/LoginRequired"},
                "403": {
                    "description": "No staff session, or no valid CSRF token (code csrf); either is on the audit log.",
                    "content": {"application/json": {"schema": ref("ActionError")}},
                },
                "413": json_body(ref("ActionError"), "A JSON body over DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB)."),
                "405": {"$ref": "#/components/responses/NotAllowed"},
                "409": json_body(ref("ActionError"), "The fleet as it is now forbids it (already draining, ...)."),
                "503": {
                    **json_body({"oneOf": [ref("ActionError"), ref("Error")]}, "The store or the database is down."),
                    "headers": RETRY_AFTER,
                },
            },
        }
    }


OPERATION_IDS = {
    "/api/schema": "schema",
    "/api/state": "state",
    "/api/groups": "groups",
    "/api/events": "events",
    "/api/partitions/{partition_id}": "partition",
    "/api/partitions/{partition_id}/events": "partitionEvents",
    "/api/history": "history",
    "/api/audit": "audit",
    "/api/refusals": "refusals",
    "/api/pipeline": "pipeline",
    "/api/deadletters": "deadLetters",
    "/api/actions/preview": "previewAction",
    "/api/actions/apply": "applyAction",
    "/metrics": "metrics",
}


def document() -> Schema:
    """The OpenAPI document (a new dict each call)."""
    found: Schema = {
        "openapi": "3.0.3",
        "info": {
            "title": "Leaseboard console API",
            "version": "1",
            "description": (
                "The console's JSON API: the state of a hub and consumer group (and of every one at a glance), "
                "its balancer events, partitions, rebalances, audit log, pipeline and dead letters, and the admin "
                "actions (staff, CSRF). Reading is open to everyone unless LEASEBOARD_ANONYMOUS_READ is off (then a "
                "session is needed: 401). Objects may gain keys; none is renamed or removed."
            ),
        },
        "paths": {**_reads(), **_details(), **_event_browser(), **_dead_letters(), **_logs(), **_actions()},
        "components": _components(),
    }
    for path, operations in found["paths"].items():
        for operation in operations.values():
            operation["operationId"] = OPERATION_IDS[path]
    return found


def _reads() -> Schema:
    """The paths of this document, the state and the events."""
    hub_params = list(HUB_PARAMETERS)
    return {
        "/api/schema": get(
            "This document.", json_body({"type": "object"}, "The OpenAPI document."), [], "400", "401", "405"
        ),
        "/api/state": get(
            "The state of one hub and consumer group (DESIGN.md's /api/state).",
            {
                **json_body(ref("State"), "The state; while the store is down, the last known one (stale: true)."),
                "links": {
                    "partition": {
                        "operationId": "partition",
                        "description": "The state's first partition in detail.",
                        "parameters": {
                            "partition_id": "$response.body#/partitions/0/id",
                            "hub": "$response.body#/hub",
                            "consumer_group": "$response.body#/consumer_group",
                        },
                    }
                },
            },
            hub_params,
            *READ,
        ),
        "/api/groups": get(
            "Every hub and consumer group of the configured namespace the store knows (an ownership record or "
            "a heartbeat), at a glance: one read of the store, whatever their number.",
            json_body(ref("Groups"), "The groups, by hub then consumer group, each with its fleet page's URL."),
            [],
            "400",
            "401",
            "405",
            "503",
        ),
        "/api/events": get(
            "Balancer events in id order: the first `limit` after `after`, else the newest (before `before`).",
            json_body(array(ref("Event")), "The events."),
            [
                *hub_params,
                query("after", whole(0), "Events with a greater id, oldest first."),
                query("before", whole(1), "Events with a smaller id (ignored with after)."),
                {"$ref": P + "limit"},
                {"$ref": P + "kind"},
                {"$ref": P + "partition"},
                {"$ref": P + "worker"},
            ],
            *READ,
        ),
    }


PARTITION_ID: Schema = {
    "name": "partition_id",
    "in": "path",
    "required": True,
    "description": "A partition id: '0', '1', ...",
    "schema": {"type": "string", "pattern": PARTITION_PATTERN},
    "example": "0",
}


def _details() -> Schema:
    """The paths of one partition, the rebalances and the pipeline."""
    partition_id = PARTITION_ID
    hub_params = list(HUB_PARAMETERS)
    return {
        "/api/partitions/{partition_id}": {
            "get": {
                "summary": "One partition: state, ownership timeline, events, lag samples, checkpoints, audit.",
                "parameters": [partition_id, *hub_params],
                "responses": {
                    **responses(json_body(ref("PartitionDetail"), "The partition."), "400", "401", "405", "503"),
                    "404": {
                        "description": "An unknown hub or consumer group (JSON); a path that is no partition "
                        "URL at all, such as an empty id or one with a '/' (Django's HTML page).",
                        "content": {"application/json": {"schema": ref("Error")}, **HTML},
                    },
                },
            }
        },
        "/api/history": get(
            "Rebalances, newest first.",
            json_body(ref("History"), "The rebalance episodes."),
            [
                *hub_params,
                query(
                    "quiet",
                    {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": 3600},
                    "Seconds without an ownership event that end an episode (default: expiry + interval).",
                ),
            ],
            *READ,
        ),
        "/api/pipeline": get(
            "The Spark pipeline's results for a hub: chart, alerts, batches, lag, totals, bad input, live latency.",
            json_body(ref("Pipeline"), "The pipeline (dead letters' error texts for staff only)."),
            [
                {"$ref": P + "hub"},
                query(
                    "alerts", whole(1, ALERTS_KEPT), f"How many newest alerts to list (1 to {ALERTS_KEPT}, default 20)."
                ),
            ],
            "400",
            "401",
            "405",
            "503",
        ),
    }


def _event_browser() -> Schema:
    """The path of a partition's events (the event browser)."""
    summary = (
        "A partition's events as the hub holds them (embedded hub or Event Hubs), read without a lease or a "
        "checkpoint: a page of at most count events and about 4 MiB, at a position or before or after a cursor, "
        "newest first by default; bodies decoded as JSON, text or hex (staff only unless LEASEBOARD_EVENT_BODIES "
        "is readers)."
    )
    return {
        "/api/partitions/{partition_id}/events": {
            "get": {
                "summary": summary,
                "parameters": [PARTITION_ID, *HUB_PARAMETERS, *EVENT_BROWSER_PARAMETERS],
                "responses": {
                    **responses(
                        json_body(ref("HubEvents"), "A page of events; none past the end."),
                        "401",
                        "405",
                    ),
                    "400": json_body(
                        ref("Error"),
                        "A malformed parameter, a partition the hub does not have, or a position naming no event "
                        "(an offset where none starts, a sequence number past the end).",
                    ),
                    "404": {
                        "description": "An unknown hub or consumer group (JSON); a path that is no partition "
                        "URL at all (Django's HTML page).",
                        "content": {"application/json": {"schema": ref("Error")}, **HTML},
                    },
                    "503": {
                        **json_body(ref("Error"), "The hub cannot be read (or the store or the database is down)."),
                        "headers": RETRY_AFTER,
                    },
                },
            }
        }
    }


def _dead_letters() -> Schema:
    """The path of the dead letters."""
    return {
        "/api/deadletters": get(
            "Dead letters of a hub and consumer group (events a handler gave up on), partition by partition, "
            "oldest first, a page at a time (at most limit entries and about 4 MiB of files read); replay and "
            "purge them with the actions replay and purgedeadletters.",
            json_body(ref("DeadLetters"), "A page (bodies and error texts for staff only); none when there are none."),
            [*HUB_PARAMETERS, *DEAD_LETTER_PARAMETERS],
            "400",
            "401",
            "405",
        )
    }


def _logs() -> Schema:
    """The paths of the audit log and the refused attempts' counts."""
    hub_params = list(HUB_PARAMETERS)
    return {
        "/api/audit": get(
            "The audit log of admin actions, newest first.",
            json_body(array(ref("AuditEntry")), "The entries (user names for staff only)."),
            [
                *hub_params,
                {"$ref": P + "limit"},
                query("after", whole(0), "Entries with a greater id."),
                query("target", TEXT_PARAMETER, "Only the entries about this worker or partition."),
            ],
            *READ,
        ),
        "/api/refusals": get(
            "Attempts refused before an operator's action (wrong passwords, lockouts, actions without a "
            "staff login or CSRF token), counted per kind, address and account, most recent first.",
            json_body(ref("Refusals"), "The counts (addresses and accounts for staff only)."),
            [{"$ref": P + "limit"}],
            "400",
            "401",
            "405",
        ),
    }


def _actions() -> Schema:
    """The paths of the admin actions and ``/metrics``."""
    return {
        "/api/actions/preview": action(
            "The dry run of an admin action (staff session and CSRF token).",
            "ActionRequest",
            json_body(ref("Preview"), "What the action would do."),
        ),
        "/api/actions/apply": action(
            "Apply a previewed admin action (staff session, CSRF token, confirmed: true).",
            "ApplyRequest",
            json_body(ref("AuditEntry"), "The audit entry of the applied action."),
        ),
        "/metrics": {
            "get": {
                "summary": "Prometheus text format for the configured hub and consumer group (open to all).",
                "responses": {
                    "200": {
                        "description": "Every series of ours is named leaseboard_...",
                        "content": {"text/plain": {"schema": STRING}},
                    },
                    "400": {"$ref": "#/components/responses/BadRequest"},
                    "405": {"$ref": "#/components/responses/NotAllowed"},
                },
            }
        },
    }


def _components() -> Schema:
    return {
        "schemas": SCHEMAS,
        "parameters": PARAMETERS,
        "responses": RESPONSES,
        "securitySchemes": {
            "session": {
                "type": "apiKey",
                "in": "cookie",
                "name": "sessionid",
                "description": "A Django session (log in at /login/); staff for the actions.",
            },
            "csrf_cookie": {
                "type": "apiKey",
                "in": "cookie",
                "name": "csrftoken",
                "description": "Django's CSRF cookie (set by any page).",
            },
            "csrf": {
                "type": "apiKey",
                "in": "header",
                "name": "X-CSRFToken",
                "description": "The CSRF token: the csrftoken cookie's value, or the page's meta tag.",
            },
        },
    }


@read_only
def schema(request: HttpRequest) -> JsonResponse:
    """The OpenAPI document (read under the same rule as every ``/api/`` URL: ``access.ReadRule``)."""
    return JsonResponse(document())
