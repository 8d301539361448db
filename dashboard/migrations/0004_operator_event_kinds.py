"""An undrain and an unpin are event kinds of their own.

Rows logged before told them only by which field was null: a "drain" of partition "*" naming the
worker as ``owner_id`` (not ``previous_owner``) was an undrain, a "pin" with no ``owner_id`` an unpin.
They are rewritten to say so; going back rewrites them as they were.
"""

from django.db import migrations
from django.db.models import Q


def name_the_direction(apps, schema_editor):
    rows = apps.get_model("dashboard", "EventLog").objects.using(schema_editor.connection.alias)
    rows.filter(kind="drain", owner_id__isnull=False).exclude(owner_id="").filter(
        Q(previous_owner__isnull=True) | Q(previous_owner="")
    ).update(kind="undrain")
    rows.filter(kind="pin").filter(Q(owner_id__isnull=True) | Q(owner_id="")).update(kind="unpin")


def fold_the_direction(apps, schema_editor):
    rows = apps.get_model("dashboard", "EventLog").objects.using(schema_editor.connection.alias)
    rows.filter(kind="undrain").update(kind="drain", previous_owner=None)
    rows.filter(kind="unpin").update(kind="pin", owner_id=None)


class Migration(migrations.Migration):

    dependencies = [
        ("dashboard", "0003_eventlog_handoff"),
    ]

    operations = [
        migrations.RunPython(name_the_direction, fold_the_direction),
    ]
