"""``MemberRow.changed`` and ``ControlRow.changed``: the change number of a member or control row's
latest write through the store, so a worker's steady read lists only the members and controls
written since its cursor (``balancer.changes``).

Numbered as ``Ownership.changed`` (migration 0005): the hub's counter on SQLite, the writing
transaction's id on PostgreSQL. A row added or removed, through the store or by hand, changes the
hub's count of such rows or the sum of their ids, which the read compares with its cursor's (all
of that table's rows are listed again then). What neither catches is an UPDATE by hand (the Django admin, psql): a
trigger gives the hub's clock a new ``epoch`` for it, as migration 0005's do for ownership rows, so
every cursor of the old epoch reads everything again. A store write always sets a ``changed`` other
than the row's; only a write by hand keeps it.
"""

from django.db import migrations, models

_SCOPE = "namespace = NEW.namespace AND hub = NEW.hub AND consumer_group = NEW.consumer_group"

_TABLES = ("dashboard_memberrow", "dashboard_controlrow")

_SQLITE = [
    f"""CREATE TRIGGER {table}_updated_by_hand AFTER UPDATE ON {table}
WHEN NEW.changed = OLD.changed
BEGIN
  UPDATE dashboard_ownershipclock SET epoch = lower(hex(randomblob(8))) WHERE {_SCOPE};
END"""
    for table in _TABLES
]

_POSTGRES = [
    f"""CREATE FUNCTION dashboard_small_new_epoch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE dashboard_ownershipclock SET epoch = md5(random()::text || clock_timestamp()::text) WHERE {_SCOPE};
  RETURN NULL;
END $$""",
    *(
        f"""CREATE TRIGGER {table}_updated_by_hand AFTER UPDATE ON {table}
FOR EACH ROW WHEN (NEW.changed = OLD.changed) EXECUTE FUNCTION dashboard_small_new_epoch()"""
        for table in _TABLES
    ),
]


def create_triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for statement in {"sqlite": _SQLITE, "postgresql": _POSTGRES}.get(vendor, []):
        schema_editor.execute(statement)


def drop_triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for table in _TABLES:
        if vendor == "sqlite":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_updated_by_hand")
        elif vendor == "postgresql":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_updated_by_hand ON {table}")
    if vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS dashboard_small_new_epoch()")


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0007_refusals"),
    ]

    operations = [
        migrations.AddField(
            model_name="memberrow",
            name="changed",
            field=models.BigIntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.AddField(
            model_name="controlrow",
            name="changed",
            field=models.BigIntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.RunPython(create_triggers, drop_triggers),
    ]
