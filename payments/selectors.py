"""Reads of payments for the API, the admin and operations."""

from collections.abc import Callable
from decimal import Decimal

from django.db.models import Count, Sum

from payments.models import LedgerEntry, Payment, PaymentState

# Other apps add sections to the payment detail (the queue layer adds its processing errors)
# without payments importing them: each callable takes a payment and returns a dict to merge.
payment_detail_extensions: list[Callable[[Payment], dict]] = []


def payment_get(*, payment_id) -> Payment:
    return Payment.objects.prefetch_related("events", "attempts", "ledger_entries").get(
        pk=payment_id
    )


def merchant_balance(*, merchant_id: str) -> dict:
    """The merchant's ledger balance per currency, and its confirmed payments total to compare."""
    ledger = (
        LedgerEntry.objects.filter(merchant_id=merchant_id)
        .values("currency")
        .annotate(balance=Sum("amount"), entries=Count("id"))
        .order_by("currency")
    )
    confirmed = dict(
        Payment.objects.filter(merchant_id=merchant_id, state=PaymentState.CONFIRMED)
        .values("currency")
        .annotate(total=Sum("amount"))
        .values_list("currency", "total")
    )
    balances = [
        {
            "currency": row["currency"],
            "balance": f"{row['balance']:.2f}",
            "entries": row["entries"],
            "confirmed_total": f"{confirmed.get(row['currency'], Decimal('0')):.2f}",
        }
        for row in ledger
    ]
    return {"merchant_id": merchant_id, "balances": balances}
