"""The audit trail of what people did in triage cannot be updated, deleted or truncated: the
payments app's history guard (``payments.history``), on this app's table."""

from django.db import migrations

from payments.history import guards_install, guards_remove

TABLES = {"triage_triageaction": ()}


def forwards(apps, schema_editor):
    guards_install(schema_editor, TABLES)


def backwards(apps, schema_editor):
    guards_remove(schema_editor, TABLES)


class Migration(migrations.Migration):
    dependencies = [
        ("triage", "0005_audit_times_db_clock"),
        ("payments", "0034_history_guards"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
