"""A merchant's available balance for a payout, read from the totals PostgreSQL keeps.

``payments.selectors.merchant_money_figures`` defines ``available`` and computes it from every
ledger entry of the merchant, which is right for the balances API and the books but makes a
payout's cost grow with the ledger. A payout instead reads ``MerchantAvailableTotal``: per
merchant, currency and Eastern calendar day, what the posted entries of the debits whose credit
settled that day add, and (on ``AVAILABLE_ALWAYS``) money out, money back and recoveries. The
ledger's triggers (migration 0046) append each statement's change as a
``MerchantAvailableAdjustment``; the payout, holding the merchant's exclusive money-out lock,
folds them into the totals and sums the days through the reserve's cutoff in one statement.
The cutoff is always the end of an Eastern day (``payments.banking_days.available_cutoff``), so
a debit's credit is past it exactly when its day is on or before the cutoff's date: the same
figure, to the cent, as the full read.

Only the holder of the money-out lock folds: a fold deletes adjustments and adds them to the
totals, and the statement's sum reads the totals as they were plus what it folded; a second
folder at the same moment would delete rows this one's snapshot still counts as unfolded.
Writers of the ledger only append, so they never wait on a total's row. On other databases
(the SQLite quick start) there is no trigger and the figure is the full read.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from django.db import connection, transaction
from django.utils import timezone

from payments import conf as payments_conf
from payments.banking_days import ach_date, available_cutoff
from payments.kernel.locks import money_out_lock_sql
from payments.kernel.reads import AfterLocks
from payments.kernel.totals import totals_rebuild

# Read without folding: the totals and the changes not yet folded, as of one snapshot.
AVAILABLE_SUM = """SELECT SUM(amount) FROM (
    SELECT amount FROM payments_merchantavailabletotal
    WHERE merchant_id = %(merchant_id)s AND currency = %(currency)s AND day <= %(through)s
    UNION ALL
    SELECT amount FROM payments_merchantavailableadjustment
    WHERE merchant_id = %(merchant_id)s AND currency = %(currency)s AND day <= %(through)s
) AS days"""
# Under the money-out lock: the changes folded into the totals, and the sum of the totals as
# they were (the statement's snapshot) and the changes it folded. A function of the database
# (migration 0046), whose statement's plan each connection keeps: a quarter of the CPU of the
# same statement planned anew on every payout.
AVAILABLE_FOLD = "payments_merchant_available_fold(%s, %s, %s)"
AVAILABLE_FOLD_SUM = f"SELECT {AVAILABLE_FOLD}"


def available_through(now: datetime | None = None) -> date:
    """The last day whose debits are past the return reserve at ``now``."""
    return ach_date(
        available_cutoff(now or timezone.now(), payments_conf.AVAILABLE_AFTER_BANKING_DAYS)
    )


def merchant_available(
    *, merchant_id: str, currency: str, now: datetime | None = None, locked: bool = False
) -> Decimal:
    """The merchant's available balance in ``currency`` at ``now``, as
    ``merchant_money_figures`` defines it (``0.00`` for a currency it has no entry in). On
    PostgreSQL one statement over the day totals; it folds the appended changes into them when
    the caller holds the merchant's exclusive money-out lock (``locked``), as a payout does."""
    if connection.vendor != "postgresql":
        from payments.selectors import merchant_money_figures

        figures = merchant_money_figures(merchant_id=merchant_id, now=now).get(currency)
        return Decimal(figures["available"]) if figures else Decimal("0.00")
    params = {
        "merchant_id": merchant_id,
        "currency": currency,
        "through": available_through(now),
    }
    with connection.cursor() as cursor:
        if locked:
            cursor.execute(AVAILABLE_FOLD_SUM, [merchant_id, currency, params["through"]])
        else:
            cursor.execute(AVAILABLE_SUM, params)
        (total,) = cursor.fetchone()
    return available_of(total)


def available_after_locks(
    *, merchant_id: str, currency: str, now: datetime | None = None
) -> AfterLocks | None:
    """``merchant_available`` with ``locked``, as an expression a create's locking statement
    evaluates once its locks are held (``payments.kernel.reads.AfterLocks``: the fold is a
    VOLATILE function, whose statement reads after the wait), so a payout takes its locks and
    reads its balance in one round trip; its value is read by ``available_of``. None off
    PostgreSQL, where ``merchant_available`` reads it."""
    if connection.vendor != "postgresql":
        return None
    return AfterLocks(AVAILABLE_FOLD, [merchant_id, currency, available_through(now)])


def available_of(total: Decimal | None) -> Decimal:
    """A sum of the totals as the API writes it: to the cent, nothing as zero."""
    return (total or Decimal("0")).quantize(Decimal("0.01"))


def available_totals_fold(*, limit: int = 1000) -> int:
    """Fold the changes the ledger's triggers appended into the day totals, for up to ``limit``
    merchants and currencies that have any (the most changes first); returns how many it folded.

    Only a payout folds otherwise, so a merchant that collects and never pays out would keep a
    row for every statement that ever changed its ledger, and its first payout would fold them
    all at once. Each fold takes the merchant's exclusive money-out lock, a payout's (only its
    holder may fold: ``merchant_available``), in a transaction of its own, so a payout of the
    merchant waits for it or it for the payout, briefly, and refunds of other merchants never.
    PostgreSQL only (0 elsewhere: no totals)."""
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute(PENDING_CHANGES, [limit])
        pending = cursor.fetchall()
    through = available_through()
    for merchant_id, currency in pending:
        lock = money_out_lock_sql(merchant_id)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SELECT {lock.sql}", lock.params)
            cursor.execute(AVAILABLE_FOLD_SUM, [merchant_id, currency, through])
    return len(pending)


# The merchants and currencies with changes not yet folded, the most first.
PENDING_CHANGES = """SELECT merchant_id, currency FROM payments_merchantavailableadjustment
GROUP BY merchant_id, currency ORDER BY COUNT(*) DESC, merchant_id, currency LIMIT %s"""


def available_totals_rebuild() -> int:
    """Rebuild every merchant's available totals from the ledger, as migration 0046 first
    filled them (``payments.kernel.totals``): payouts wait meanwhile. Returns how many total
    rows it wrote (0 off PostgreSQL)."""
    return totals_rebuild(
        source="payments_ledgerentry",
        totals="payments_merchantavailabletotal",
        changes="payments_merchantavailableadjustment",
        migration="0046_merchant_available_totals",
    )
