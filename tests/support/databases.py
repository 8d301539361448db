"""Django database aliases made at run time: a test (or the processes it starts) reads a database
that ``settings.DATABASES`` did not name when Django started, a throwaway PostgreSQL or the SQLite
file of a process under test."""

from __future__ import annotations


def add_django_database(alias: str, url: str, **options: object) -> None:
    """Make ``alias`` a database of ``django.db.connections`` for the rest of the process, as if
    ``settings.DATABASES`` had named it from the start (Django's defaults are filled in)."""
    import dj_database_url
    from django.conf import settings
    from django.db import connections

    config = dj_database_url.parse(url, conn_max_age=0)
    config["OPTIONS"] = {**config.get("OPTIONS", {}), **options}
    # Independent of "default": its test database can be created when "default"'s is not needed.
    config["TEST"] = {"DEPENDENCIES": []}
    settings.DATABASES[alias] = config
    # connections.settings is settings.DATABASES itself (its defaults are filled in place), unless
    # a test replaced it; configure_settings() only adds what is missing.
    if connections.settings is not settings.DATABASES:
        connections.settings[alias] = config
    connections.configure_settings(connections.settings)


def remove_django_database(alias: str) -> None:
    """Undo ``add_django_database``: close this thread's connection and forget the alias."""
    from django.conf import settings
    from django.db import connections

    if alias in connections:
        connections[alias].close()
        del connections[alias]
    connections.settings.pop(alias, None)
    settings.DATABASES.pop(alias, None)
