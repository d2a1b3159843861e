"""The merchant ledger: one entry per movement of money, posted when it settles."""

from django.db import models
from django.db.models.functions import Now

from payments.models.payment import Payment


class LedgerEntryKind(models.TextChoices):
    CREDIT = "credit", "Credit"
    REVERSAL = "reversal", "Reversal (debit)"
    # A dishonored return: the return's reversal undone, and that undone again when the
    # receiving bank contests the dishonor (payments.services.dishonors).
    RECREDIT = "recredit", "Re-credit (the return was dishonored)"
    RECREDIT_REVERSAL = "recredit_reversal", "Re-credit reversed (the dishonor was contested)"
    # Money out (``payments.services.refunds``), on the credit's own payment row: held when
    # the refund or payout is made, posted when it settles, archived when it fails or is
    # canceled; its return puts the money back.
    REFUND = "refund", "Refund (money out)"
    REFUND_RETURN = "refund_return", "Refund returned (money back)"
    PAYOUT = "payout", "Payout (money out)"
    PAYOUT_RETURN = "payout_return", "Payout returned (money back)"
    # An account validation's micro-entry credit (``purpose=micro_entry``), on the account
    # PAYMENTS["MICRO_ENTRY_COST"] names (the merchant's, or the house's ``HOUSE_ACCOUNT``):
    # held when made, as money out; its offsetting debit is a ``credit`` entry of the same
    # account, so the round nets to zero once both settle.
    MICRO_ENTRY = "micro_entry", "Micro-entry credit (account validation)"
    MICRO_ENTRY_RETURN = "micro_entry_return", "Micro-entry credit returned (money back)"
    # A debit returned after a refund of it was sent: the customer has the money twice, and
    # the merchant is owed the refund back, recovered outside ACH (``DoubleLoss``). Pending
    # until a person records it recovered (posted) or written off (archived).
    RECOVERY_OWED = "recovery_owed", "Recovery owed (refund sent, then the debit returned)"


# The sign each kind's amount carries, so the sum of a merchant's entries is its net balance.


LEDGER_KIND_SIGNS = {
    LedgerEntryKind.CREDIT: 1,
    LedgerEntryKind.REVERSAL: -1,
    LedgerEntryKind.RECREDIT: 1,
    LedgerEntryKind.RECREDIT_REVERSAL: -1,
    LedgerEntryKind.REFUND: -1,
    LedgerEntryKind.REFUND_RETURN: 1,
    LedgerEntryKind.PAYOUT: -1,
    LedgerEntryKind.PAYOUT_RETURN: 1,
    LedgerEntryKind.RECOVERY_OWED: 1,
    LedgerEntryKind.MICRO_ENTRY: -1,
    LedgerEntryKind.MICRO_ENTRY_RETURN: 1,
}

# The ledger account (in ``merchant_id``) a micro-entry's cost lands on when
# PAYMENTS["MICRO_ENTRY_COST"] is "house": the originator's own, apart from every merchant's.
HOUSE_ACCOUNT = "~house"


class LedgerEntryStatus(models.TextChoices):
    """Modern Treasury's model: an entry is pending until the money has moved, then posted;
    a pending entry whose money never moves is archived (kept, counted nowhere)."""

    PENDING = "pending", "Pending"
    POSTED = "posted", "Posted"
    ARCHIVED = "archived", "Archived (the money never moved)"


