"""What changed between two states, field by field: what the websocket sends after the first snapshot.

Both sides are ``ConsoleState.as_json()`` objects (the page holds JSON, so the diff is of JSON).

With 1024 partitions a full snapshot is about 250 kB; a second of a busy hub changes a checkpoint,
a lag and a rate on most of them, which is a few fields each. A delta lists, per partition and per
worker, only the fields that changed (always with the ``id``), the ids that went away, and the
scalar top-level fields. ``apply`` is the inverse the page runs; it is here so tests prove it.
"""

from __future__ import annotations

import copy
from typing import Any

from .console import Json

SCALARS = (
    "generated_at",
    "last_event_id",
    "expiry",
    "source",
    "version",
    "sampled_at",
    "lag_rules",
    "summary",
    "error",
)


def _changes(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    before = {item["id"]: item for item in old}
    changed = []
    for item in new:
        was = before.get(item["id"])
        if was is None:
            changed.append(item)
            continue
        fields = {k: v for k, v in item.items() if was.get(k, object()) != v}
        if fields:
            changed.append({"id": item["id"], **fields})
    gone = set(before) - {item["id"] for item in new}
    return changed, sorted(gone)


def delta(old: Json, new: Json) -> Json:
    """The ``{"type": "delta", ...}`` message that turns ``old`` into ``new``.

    ``order`` (the full id order of partitions) is included only when partitions were added or
    removed, so the page can lay its grid out again.
    """
    partitions, gone_partitions = _changes(old["partitions"], new["partitions"])
    workers, gone_workers = _changes(old["workers"], new["workers"])
    message: dict[str, Any] = {"type": "delta", "partitions": partitions, "workers": workers}
    message.update({k: new[k] for k in SCALARS if k in new})
    if gone_partitions:
        message["removed_partitions"] = gone_partitions
    if gone_workers:
        message["removed_workers"] = gone_workers
    old_ids = [p["id"] for p in old["partitions"]]
    new_ids = [p["id"] for p in new["partitions"]]
    if old_ids != new_ids:
        message["order"] = new_ids
    new_worker_ids = [w["id"] for w in new["workers"]]
    if [w["id"] for w in old["workers"]] != new_worker_ids:
        message["worker_order"] = new_worker_ids
    return message


Items = list[dict[str, Any]]


def _merge(items: Items, changes: Items, gone: list[str], order: list[str] | None) -> Items:
    by_id = {item["id"]: dict(item) for item in items}
    for change in changes:
        by_id.setdefault(change["id"], {}).update(change)
    for item_id in gone:
        by_id.pop(item_id, None)
    ids = (
        order
        if order is not None
        else [i["id"] for i in items if i["id"] in by_id]
        + [c["id"] for c in changes if c["id"] not in {i["id"] for i in items}]
    )
    return [by_id[i] for i in ids if i in by_id]


def apply(state: Json, message: Json) -> Json:
    """``state`` with the delta ``message`` applied (a new object; ``state`` is not changed)."""
    out = copy.copy(state)
    out.update({k: message[k] for k in SCALARS if k in message})
    out["partitions"] = _merge(
        state["partitions"], message["partitions"], message.get("removed_partitions", []), message.get("order")
    )
    out["workers"] = _merge(
        state["workers"], message["workers"], message.get("removed_workers", []), message.get("worker_order")
    )
    return out
