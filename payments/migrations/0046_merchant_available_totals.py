# The merchants' available figures (payments.models.ledger.MerchantAvailableTotal): three
# statement triggers on the ledger on PostgreSQL append what each statement changed
# (MerchantAvailableAdjustment), which a payout folds into the totals under the merchant's
# money-out lock (payments_merchant_available_fold, a function so that its plan is kept); the
# totals are filled from the entries already there in the same transaction, with the ledger
# locked against writes meanwhile so no entry is missed or counted twice. Other databases (the
# SQLite quick start) have no trigger: there a payout sums the ledger as before.
#
# What an entry adds is payments.selectors._ledger_sums's ``available``, row by row: money out,
# money back and recoveries (MONEY_OUT_SIDE) count at once, when held or sent (negative, not
# archived) or when they moved (positive, posted), on the day 0001-01-01; any other entry counts
# when posted, on the Eastern date its payment's credit settled (posted_at, else created_at),
# and not at all while its payment has no credit. An entry's day so depends on another row (its
# credit may be written, or posted, after it). A statement that writes no credit leaves every
# other entry's day as it was: its change is its new rows' contributions less its old rows',
# each on the day of its payment's credit as it stands. One that writes a credit may move
# entries it did not touch, so the trigger compares the whole payments it touched before and
# after it (the rows now; as they were: the rows now less the statement's new rows, plus its old
# ones). Either way the difference is appended per merchant, currency and day. One statement may
# change many entries of a payment (the transition tables hold them all), which a row trigger,
# seeing only the final table, would count wrong.

from django.db import migrations, models

MONEY_OUT_SIDE = (
    "'refund', 'payout', 'refund_return', 'payout_return', 'micro_entry', "
    "'micro_entry_return', 'recovery_owed'"
)
ALWAYS = "DATE '0001-01-01'"
COLUMNS = "id, payment_id, merchant_id, currency, kind, amount, status, posted_at, created_at"


def contributions(entries: str, credits: str, sign: str = "") -> str:
    """What each entry of ``entries`` adds (merchant, currency, day, amount, ``sign``ed), its
    payment's credit looked up in ``credits``."""
    return f"""SELECT e.merchant_id, e.currency,
        CASE WHEN e.kind IN ({MONEY_OUT_SIDE}) THEN {ALWAYS}
            ELSE (COALESCE(c.posted_at, c.created_at) AT TIME ZONE 'America/New_York')::date
        END AS day,
        {sign}e.amount AS amount
    FROM {entries} e
    LEFT JOIN {credits} c ON c.payment_id = e.payment_id AND c.kind = 'credit'
    WHERE CASE WHEN e.kind IN ({MONEY_OUT_SIDE})
        THEN (e.status <> 'archived' AND e.amount < 0) OR (e.status = 'posted' AND e.amount > 0)
        ELSE e.status = 'posted' AND c.id IS NOT NULL END"""


def appended(changes: str) -> str:
    return f"""INSERT INTO payments_merchantavailableadjustment (merchant_id, currency, day, amount)
    SELECT merchant_id, currency, day, SUM(amount) FROM ({changes}) AS changes
    GROUP BY merchant_id, currency, day
    HAVING SUM(amount) <> 0;"""


def change(*, new: bool, old: bool) -> str:
    """The trigger's append for a statement with new rows (``new_rows``), old rows
    (``old_rows``) or both."""
    tables = [rows for rows, present in (("new_rows", new), ("old_rows", old)) if present]
    wrote_credit = " OR ".join(
        f"EXISTS (SELECT 1 FROM {rows} WHERE kind = 'credit')" for rows in tables
    )
    rows_only = " UNION ALL ".join(
        contributions(rows, "payments_ledgerentry", "" if rows == "new_rows" else "-")
        for rows in tables
    )
    touched = " UNION ".join(f"SELECT payment_id FROM {rows}" for rows in tables)
    was = f"SELECT {COLUMNS} FROM now_entries"
    if new:
        was += " WHERE id NOT IN (SELECT id FROM new_rows)"
    if old:
        was += f" UNION ALL SELECT {COLUMNS} FROM old_rows"
    payments = f"""WITH touched AS ({touched}),
    now_entries AS (
        SELECT {COLUMNS} FROM payments_ledgerentry
        WHERE payment_id IN (SELECT payment_id FROM touched)
    ),
    was_entries AS ({was})
    {appended(
        contributions("now_entries", "now_entries")
        + " UNION ALL "
        + contributions("was_entries", "was_entries", "-")
    )}"""
    return f"""IF {wrote_credit} THEN
            {payments}
        ELSE
            {appended(rows_only)}
        END IF;"""


