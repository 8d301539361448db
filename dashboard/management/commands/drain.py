"""``manage.py drain``: Drains a worker: it hands its partitions off and claims no more.

Thin: the work is ``dashboard.actions`` (see ``dashboard.actioncommand``).
"""

from __future__ import annotations

from dashboard.actioncommand import ActionCommand


class Command(ActionCommand):
    help = "Drains a worker: it hands its partitions off and claims no more."
    help += " Shows what moves first; recorded in the audit log."
    action = "drain"
    target_help = "WORKER: the worker's owner id"
    value_help = ""
