"""The bodies of the console's action requests and previews in its OpenAPI document
(``schemas.py``), one variant per action of the registry.
"""

from __future__ import annotations

from ..control.action import Argument, Kind
from ..control.registry import MAX_FIELD, MAX_NAME, NAMES, REGISTRY
from .schema_parts import (
    BOOLEAN,
    PARAMETERS,
    STRING,
    Schema,
    array,
    nullable,
    obj,
)

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
    "force": {"description": f"reset a partition a worker owns, or replay a dead letter again: {FLAG}"},
    "confirm_last": {"description": f"drain the last live worker: {FLAG}"},
}
APPLY_FIELDS: dict[str, Schema] = {
    "reason": {**NAMED, "description": f"why (required: kept in the audit log), {TEXT}"},
    "confirmed": {"enum": [True, "true", "on", "1"], "description": "the action was previewed"},
}
EXAMPLE_ARGUMENT = {Kind.WORKER: "w1", Kind.PARTITION: "0", Kind.POSITION: "earliest", Kind.SELECTION: "all"}


def _argument(argument: Argument, role: str) -> Schema:
    return {
        **NAMED,
        "maxLength": MAX_NAME,
        "description": f"{role}: {argument.help} ({argument.kind.value}), read as text; at most {MAX_NAME} characters",
        "example": EXAMPLE_ARGUMENT[argument.kind],
    }


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
        variants.append(
            {"type": "object", "title": name, "properties": fields, "required": required, "additionalProperties": True}
        )
    return {
        "description": "A worker or partition the fleet does not have is a 400 (code unknown_worker or "
        "unknown_partition); what the fleet's state forbids is a 409.",
        "oneOf": variants,
    }


PREVIEW = obj(
    {
        "action": STRING,
        "target": STRING,
        "value": STRING,
        "summary": STRING,
        "moves": array(
            obj(
                {
                    "partition_id": STRING,
                    "before": nullable(STRING),
                    "after": nullable(STRING),
                    "caused": BOOLEAN,
                    "after_known": BOOLEAN,
                }
            )
        ),
        "notes": array(STRING),
        "needs_confirmation": BOOLEAN,
        "checkpoint": nullable({"type": "object", "additionalProperties": True}),
        "strategy": nullable(STRING),
        "strategy_source": nullable(STRING),
        "strategy_basis": nullable(STRING),
    }
)
