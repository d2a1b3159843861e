"""History the database keeps: rows that nothing rewrites, by the product or by a console
session, enforced in PostgreSQL (docs/explanation/history.md).

Each guarded table has two triggers, created by migrations: one before every ``UPDATE`` and
``DELETE`` of a row, one before a ``TRUNCATE``, both running ``payments_history_guard()``,
which refuses the write (SQLSTATE 42501, ``insufficient_privilege``) unless it is one of the
changes spelt out here:

- a pending ledger entry (money out held, a recovery owed) moved to ``posted`` or
  ``archived``, with its ``posted_at``, every other column unchanged (``ledger``);
- a retention purge's delete of a table that has one, made through ``retention_delete``, the one
  documented path, which sets ``payments.retention`` for its transaction only (``retention``).

PostgreSQL fires no ordinary trigger in a session whose ``session_replication_role`` is
``replica`` (a logical replica applying changes, or a superuser's deliberate maintenance, such
as a test suite's flush of its database between tests). SQLite, the one-machine quick start,
has no such guard.
"""

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

GUARD_FUNCTION = "payments_history_guard"
RETENTION_SETTING = "payments.retention"

# The guarded tables of the payments app and the changes each allows (see the docstring).
PAYMENTS_TABLES = {
    "payments_ledgerentry": ("ledger",),
    "payments_paymentevent": (),
    "payments_processedevent": ("retention",),
    "payments_nocaction": (),
}
# The audit rows of the risk and originator controls (payments 0035): a limit's or a profile's
# change, who made it and why.
PAYMENTS_CONTROL_AUDIT_TABLES = {
    "payments_exposurelimitchange": (),
    "payments_originatorprofilechange": (),
}

FUNCTION_SQL = f"""
CREATE OR REPLACE FUNCTION {GUARD_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'DELETE' AND 'retention' = ANY(TG_ARGV) THEN
        IF current_setting('{RETENTION_SETTING}', true) = 'on' THEN
            RETURN OLD;
        END IF;
    END IF;
    IF TG_OP = 'UPDATE' AND 'ledger' = ANY(TG_ARGV) THEN
        IF OLD.status = 'pending' AND NEW.status IN ('posted', 'archived')
           AND (NEW.id, NEW.payment_id, NEW.merchant_id, NEW.kind, NEW.amount, NEW.currency,
                NEW.created_at)
               IS NOT DISTINCT FROM
               (OLD.id, OLD.payment_id, OLD.merchant_id, OLD.kind, OLD.amount, OLD.currency,
                OLD.created_at) THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION '% of % refused: it keeps history, which is never rewritten',
        TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'docs/explanation/history.md lists the changes allowed and the one '
                     'retention path';
END
$guard$;
"""


def guard_sql(table: str, allows: tuple[str, ...] = ()) -> str:
    """The two triggers that guard ``table``, allowing the changes ``allows`` names."""
    args = ", ".join(f"'{name}'" for name in allows)
    return f"""
DROP TRIGGER IF EXISTS {table}_history_guard ON {table};
CREATE TRIGGER {table}_history_guard BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION {GUARD_FUNCTION}({args});
DROP TRIGGER IF EXISTS {table}_history_truncate ON {table};
CREATE TRIGGER {table}_history_truncate BEFORE TRUNCATE ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {GUARD_FUNCTION}();
"""


def unguard_sql(table: str) -> str:
    return f"""
DROP TRIGGER IF EXISTS {table}_history_guard ON {table};
DROP TRIGGER IF EXISTS {table}_history_truncate ON {table};
"""


def guards_install(schema_editor, tables: dict[str, tuple[str, ...]]) -> None:
    """A migration's forward step: the guard function and ``tables``' triggers (PostgreSQL)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(FUNCTION_SQL, params=None)
    for table, allows in tables.items():
        schema_editor.execute(guard_sql(table, allows), params=None)


def guards_remove(schema_editor, tables: dict[str, tuple[str, ...]]) -> None:
    """A migration's backward step: ``tables``' triggers (the function stays for the others)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in tables:
        schema_editor.execute(unguard_sql(table), params=None)


@contextmanager
def retention_delete() -> Iterator[None]:
    """The one path a retention purge deletes guarded rows through: inside the caller's
    transaction, ``payments.retention`` is on (``SET LOCAL``: it ends with the transaction),
    and off again when the block ends, so nothing else of the transaction deletes history.
    Call inside ``transaction.atomic()``."""
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config(%s, 'on', true)", [RETENTION_SETTING])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config(%s, 'off', true)", [RETENTION_SETTING])
