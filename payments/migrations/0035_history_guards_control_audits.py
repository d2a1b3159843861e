"""The audit rows of exposure limit and originator profile changes cannot be updated, deleted or
truncated, as the other audit rows (``payments.history``)."""

from django.db import migrations

from payments.history import PAYMENTS_CONTROL_AUDIT_TABLES, guards_install, guards_remove


def forwards(apps, schema_editor):
    guards_install(schema_editor, PAYMENTS_CONTROL_AUDIT_TABLES)


def backwards(apps, schema_editor):
    guards_remove(schema_editor, PAYMENTS_CONTROL_AUDIT_TABLES)


class Migration(migrations.Migration):
    dependencies = [
        ("payments", "0034_history_guards"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
