"""Totals PostgreSQL keeps by trigger, rebuilt whole from the rows they total.

Two such tables, each with a table of the changes its triggers append: the merchants' day totals
the exposure limits read (migration 0045, from the payments) and the available totals a payout
reads (migration 0046, from the ledger). A session with ``session_replication_role = replica``
fires no trigger, so what it writes is in neither; ``manage.py totals_rebuild`` rebuilds both
after such maintenance (``payments.services.limits.day_totals_rebuild``,
``payments.services.available.available_totals_rebuild``).
"""

from importlib import import_module

from django.db import connection, transaction


def totals_rebuild(*, source: str, totals: str, changes: str, migration: str) -> int:
    """Empty ``totals`` and ``changes`` and fill ``totals`` again with the ``BACKFILL_SQL`` of
    ``migration`` (the migration's own statement: one definition of what counts), with
    ``source`` locked against writes until the transaction ends, so no row is missed or counted
    twice; its writers wait meanwhile. Returns how many total rows it wrote. PostgreSQL only:
    elsewhere there are no totals to rebuild (0)."""
    if connection.vendor != "postgresql":
        return 0
    backfill = import_module(f"payments.migrations.{migration}").BACKFILL_SQL
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {source} IN SHARE ROW EXCLUSIVE MODE")
        cursor.execute(f"DELETE FROM {changes}")  # noqa: S608 - table names of this module
        cursor.execute(f"DELETE FROM {totals}")  # noqa: S608
        cursor.execute(backfill)
        return cursor.rowcount
