"""The books: the bank's statements, each line's match against what we sent and booked, and
the variances a person explains.

A statement is kept whole, sealed by the vault as the NACHA files are (it names our bank
account), imported or refused. Each monetary detail line is one ``StatementLine``, matched
(``StatementMatch`` rows: an ACH batch of a file we sent, or a return), partially matched, or
unexplained. What does not agree is a ``BooksVariance``: never plugged, it stays open until a
person explains it (``VarianceExplanation``, the audit row) or a later bank line clears it.
"""

import uuid

from django.conf import settings
from django.db import models

from bank.nacha import sealing
from bank.nacha.models import ReceivedFile


class StatementStatus(models.TextChoices):
    IMPORTED = "imported", "Imported: every line read"
    REFUSED = "refused", "Refused whole: malformed, nothing imported"


class BankStatement(ReceivedFile):
    """A BAI2 statement the bank sent, kept whole (sealed), imported or refused."""

    status = models.CharField(max_length=16, choices=StatementStatus.choices)
    line_count = models.PositiveIntegerField(default=0)

    class Meta(ReceivedFile.Meta):
        db_table = "payments_bankstatement"
        pass

    def content_aad(self) -> bytes:
        return sealing.statement_aad(sha256=self.sha256)


class StatementDay(models.Model):
    """The bank has reported ``as_of_date`` for an account: only then can an expected line be
    missing."""

    statement = models.ForeignKey(BankStatement, on_delete=models.PROTECT, related_name="days")
    account_last4 = models.CharField(max_length=4)
    currency = models.CharField(max_length=3)
    as_of_date = models.DateField(db_index=True)
    # An interim report (as-of-date modifier 1 or 3) says what has posted so far: nothing can
    # be missing until a final one has come.
    final = models.BooleanField(default=True)

    class Meta:
        db_table = "payments_statementday"
        constraints = [
            models.UniqueConstraint(
                fields=["statement", "account_last4", "currency", "as_of_date"],
                name="books_statement_day_once",
            )
        ]

    def __str__(self) -> str:
        return f"{self.as_of_date} account ****{self.account_last4}"


class MatchStatus(models.TextChoices):
    MATCHED = "matched", "Matched"
    PARTIAL = "partial", "Partially matched"
    UNEXPLAINED = "unexplained", "Unexplained"


