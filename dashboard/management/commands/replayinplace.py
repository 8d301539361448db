"""``manage.py replayinplace``, built from its declaration in ``dashboard.control.registry`` (see ``--help``)."""

from dashboard.control.command import command_for

Command = command_for("replayinplace")
