"""``manage.py pin``: Pins a partition to a worker: only that worker may own it.

Thin: the work is ``dashboard.actions`` (see ``dashboard.actioncommand``).
"""

from __future__ import annotations

from dashboard.actioncommand import ActionCommand


class Command(ActionCommand):
    help = "Pins a partition to a worker: only that worker may own it."
    help += " Shows what moves first; recorded in the audit log."
    action = "pin"
    target_help = "PARTITION: the partition id"
    value_help = "WORKER: the only worker allowed to own it"
