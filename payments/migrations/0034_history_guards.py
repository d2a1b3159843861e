"""Posted ledger entries, the payment event log, the processed-event records and the NOC audit
rows cannot be updated, deleted or truncated: PostgreSQL triggers refuse it, but for the changes
``payments.history`` spells out (docs/explanation/history.md)."""

from django.db import migrations

from payments.history import PAYMENTS_TABLES, guards_install, guards_remove


def forwards(apps, schema_editor):
    guards_install(schema_editor, PAYMENTS_TABLES)


def backwards(apps, schema_editor):
    guards_remove(schema_editor, PAYMENTS_TABLES)


class Migration(migrations.Migration):
    dependencies = [
        ("payments", "0033_originator_profiles_and_entry_class"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
