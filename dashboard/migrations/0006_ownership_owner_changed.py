"""``Ownership.owner_changed``: the change number of a row's latest write that was no renewal.

A worker that leaves other workers' renewals out of its reads (``balancer.changes``, ``stale_after``)
reads the rows whose owner changed since its cursor by this column, and every other row only once it
has not been written for most of an expiry. ``changed`` still takes a number at every write, so the
hand-edit triggers of migration 0005 tell a write through the store from an edit as before.

SQLite adds the column by rebuilding the table, which drops its triggers: they are made again after
(and, going back, after the column is removed again). PostgreSQL adds it in place.
"""

import importlib

from django.db import migrations, models

_0005 = importlib.import_module("dashboard.migrations.0005_ownership_changes")


def sqlite_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return
    for name in ("deleted", "inserted_by_hand", "updated_by_hand"):
        schema_editor.execute(f"DROP TRIGGER IF EXISTS dashboard_ownership_{name}")
    for statement in _0005._SQLITE:
        schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0005_ownership_changes"),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, sqlite_triggers),  # going back: after the rebuild
        migrations.AddField(
            model_name="ownership",
            name="owner_changed",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.RunPython(sqlite_triggers, migrations.RunPython.noop),
    ]
