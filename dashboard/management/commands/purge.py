"""``manage.py purge``: Forgets a dead worker (its heartbeat and drain record).

Thin: the work is ``dashboard.actions`` (see ``dashboard.actioncommand``).
"""

from __future__ import annotations

from dashboard.actioncommand import ActionCommand


class Command(ActionCommand):
    help = "Forgets a dead worker (its heartbeat and drain record)."
    help += " Shows what moves first; recorded in the audit log."
    action = "purge"
    target_help = "WORKER: the worker's owner id"
    value_help = ""
