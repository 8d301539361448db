"""``manage.py unpin``: Removes a partition's pin.

Thin: the work is ``dashboard.actions`` (see ``dashboard.actioncommand``).
"""

from __future__ import annotations

from dashboard.actioncommand import ActionCommand


class Command(ActionCommand):
    help = "Removes a partition's pin."
    help += " Shows what moves first; recorded in the audit log."
    action = "unpin"
    target_help = "PARTITION: the partition id"
    value_help = ""
