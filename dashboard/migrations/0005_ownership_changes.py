"""Change numbers for the ownership rows, so a worker reads only what changed (``balancer.changes``).

``Ownership.changed`` is the change number of the row's latest write through the store: the hub's
counter in ``OwnershipClock`` on SQLite, the writing transaction's id on PostgreSQL (see
``dashboard.sql``). Triggers catch what does not go through the
store (an operator's DELETE, UPDATE, INSERT or TRUNCATE in psql or the SQLite shell, the Django
admin's delete): each gives the hub's clock a new ``epoch``, so every worker's cursor of the old
epoch reads everything again. A store write always sets a ``changed`` other than the row's (two
writes of one row in one transaction aside: a needless full read), so only a write by hand keeps it
(UPDATE) or leaves the default 0 (INSERT). A later migration that
makes SQLite rebuild ``dashboard_ownership`` drops its triggers: it must create them again.
"""

from django.db import migrations, models

_SCOPE = "namespace = {row}.namespace AND hub = {row}.hub AND consumer_group = {row}.consumer_group"

_SQLITE_EPOCH = "lower(hex(randomblob(8)))"
_SQLITE = [
    f"""CREATE TRIGGER dashboard_ownership_{name} AFTER {event} ON dashboard_ownership {when}
BEGIN
  UPDATE dashboard_ownershipclock SET epoch = {_SQLITE_EPOCH} WHERE {_SCOPE.format(row=row)};
END"""
    for name, event, when, row in (
        ("deleted", "DELETE", "", "OLD"),
        ("inserted_by_hand", "INSERT", "WHEN NEW.changed = 0", "NEW"),
        ("updated_by_hand", "UPDATE", "WHEN NEW.changed = OLD.changed", "NEW"),
    )
]

_POSTGRES = [
    f"""CREATE FUNCTION dashboard_ownership_new_epoch() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  target dashboard_ownership;
BEGIN
  IF TG_OP = 'DELETE' THEN target := OLD; ELSE target := NEW; END IF;
  UPDATE dashboard_ownershipclock SET epoch = md5(random()::text || clock_timestamp()::text)
  WHERE {_SCOPE.format(row="target")};
  RETURN NULL;
END $$""",
    """CREATE TRIGGER dashboard_ownership_deleted AFTER DELETE ON dashboard_ownership
FOR EACH ROW EXECUTE FUNCTION dashboard_ownership_new_epoch()""",
    """CREATE TRIGGER dashboard_ownership_inserted_by_hand AFTER INSERT ON dashboard_ownership
FOR EACH ROW WHEN (NEW.changed = 0) EXECUTE FUNCTION dashboard_ownership_new_epoch()""",
    """CREATE TRIGGER dashboard_ownership_updated_by_hand AFTER UPDATE ON dashboard_ownership
FOR EACH ROW WHEN (NEW.changed = OLD.changed) EXECUTE FUNCTION dashboard_ownership_new_epoch()""",
    # TRUNCATE fires no row trigger: every hub's epoch changes.
    """CREATE FUNCTION dashboard_ownership_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE dashboard_ownershipclock SET epoch = md5(random()::text || clock_timestamp()::text);
  RETURN NULL;
END $$""",
    """CREATE TRIGGER dashboard_ownership_truncated AFTER TRUNCATE ON dashboard_ownership
FOR EACH STATEMENT EXECUTE FUNCTION dashboard_ownership_truncated()""",
]


def create_triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for statement in {"sqlite": _SQLITE, "postgresql": _POSTGRES}.get(vendor, []):
        schema_editor.execute(statement)


def drop_triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for name in ("deleted", "inserted_by_hand", "updated_by_hand", "truncated"):
        if vendor == "sqlite":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS dashboard_ownership_{name}")
        elif vendor == "postgresql":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS dashboard_ownership_{name} ON dashboard_ownership")
    if vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS dashboard_ownership_new_epoch()")
        schema_editor.execute("DROP FUNCTION IF EXISTS dashboard_ownership_truncated()")


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0004_operator_event_kinds"),
    ]

    operations = [
        migrations.CreateModel(
            name="OwnershipClock",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("namespace", models.CharField(max_length=255)),
                ("hub", models.CharField(max_length=255)),
                ("consumer_group", models.CharField(max_length=255)),
                ("serial", models.BigIntegerField(default=0)),
                ("epoch", models.CharField(max_length=32)),
            ],
        ),
        migrations.AddField(
            model_name="ownership",
            name="changed",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddIndex(
            model_name="ownership",
            index=models.Index(fields=["namespace", "hub", "consumer_group", "changed"], name="ownership_changed"),
        ),
        migrations.AddConstraint(
            model_name="ownershipclock",
            constraint=models.UniqueConstraint(fields=("namespace", "hub", "consumer_group"), name="one_clock_per_hub"),
        ),
        migrations.RunPython(create_triggers, drop_triggers),
    ]
