"""``manage.py undrain``: Ends a drain: the worker claims partitions again.

Thin: the work is ``dashboard.actions`` (see ``dashboard.actioncommand``).
"""

from __future__ import annotations

from dashboard.actioncommand import ActionCommand


class Command(ActionCommand):
    help = "Ends a drain: the worker claims partitions again."
    help += " Shows what moves first; recorded in the audit log."
    action = "undrain"
    target_help = "WORKER: the worker's owner id"
    value_help = ""