TRIGGER_SQL = f"""
CREATE OR REPLACE FUNCTION payments_merchant_available() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Each branch is planned only when it runs, so it names only its event's tables.
    IF TG_OP = 'INSERT' THEN
        {change(new=True, old=False)}
    ELSIF TG_OP = 'UPDATE' THEN
        {change(new=True, old=True)}
    ELSE
        {change(new=False, old=True)}
    END IF;
    RETURN NULL;
END
$$;

-- The merchant's adjustments in ``currency`` folded into its totals, and the sum of the days
-- through ``through``: the totals as the statement found them plus what it folded. Only the
-- holder of the merchant's money-out lock calls it (payments.services.available), in the
-- statement that takes the lock: VOLATILE, its statement reads in a snapshot of its own,
-- taken once the lock is held.
CREATE OR REPLACE FUNCTION payments_merchant_available_fold(
    merchant text, currency_code text, through date
) RETURNS numeric
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    available numeric;
BEGIN
    WITH folded AS (
        DELETE FROM payments_merchantavailableadjustment a
        WHERE a.merchant_id = merchant AND a.currency = currency_code
        RETURNING a.day, a.amount
    ), totals_kept AS (
        INSERT INTO payments_merchantavailabletotal AS total (merchant_id, currency, day, amount)
        SELECT merchant, currency_code, f.day, SUM(f.amount) FROM folded f GROUP BY f.day
        ON CONFLICT (merchant_id, currency, day)
            DO UPDATE SET amount = total.amount + EXCLUDED.amount
    )
    SELECT SUM(days.amount) INTO available FROM (
        SELECT t.amount FROM payments_merchantavailabletotal t
        WHERE t.merchant_id = merchant AND t.currency = currency_code AND t.day <= through
        UNION ALL
        SELECT f.amount FROM folded f WHERE f.day <= through
    ) AS days;
    RETURN available;
END
$$;

LOCK TABLE payments_ledgerentry IN SHARE ROW EXCLUSIVE MODE;

CREATE TRIGGER payments_merchant_available_insert AFTER INSERT ON payments_ledgerentry
REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION payments_merchant_available();
CREATE TRIGGER payments_merchant_available_update AFTER UPDATE ON payments_ledgerentry
REFERENCING NEW TABLE AS new_rows OLD TABLE AS old_rows
FOR EACH STATEMENT EXECUTE FUNCTION payments_merchant_available();
CREATE TRIGGER payments_merchant_available_delete AFTER DELETE ON payments_ledgerentry
REFERENCING OLD TABLE AS old_rows
FOR EACH STATEMENT EXECUTE FUNCTION payments_merchant_available();

{{backfill}}
"""
# The totals of the entries already written (the ledger locked against writes meanwhile).
BACKFILL_SQL = f"""INSERT INTO payments_merchantavailabletotal (merchant_id, currency, day, amount)
SELECT merchant_id, currency, day, SUM(amount)
FROM ({contributions("payments_ledgerentry", "payments_ledgerentry")}) AS entries
GROUP BY merchant_id, currency, day;"""
TRIGGER_SQL = TRIGGER_SQL.replace("{backfill}", BACKFILL_SQL)

REVERSE_SQL = """
DROP TRIGGER IF EXISTS payments_merchant_available_insert ON payments_ledgerentry;
DROP TRIGGER IF EXISTS payments_merchant_available_update ON payments_ledgerentry;
DROP TRIGGER IF EXISTS payments_merchant_available_delete ON payments_ledgerentry;
DROP FUNCTION IF EXISTS payments_merchant_available();
DROP FUNCTION IF EXISTS payments_merchant_available_fold(text, text, date);
"""


def trigger_create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(TRIGGER_SQL)


def trigger_drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(REVERSE_SQL)



class Migration(migrations.Migration):

    dependencies = [
        ('payments', '0045_merchant_day_totals'),
    ]

    operations = [
        migrations.CreateModel(
            name='MerchantAvailableAdjustment',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('merchant_id', models.CharField(max_length=64)),
                ('currency', models.CharField(max_length=3)),
                ('day', models.DateField(help_text="The Eastern calendar date the entries' debit settled on (its credit's posted_at, else created_at); 0001-01-01 for money out and back, which count at once.")),
                ('amount', models.DecimalField(decimal_places=2, max_digits=18)),
            ],
            options={
                'indexes': [models.Index(fields=['merchant_id', 'currency'], name='merchant_available_adjustment')],
            },
        ),
        migrations.CreateModel(
            name='MerchantAvailableTotal',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('merchant_id', models.CharField(max_length=64)),
                ('currency', models.CharField(max_length=3)),
                ('day', models.DateField(help_text="The Eastern calendar date the entries' debit settled on (its credit's posted_at, else created_at); 0001-01-01 for money out and back, which count at once.")),
                ('amount', models.DecimalField(decimal_places=2, max_digits=18)),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('merchant_id', 'currency', 'day'), name='merchant_available_total_unique')],
            },
        ),
        migrations.RunPython(trigger_create, trigger_drop),
    ]