class StatementLine(models.Model):
    """One detail (16) of a statement. ``fingerprint`` is unique: the same line in a statement
    resent with other bytes is one row, so nothing is counted twice."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    statement = models.ForeignKey(BankStatement, on_delete=models.PROTECT, related_name="lines")
    record_number = models.PositiveIntegerField()
    account_last4 = models.CharField(max_length=4)
    currency = models.CharField(max_length=3)
    as_of_date = models.DateField(db_index=True)
    type_code = models.CharField(max_length=3)
    direction = models.CharField(max_length=8)
    amount = models.DecimalField(max_digits=18, decimal_places=2)
    bank_reference = models.TextField(blank=True)
    customer_reference = models.TextField(blank=True)
    text = models.TextField(blank=True)
    fingerprint = models.CharField(max_length=64, unique=True)
    match_status = models.CharField(
        max_length=16, choices=MatchStatus.choices, default=MatchStatus.UNEXPLAINED
    )
    matched_amount = models.DecimalField(max_digits=18, decimal_places=2, default=0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        db_table = "payments_statementline"
        ordering = ["as_of_date", "record_number"]
        indexes = [
            models.Index(
                fields=["created_at"],
                condition=~models.Q(match_status="matched"),
                name="books_line_not_matched",
            )
        ]

    def __str__(self) -> str:
        return f"{self.as_of_date} {self.type_code} {self.direction} {self.amount}"


class MatchKind(models.TextChoices):
    BATCH = "batch", "ACH batch settlement"
    RETURN = "return", "Return"


class StatementMatch(models.Model):
    """What a line was matched to: a batch of a file we sent (file and batch number; file and
    SEC code for a file written before batch numbers were recorded), or a returned payment.
    Each is matched at most once (unique), whatever is re-run."""

    line = models.ForeignKey(StatementLine, on_delete=models.PROTECT, related_name="matches")
    kind = models.CharField(max_length=16, choices=MatchKind.choices)
    nacha_file = models.ForeignKey(
        "bank.NachaFile", null=True, blank=True, on_delete=models.PROTECT
    )
    batch_number = models.PositiveIntegerField(null=True, blank=True)
    sec_code = models.CharField(max_length=3, blank=True)
    payment = models.ForeignKey("payments.Payment", null=True, blank=True, on_delete=models.PROTECT)
    expected_amount = models.DecimalField(max_digits=18, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "payments_statementmatch"
        constraints = [
            models.UniqueConstraint(
                fields=["nacha_file", "batch_number"],
                condition=models.Q(kind="batch", batch_number__isnull=False),
                name="books_batch_matched_once",
            ),
            models.UniqueConstraint(
                fields=["nacha_file", "sec_code"],
                condition=models.Q(kind="batch", batch_number__isnull=True),
                name="books_unnumbered_batch_matched_once",
            ),
            models.UniqueConstraint(
                fields=["payment"], condition=models.Q(kind="return"), name="books_return_once"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.expected_amount}"


class VarianceKind(models.TextChoices):
    MISSING_SETTLEMENT = "missing_settlement", "Batch sent, no settlement at the bank"
    SHORT_AMOUNT = "short_amount", "Bank settled another amount than the batch"
    EXTRA_LINE = "extra_line", "Bank line matching nothing of ours"
    MISSING_RETURN = "missing_return", "Return booked, not debited at the bank"


class VarianceStatus(models.TextChoices):
    OPEN = "open", "Open: unexplained"
    EXPLAINED = "explained", "Explained by a person"
    CLEARED = "cleared", "Cleared by a later bank line"


class BooksVariance(models.Model):
    """A difference between the bank and the books on one banking day, with its evidence.
    ``key`` is unique: a re-check finds the same variance, never a second one."""

    key = models.CharField(max_length=200, unique=True)
    day = models.DateField(db_index=True)
    kind = models.CharField(max_length=24, choices=VarianceKind.choices)
    status = models.CharField(
        max_length=16, choices=VarianceStatus.choices, default=VarianceStatus.OPEN
    )
    currency = models.CharField(max_length=3)
    # The merchants whose entries it touches; empty when no entry of ours is involved (a bank
    # line matching nothing): the bank account's own variance.
    merchant_ids = models.JSONField(default=list, blank=True)
    expected_amount = models.DecimalField(max_digits=18, decimal_places=2, default=0)
    bank_amount = models.DecimalField(max_digits=18, decimal_places=2, default=0)
    line = models.ForeignKey(
        StatementLine, null=True, blank=True, on_delete=models.PROTECT, related_name="variances"
    )
    nacha_file = models.ForeignKey(
        "bank.NachaFile", null=True, blank=True, on_delete=models.PROTECT
    )
    batch_number = models.PositiveIntegerField(null=True, blank=True)
    sec_code = models.CharField(max_length=3, blank=True)
    payments = models.ManyToManyField("payments.Payment", blank=True, related_name="+")
    summary = models.TextField()
    found_at = models.DateTimeField(auto_now_add=True, db_index=True)
    cleared_at = models.DateTimeField(null=True, blank=True)
    cleared_by_line = models.ForeignKey(
        StatementLine, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        db_table = "payments_booksvariance"
        ordering = ["day", "found_at"]
        indexes = [
            models.Index(fields=["day"], condition=models.Q(status="open"), name="books_open")
        ]
        permissions = [("explain_variance", "Can explain a books variance")]

    def __str__(self) -> str:
        return f"{self.day} {self.get_kind_display()} ({self.status})"


class VarianceExplanation(models.Model):
    """Audit row: who explained which variance, when, and the note. Never edited."""

    variance = models.ForeignKey(
        BooksVariance, on_delete=models.PROTECT, related_name="explanations"
    )
    explained_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    note = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "payments_varianceexplanation"
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"explained by {self.explained_by_id} at {self.created_at:%Y-%m-%d %H:%M}"
