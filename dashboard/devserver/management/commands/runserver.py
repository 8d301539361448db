"""Daphne's ``runserver`` (ASGI: HTTP and websockets), imported only when it runs."""

from daphne.management.commands.runserver import Command as DaphneRunserver


class Command(DaphneRunserver):  # type: ignore[misc]  # daphne ships no type hints
    pass
