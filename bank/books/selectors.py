"""Reads of the books: a banking day's figures per merchant and currency, as ``books_close``
prints them and ``GET /api/merchants/<id>/books/`` answers them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal

from bank.books.models import (
    BooksVariance,
    MatchKind,
    MatchStatus,
    StatementDay,
    StatementMatch,
    VarianceStatus,
)
from bank.nacha.models import NachaEntry
from payments.selectors import cents_text
from payments.services.credits import ledger_account


def day_reported(day: date) -> bool:
    return StatementDay.objects.filter(
        as_of_date=day, final=True, statement__status="imported"
    ).exists()


@dataclass
class DayFigures:
    merchant_id: str | None
    currency: str
    expected: Decimal = Decimal(0)
    settled: Decimal = Decimal(0)
    returned: Decimal = Decimal(0)
    variances: int = 0
    variance_ids: list = field(default_factory=list)

    def as_json(self, *, day: date, reported: bool) -> dict:
        return {
            "date": day.isoformat(),
            "merchant_id": self.merchant_id,
            "currency": self.currency,
            "expected": cents_text(self.expected),
            "settled": cents_text(self.settled),
            "returned": cents_text(self.returned),
            "variances": self.variances,
            "reported_by_bank": reported,
        }


def books_day_figures(*, day: date, merchant_id: str | None = None) -> list[DayFigures]:
    """Per merchant and currency: expected (the batches due that day), settled (of those,
    what the bank settled in full), returned (returns the bank debited that day), and the
    count of open variances. The bank account's own variances (a line matching nothing of
    ours) are the row whose merchant is None."""
    rows: dict[tuple, DayFigures] = {}

    def row(merchant: str | None, currency: str) -> DayFigures:
        return rows.setdefault((merchant, currency), DayFigures(merchant, currency))

    # A batch by file, batch number and SEC code (an unnumbered one's number is None).
    fully = {
        (m.nacha_file_id, m.batch_number, m.sec_code)
        for m in StatementMatch.objects.filter(
            kind=MatchKind.BATCH,
            line__match_status=MatchStatus.MATCHED,
            nacha_file__effective_entry_date=day,
        )
    }
    entries = NachaEntry.objects.filter(
        file__delivered_at__isnull=False, file__effective_entry_date=day, refused_reason=""
    ).select_related("payment")
    for entry in entries:
        payment = entry.payment
        # A micro-entry's row is its cost's account (the house's by default): a merchant's
        # figures never show its validations' amounts.
        figures = row(ledger_account(payment), payment.currency)
        figures.expected += payment.amount
        if (entry.file_id, entry.batch_number, entry.sec_code) in fully:
            figures.settled += payment.amount
    returns = StatementMatch.objects.filter(
        kind=MatchKind.RETURN, line__as_of_date=day, line__match_status=MatchStatus.MATCHED
    ).select_related("payment")
    for match in returns:
        payment = match.payment
        row(ledger_account(payment), payment.currency).returned += match.expected_amount
    for variance in BooksVariance.objects.filter(day=day, status=VarianceStatus.OPEN):
        for merchant in variance.merchant_ids or [None]:
            figures = row(merchant, variance.currency)
            figures.variances += 1
            figures.variance_ids.append(variance.pk)
    result = sorted(
        rows.values(), key=lambda f: (f.merchant_id is None, f.merchant_id or "", f.currency)
    )
    if merchant_id is not None:
        result = [f for f in result if f.merchant_id == merchant_id]
    return result
