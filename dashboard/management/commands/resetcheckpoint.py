"""``manage.py resetcheckpoint PARTITION --to earliest|latest|SEQ|TIME [--force]``. (See ``dashboard.actioncommand``.)

``earliest``: before the first retained event (the checkpoint is removed when that is event 0);
``latest``: after the newest event (skip what is there); ``SEQ``: the checkpoint becomes that
sequence number (processing resumes at the next one); ``TIME`` (ISO 8601, UTC without a zone):
processing resumes at the first event enqueued at or after it. Refused while a worker owns the
partition, unless ``--force``.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from dashboard import actions
from dashboard.actioncommand import ActionCommand


class Command(ActionCommand):
    help = "Resets a partition's checkpoint. Shows the change first; recorded in the audit log."
    action = "resetcheckpoint"
    target_help = "PARTITION: the partition id"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--to", required=True, help="earliest, latest, a sequence number, or an ISO 8601 time")
        parser.add_argument("--force", action="store_true", help="reset even while a worker owns the partition")

    def request(self, options: dict[str, Any]) -> actions.Request:
        return actions.Request(self.action, options["target"], options["to"], options["reason"], options["force"])
