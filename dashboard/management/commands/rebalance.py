"""``manage.py rebalance``: Asks every worker to run a load-balancing cycle now.

Thin: the work is ``dashboard.actions`` (see ``dashboard.actioncommand``).
"""

from __future__ import annotations

from dashboard.actioncommand import ActionCommand


class Command(ActionCommand):
    help = "Asks every worker to run a load-balancing cycle now."
    help += " Shows what moves first; recorded in the audit log."
    action = "rebalance"
    target_help = ""
    value_help = ""
