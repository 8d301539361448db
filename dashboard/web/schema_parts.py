"""The building blocks of the console's OpenAPI document (``schemas.py``, ``openapi.py``): the JSON
Schema shorthands, the query parameters and the patterns they check, from the same constants the
views check against.
"""

from __future__ import annotations

from typing import Any

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
# A free text parameter: anything but NUL, which PostgreSQL refuses in any string (methods.py: 400).
TEXT_PARAMETER: Schema = {"type": "string", "pattern": "^[^\\x00]*$"}
_CATEGORY = "|".join(CATEGORIES)
KIND_PATTERN = rf"^({_CATEGORY})?(,({_CATEGORY})?)*$"


def query(name: str, schema: Schema, description: str, example: Any = None) -> Schema:
    found: Schema = {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "allowEmptyValue": True,
        "description": f"{description} Empty is the same as missing.",
    }
    if example is not None:
        found["example"] = example
    return found


def whole(low: int, high: int = ID_MAX) -> Schema:
    return {"type": "integer", "minimum": low, "maximum": high}


PARAMETERS: dict[str, Schema] = {
    "hub": query(
        "hub",
        {"type": "string", "maxLength": 255, "pattern": HUB_PATTERN},
        "The event hub: letters, digits, '.', '-', '_', starting with a letter or digit, at most 255 "
        "characters. Missing: the configured hub.",
        "sensors",
    ),
    "consumer_group": query(
        "consumer_group",
        {"type": "string", "maxLength": 255, "pattern": CONSUMER_GROUP_PATTERN},
        "The consumer group: like a hub name, optionally after one leading '$'. Missing: the configured "
        "consumer group.",
        "$Default",
    ),
    "limit": query("limit", whole(1, EVENTS_MAX), f"How many to return (1 to {EVENTS_MAX})."),
    "kind": query(
        "kind",
        {"type": "string", "pattern": KIND_PATTERN},
        f"Comma-separated event categories, among: {', '.join(CATEGORIES)}.",
        "claim,steal",
    ),
    "partition": query("partition", TEXT_PARAMETER, "Only the events of this partition id."),
    "worker": query(
        "worker", TEXT_PARAMETER, "Only the events that name this worker (owner, previous owner or reporter)."
    ),
}

HUB_PARAMETERS = [{"$ref": "#/components/parameters/hub"}, {"$ref": "#/components/parameters/consumer_group"}]