class LedgerEntry(models.Model):
    """A merchant credit, written once per confirmed payment, and its reversal (a debit of the
    same amount, stored negative), written once if the payment is returned after settlement: the
    unique constraint on (payment, kind) is the guard for both. A dishonored return adds one
    re-credit, a contested dishonor one reversal of it, under the same guard."""

    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="ledger_entries")
    merchant_id = models.CharField(max_length=64, db_index=True)
    kind = models.CharField(max_length=24, choices=LedgerEntryKind.choices)
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    # Every entry of a debit is posted when written (the money has moved); money out is held
    # pending first.
    status = models.CharField(
        max_length=12,
        choices=LedgerEntryStatus.choices,
        default=LedgerEntryStatus.POSTED,
        db_default=LedgerEntryStatus.POSTED,
    )
    posted_at = models.DateTimeField(null=True, blank=True)
    currency = models.CharField(max_length=3)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name_plural = "ledger entries"
        constraints = [
            models.UniqueConstraint(fields=["payment", "kind"], name="ledger_one_entry_per_kind"),
            # The sign follows the kind, so the sum of a merchant's entries is its net balance.
            models.CheckConstraint(
                condition=(models.Q(kind="credit", amount__gt=0) | ~models.Q(kind="credit")),
                name="ledger_credit_positive",
            ),
            models.CheckConstraint(
                condition=(models.Q(kind="reversal", amount__lt=0) | ~models.Q(kind="reversal")),
                name="ledger_reversal_negative",
            ),
            models.CheckConstraint(
                condition=(models.Q(kind="recredit", amount__gt=0) | ~models.Q(kind="recredit")),
                name="ledger_recredit_positive",
            ),
            models.CheckConstraint(
                condition=(
                    models.Q(kind="recredit_reversal", amount__lt=0)
                    | ~models.Q(kind="recredit_reversal")
                ),
                name="ledger_recredit_reversal_negative",
            ),
            models.CheckConstraint(
                condition=(
                    models.Q(kind__in=["refund", "payout", "micro_entry"], amount__lt=0)
                    | models.Q(
                        kind__in=["refund_return", "payout_return", "recovery_owed"]
                        + ["micro_entry_return"],
                        amount__gt=0,
                    )
                    | ~models.Q(
                        kind__in=["refund", "payout", "refund_return", "payout_return"]
                        + ["recovery_owed", "micro_entry", "micro_entry_return"]
                    )
                ),
                name="ledger_money_out_signs",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} {self.currency} to {self.merchant_id}"


# The day of a merchant's available figures that money out, money back and recoveries land on:
# they count from the moment they are written, whatever the reserve (before every real day).
AVAILABLE_ALWAYS = "0001-01-01"


class MerchantAvailableFigures(models.Model):
    merchant_id = models.CharField(max_length=64)
    currency = models.CharField(max_length=3)
    day = models.DateField(
        help_text="The Eastern calendar date the entries' debit settled on (its credit's "
        "posted_at, else created_at); 0001-01-01 for money out and back, which count at once."
    )
    amount = models.DecimalField(max_digits=18, decimal_places=2)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.merchant_id} {self.currency} {self.day} {self.amount}"


class MerchantAvailableTotal(MerchantAvailableFigures):
    """What a merchant's ledger entries add to its available balance, per currency and day:
    the posted entries of each debit on the Eastern date its credit settled, and money out
    (held or sent), money back and recoveries recovered on ``AVAILABLE_ALWAYS``. The available
    balance at ``now`` is the sum of the days through the reserve's cutoff
    (``payments.services.available``), a few hundred rows at most however long the ledger.

    Kept by PostgreSQL (migration 0046): three statement triggers on the ledger append a
    ``MerchantAvailableAdjustment`` for what each statement changed (an entry written, posted,
    archived, or its debit's credit settling later than it), and a payout folds them into these
    rows under the merchant's money-out lock, so the ledger's writers only ever append. What
    counts is always the totals plus the adjustments not yet folded. Never written by the
    application otherwise; on other databases (the SQLite quick start) there is no trigger and
    the payout sums the ledger as ``payments.selectors.merchant_money_figures`` does."""

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["merchant_id", "currency", "day"],
                name="merchant_available_total_unique",
            ),
        ]


class MerchantAvailableAdjustment(MerchantAvailableFigures):
    """A change to a ``MerchantAvailableTotal`` not yet folded into it: appended by the ledger's
    triggers, deleted when a payout folds it in under the money-out lock, never updated."""

    class Meta:
        indexes = [
            models.Index(fields=["merchant_id", "currency"], name="merchant_available_adjustment"),
        ]
