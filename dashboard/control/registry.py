"""The admin actions, each declared once. Everything else iterates over ``REGISTRY``.

The views (``/api/actions/preview`` and ``/apply``) parse a request against it; each management
command is ``command.command_for(name)``; the page's dialog reads ``catalogue()``; the audit and
the ``leaseboard_admin_actions`` series are labelled by its names.

To add an action: declare it (its arguments, dry run and write: see ``action.Action`` and
``records.py``), add it to ``REGISTRY`` below, and add the one-line command file
``dashboard/management/commands/<name>.py`` (Django finds commands by file). A button with
``data-action="<name>"`` (and ``data-target``) on a page opens the dialog for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .action import Action
from .deadletters import PURGEDEADLETTERS, REPLAY
from .inplace import REPLAYINPLACE
from .records import DRAIN, PIN, PURGE, REBALANCE, UNDRAIN, UNPIN
from .request import Refused, Request, storable
from .resets import RESETCHECKPOINT

REGISTRY: dict[str, Action] = {
    a.name: a
    for a in (DRAIN, UNDRAIN, PIN, UNPIN, REBALANCE, RESETCHECKPOINT, PURGE, REPLAY, REPLAYINPLACE, PURGEDEADLETTERS)
}
NAMES: tuple[str, ...] = tuple(REGISTRY)
MAX_FIELD = 1000  # characters of a reason
MAX_NAME = 255  # characters of a target or value (a worker id, a partition id: their columns' length)
LIMITS = {"target": MAX_NAME, "value": MAX_NAME, "reason": MAX_FIELD}


def get(name: str) -> Action:
    """The action called ``name``; Refused ("bad_request") naming the choices otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise Refused("bad_request", f"unknown action {name!r}; choose one of: {', '.join(NAMES)}") from None


def parse(data: Mapping[str, Any]) -> Request:
    """A request from a JSON body or form; Refused("bad_request") when it is malformed.

    Only the shape is checked here; whether the worker or partition exists is ``Action.check``'s,
    against the fleet as read.
    """
    name = str(data.get("action") or "")
    if not storable(name):
        raise Refused("bad_request", "action must not hold NUL or unpaired surrogate characters")
    action = get(name)
    fields = {k: str(data.get(k) or "").strip() for k in LIMITS}
    for key, text in fields.items():
        if len(text) > LIMITS[key]:
            raise Refused("bad_request", f"{key} is at most {LIMITS[key]} characters, got {len(text)}")
        if not storable(text):
            raise Refused("bad_request", f"{key} must not hold NUL or unpaired surrogate characters")

    def flag(name: str) -> bool:
        return data.get(name) in (True, "true", "on", "1", 1)

    target = fields["target"] if action.target is not None else action.fixed_target
    value = fields["value"] if action.value is not None else ""
    return Request(action.name, target, value, fields["reason"], flag("force"), flag("confirm_last"))


def catalogue() -> list[dict[str, Any]]:
    """Every action as the page's dialog needs it (JSON)."""
    return [a.catalogue() for a in REGISTRY.values()]
