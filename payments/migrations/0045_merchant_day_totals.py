# The merchants' day totals (payments.models.risk.MerchantDayTotal): a trigger on the payments'
# table on PostgreSQL appends each change of what counts (MerchantDayAdjustment), which the
# limits' reads fold into the totals under the exposure lock; the totals are filled from the
# payments already there in the same transaction,
# with the table locked against writes meanwhile so no entry is missed or counted twice. Other
# databases (the SQLite quick start) have no trigger: there the limits and the rules sum the
# payments as before.

from django.db import migrations, models

# An entry counts when it may still move money: not failed, not canceled, not a micro-entry.
COUNTED = "{row}.state NOT IN ('failed', 'canceled') AND {row}.purpose <> 'micro_entry'"
# Its Eastern calendar date: every boundary the limits and the rules count by is the end of one.
DAY = "({row}.created_at AT TIME ZONE 'America/New_York')::date"


def adjustment(row: str, sign: str) -> str:
    """The trigger's append of a change: ``row``'s entry (``NEW`` or ``OLD``) added or taken
    off (``sign``) its day."""
    return f"""INSERT INTO payments_merchantdayadjustment
            (merchant_id, direction, currency, day, amount, entries)
        VALUES ({row}.merchant_id, {row}.direction, {row}.currency, {DAY.format(row=row)},
                {sign}{row}.amount, {sign}1);"""


# The totals of the payments there are (the migration's fill, and ``manage.py totals_rebuild``
# after maintenance with triggers off: ``payments.services.limits.day_totals_rebuild``).
BACKFILL_SQL = f"""INSERT INTO payments_merchantdaytotal
    (merchant_id, direction, currency, day, amount, entries)
SELECT p.merchant_id, p.direction, p.currency, {DAY.format(row="p")}, SUM(p.amount), COUNT(*)
FROM payments_payment p
WHERE {COUNTED.format(row="p")}
GROUP BY 1, 2, 3, 4"""

TRIGGER_SQL = f"""
CREATE OR REPLACE FUNCTION payments_merchant_day_total() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    old_counted boolean := false;
    new_counted boolean := false;
    moved boolean := false;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        old_counted := {COUNTED.format(row="OLD")};
    END IF;
    IF TG_OP <> 'DELETE' THEN
        new_counted := {COUNTED.format(row="NEW")};
    END IF;
    IF TG_OP = 'UPDATE' THEN
        moved := OLD.amount <> NEW.amount OR OLD.merchant_id <> NEW.merchant_id
            OR OLD.direction <> NEW.direction OR OLD.currency <> NEW.currency
            OR {DAY.format(row="OLD")} <> {DAY.format(row="NEW")};
    END IF;
    IF old_counted AND (TG_OP = 'DELETE' OR NOT new_counted OR moved) THEN
        {adjustment("OLD", "-")}
    END IF;
    -- A new entry (old_counted is false) or one that started counting or moved.
    IF new_counted AND (NOT old_counted OR moved) THEN
        {adjustment("NEW", "")}
    END IF;
    RETURN NULL;
END
$$;

LOCK TABLE payments_payment IN SHARE ROW EXCLUSIVE MODE;

CREATE TRIGGER payments_merchant_day_total
AFTER INSERT OR DELETE
    OR UPDATE OF state, purpose, amount, merchant_id, direction, currency, created_at
ON payments_payment FOR EACH ROW EXECUTE FUNCTION payments_merchant_day_total();

{BACKFILL_SQL};
"""

REVERSE_SQL = """
DROP TRIGGER IF EXISTS payments_merchant_day_total ON payments_payment;
DROP FUNCTION IF EXISTS payments_merchant_day_total();
"""


def trigger_create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(TRIGGER_SQL)


def trigger_drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(REVERSE_SQL)



class Migration(migrations.Migration):

    dependencies = [
        ('payments', '0044_micro_entry_payments'),
    ]

    operations = [
        migrations.CreateModel(
            name='MerchantDayAdjustment',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('merchant_id', models.CharField(max_length=64)),
                ('direction', models.CharField(choices=[('debit', 'Debit (collects)'), ('credit', 'Credit (sends)')], max_length=8)),
                ('currency', models.CharField(max_length=3)),
                ('day', models.DateField(help_text="The entries' Eastern calendar date of creation.")),
                ('amount', models.DecimalField(decimal_places=2, max_digits=18)),
                ('entries', models.BigIntegerField()),
            ],
            options={
                'indexes': [models.Index(fields=['merchant_id', 'direction', 'currency', 'day'], name='merchant_day_adjustment')],
            },
        ),
        migrations.CreateModel(
            name='MerchantDayTotal',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('merchant_id', models.CharField(max_length=64)),
                ('direction', models.CharField(choices=[('debit', 'Debit (collects)'), ('credit', 'Credit (sends)')], max_length=8)),
                ('currency', models.CharField(max_length=3)),
                ('day', models.DateField(help_text="The entries' Eastern calendar date of creation.")),
                ('amount', models.DecimalField(decimal_places=2, max_digits=18)),
                ('entries', models.BigIntegerField()),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('merchant_id', 'direction', 'currency', 'day'), name='merchant_day_total_unique')],
            },
        ),
        migrations.RunPython(trigger_create, trigger_drop),
    ]
