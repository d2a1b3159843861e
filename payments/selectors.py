"""Reads of payments for the API, the admin and operations."""

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import connection
from django.db.models import Count, Exists, OuterRef, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from payments.banking_days import add_banking_days, available_cutoff
from payments.models import (
    LedgerEntry,
    LedgerEntryKind,
    LedgerEntryStatus,
    NocStatus,
    NotificationOfChange,
    Payment,
    PaymentDirection,
    PaymentPurpose,
    PaymentReturn,
    PaymentState,
    ProcessorAttempt,
)
from payments.processor.backend import get_backend

# Other apps add sections to the payment detail (the queue layer adds its processing errors)
# without payments importing them: each callable takes a payment and returns a dict to merge.
payment_detail_extensions: list[Callable[[Payment], dict]] = []


# What a tenant is told of a processor call that failed: a stable code and a short text. The
# stored error names the processor's host, port and path (and the answer it gave): it is for
# the admin, never for the API.
PROCESSOR_PUBLIC_ERRORS = {
    "processor_timeout": "the processor did not answer in time; retried automatically",
    "processor_unreachable": "the processor could not be reached; retried automatically",
    "processor_busy": "the processor asked us to slow down; retried automatically",
    "processor_unavailable": "the processor did not answer; retried automatically",
    "processor_rejected": "the processor refused the payment",
    "processor_error": "the processor call failed",
}


def processor_attempt_error_code(attempt: ProcessorAttempt) -> str:
    """The public code of a failed attempt, from what kind of failure it was (never its text);
    empty for an accepted one."""
    if not attempt.error and not attempt.error_kind:
        return ""
    if attempt.error_kind == "timeout":
        return "processor_timeout"
    if attempt.error_kind == "connection":
        return "processor_unreachable"
    if attempt.http_status == 429:
        return "processor_busy"
    if attempt.outcome == "retryable" or (attempt.http_status or 0) >= 500:
        return "processor_unavailable"
    if attempt.outcome == "rejected":
        return "processor_rejected"
    return "processor_error"


def payment_attempts_public(payment: Payment) -> list[dict]:
    """The payment's processor attempts as a tenant sees them: the stored error replaced by its
    public code and text."""
    rows = []
    for attempt in payment.attempts.all():
        code = processor_attempt_error_code(attempt)
        rows.append(
            {
                "attempt_number": attempt.attempt_number,
                "operation": attempt.operation,
                "outcome": attempt.outcome,
                "http_status": attempt.http_status,
                "error_kind": attempt.error_kind,
                "error_code": code,
                "error": PROCESSOR_PUBLIC_ERRORS[code] if code else "",
                "latency_ms": attempt.latency_ms,
                "started_at": attempt.started_at,
            }
        )
    return rows


def payment_errors_public(payment: Payment) -> list[dict]:
    """The processor's share of a payment's ``errors``: one entry per failed attempt."""
    errors = []
    for attempt in payment.attempts.all():
        code = processor_attempt_error_code(attempt)
        if code:
            errors.append(
                {
                    "source": "processor",
                    "code": code,
                    "message": PROCESSOR_PUBLIC_ERRORS[code],
                    "attempt": attempt.attempt_number,
                    "attempt_number": attempt.attempt_number,
                    "at": attempt.started_at.isoformat(),
                }
            )
    return errors


def payment_get(*, payment_id) -> Payment:
    return Payment.objects.prefetch_related("events", "attempts", "ledger_entries").get(
        pk=payment_id
    )


def payment_refunds(payment: Payment) -> list[Payment]:
    """A debit's refunds, oldest first."""
    return list(payment.refunds.select_related("double_loss").order_by("created_at", "id"))


def payment_reinitiation_chain(payment: Payment) -> dict | None:
    """The reinitiation chain ``payment`` belongs to: its original entry, then the
    reinitiations in order, each with its state and return code; None for a payment that is
    neither reinitiated nor a reinitiation. One query for the chain, one for its returns."""
    original_id = payment.reinitiation_of_id or payment.id
    entries = list(Payment.objects.filter(pk=original_id).only("id", "state", "created_at")) + list(
        Payment.objects.filter(reinitiation_of_id=original_id)
        .order_by("reinitiation_number")
        .only("id", "state", "created_at", "reinitiation_number")
    )
    if len(entries) < 2:
        return None
    codes = dict(
        PaymentReturn.objects.filter(payment__in=[e.id for e in entries]).values_list(
            "payment_id", "reason_code"
        )
    )
    return {
        "original_id": original_id,
        "reinitiation_number": payment.reinitiation_number,
        "authorization_reference": payment.authorization_reference,
        "chain": [
            {
                "id": entry.id,
                "reinitiation_number": (
                    None if entry.id == original_id else entry.reinitiation_number
                ),
                "state": entry.state,
                "return_code": codes.get(entry.id, ""),
                "created_at": entry.created_at,
            }
            for entry in entries
        ],
    }


def merchant_balance(*, merchant_id: str) -> dict:
    """The merchant's ledger per currency: credits, reversals (returns after settlement, as a
    positive total), re-credits of dishonored returns (less contested ones), the net balance,
    and the confirmed and returned debits to compare (collected payments only: a refund or a
    payout, money out, is counted in the money-out figures, never here).

    ``balance`` is the net balance and ``confirmed_total`` the payments that are confirmed now
    (not returned): for a sound ledger the two differ only by ``recredits``, the dishonored
    returns whose payments stay returned.
    """
    ledger: dict[str, dict] = {}
    for row in (
        LedgerEntry.objects.filter(merchant_id=merchant_id)
        .values("currency", "kind")
        .annotate(total=Sum("amount"), entries=Count("id"))
        .order_by()
    ):
        ledger.setdefault(row["currency"], {})[row["kind"]] = row
    payments: dict[str, dict] = {}
    for row in (
        # Collected debits only: a refund or payout is money out, never a payment collected.
        Payment.objects.filter(
            merchant_id=merchant_id,
            direction=PaymentDirection.DEBIT,
            purpose=PaymentPurpose.COLLECTION,  # never a validation's offsetting debit
            state__in=(PaymentState.CONFIRMED, PaymentState.RETURNED),
        )
        .values("currency", "state")
        .annotate(total=Sum("amount"), n=Count("id"))
        .order_by()
    ):
        payments.setdefault(row["currency"], {})[row["state"]] = row
    zero = Decimal("0")
    balances = []
    for currency in sorted(ledger):
        kinds = ledger[currency]
        credit = kinds.get(LedgerEntryKind.CREDIT, {})
        reversal = kinds.get(LedgerEntryKind.REVERSAL, {})
        credits = credit.get("total") or zero
        reversals = -(reversal.get("total") or zero)
        # Dishonored returns: re-credits, less those a contest reversed again.
        dishonor_kinds = (LedgerEntryKind.RECREDIT, LedgerEntryKind.RECREDIT_REVERSAL)
        recredits = sum((kinds.get(k, {}).get("total") or zero for k in dishonor_kinds), zero)
        states = payments.get(currency, {})
        confirmed = states.get(PaymentState.CONFIRMED, {})
        returned = states.get(PaymentState.RETURNED, {})
        net = credits - reversals + recredits
        balances.append(
            {
                "currency": currency,
                "credits": cents_text(credits),
                "reversals": cents_text(reversals),
                "recredits": cents_text(recredits),
                "net": cents_text(net),
                "confirmed_count": confirmed.get("n", 0),
                "returned_count": returned.get("n", 0),
                "balance": cents_text(net),
                "entries": sum(row.get("entries", 0) for row in kinds.values()),
                "confirmed_total": cents_text(confirmed.get("total") or zero),
                "returned_total": cents_text(returned.get("total") or zero),
            }
        )
    figures = merchant_money_figures(merchant_id=merchant_id)
    for balance in balances:  # the same entries' currencies
        balance.update(figures[balance["currency"]])
    return {"merchant_id": merchant_id, "balances": balances}


def merchant_money_figures(*, merchant_id: str, now: datetime | None = None) -> dict[str, dict]:
    """Per currency, the balances a merchant can trust, each from its ledger entries (the first
    version's words; ``merchant_balances`` has the latest's):

    - ``pending``: every entry whose money has not failed to move (pending and posted);
    - ``posted``: the entries whose money has moved;
    - ``available``: what may be paid out now: the posted entries of each debit whose credit
      is past the return reserve (``AVAILABLE_AFTER_BANKING_DAYS`` after the settled event's
      timestamp, its ``posted_at``; a credit booked before that was kept, after its booking: the
      credit, and its reversal, re-credit and re-credit reversal if any; a
      debit inside the reserve adds nothing, nor does its return take anything), less money
      out, pending or posted (refunds, payouts), plus money out that came back and recoveries
      recovered. It may be negative (a return after a payout): shown as it is;
    - ``money_out``: refunds and payouts not failed, less those that came back.
    """
    zero = Decimal("0")
    figures = {}
    for currency, row in _ledger_sums(merchant_id, now).items():
        figures[currency] = {
            "pending": cents_text(row["live"] or zero),
            "posted": cents_text(row["posted"] or zero),
            "available": cents_text(_available(row)),
            "money_out": cents_text(-(row["money_out"] or zero) - (row["money_back"] or zero)),
        }
    return figures


def merchant_balances(*, merchant_id: str, now: datetime | None = None) -> dict:
    """The merchant's balance per currency in the words of Stripe and Modern Treasury, each
    figure from its ledger entries (what each means is ``BalanceOutputSerializer``'s help text,
    the one definition): ``pending`` (money out in flight), ``posted`` (settled), ``available``
    (as ``merchant_money_figures``), ``reserved`` (settled debits inside the return reserve)
    and ``owed`` (double losses not recovered). For a sound ledger ``available + reserved ==
    posted + pending``: what has settled or is leaving is either free or held."""
    zero = Decimal("0")
    balances = [
        {
            "currency": currency,
            "pending": cents_text(row["in_flight"] or zero),
            "posted": cents_text(row["posted"] or zero),
            "available": cents_text(_available(row)),
            "reserved": cents_text(row["reserved"] or zero),
            "owed": cents_text(row["owed"] or zero),
        }
        for currency, row in sorted(_ledger_sums(merchant_id, now).items())
    ]
    return {"merchant_id": merchant_id, "balances": balances}


def _ledger_sums(merchant_id: str, now: datetime | None) -> dict[str, dict]:
    """Per currency, the sums every balance figure is made of, in one query."""
    from payments import conf as payments_conf

    cutoff = available_cutoff(now or timezone.now(), payments_conf.AVAILABLE_AFTER_BANKING_DAYS)
    live = ~Q(status=LedgerEntryStatus.ARCHIVED)
    posted = Q(status=LedgerEntryStatus.POSTED)
    owed = Q(status=LedgerEntryStatus.PENDING, kind=LedgerEntryKind.RECOVERY_OWED)
    out_kinds = (LedgerEntryKind.REFUND, LedgerEntryKind.PAYOUT)
    back_kinds = (LedgerEntryKind.REFUND_RETURN, LedgerEntryKind.PAYOUT_RETURN)
    # Micro-entry credits are money out of the account that funds them (MICRO_ENTRY_COST) for
    # what is available, though no refund or payout (``money_out``).
    micro_kinds = (LedgerEntryKind.MICRO_ENTRY, LedgerEntryKind.MICRO_ENTRY_RETURN)
    money_out_side = Q(
        kind__in=(*out_kinds, *back_kinds, *micro_kinds, LedgerEntryKind.RECOVERY_OWED)
    )
    past_reserve = Exists(
        LedgerEntry.objects.annotate(settled_at=Coalesce("posted_at", "created_at")).filter(
            payment_id=OuterRef("payment_id"),
            kind=LedgerEntryKind.CREDIT,
            settled_at__lte=cutoff,
        )
    )
    rows = (
        LedgerEntry.objects.filter(merchant_id=merchant_id)
        .alias(past_reserve=past_reserve)
        .values("currency")
        .annotate(
            live=Sum("amount", filter=live),
            posted=Sum("amount", filter=posted),
            in_flight=Sum("amount", filter=Q(status=LedgerEntryStatus.PENDING) & ~owed),
            owed=Sum("amount", filter=owed),
            collected=Sum("amount", filter=posted & ~money_out_side & Q(past_reserve=True)),
            reserved=Sum("amount", filter=posted & ~money_out_side & Q(past_reserve=False)),
            out=Sum("amount", filter=live & money_out_side & Q(amount__lt=0)),
            back=Sum("amount", filter=posted & money_out_side & Q(amount__gt=0)),
            money_out=Sum("amount", filter=live & Q(kind__in=out_kinds)),
            money_back=Sum("amount", filter=live & Q(kind__in=back_kinds)),
        )
        .order_by()
    )
    return {row["currency"]: row for row in rows}


def _available(row: dict) -> Decimal:
    zero = Decimal("0")
    return (row["collected"] or zero) + (row["out"] or zero) + (row["back"] or zero)


def cents_text(amount: Decimal) -> str:
    """An amount as the API writes it, ``"12.30"``. SQLite sums decimals as floats, so a total
    that is zero can come back as ``-1.4E-14``: rounded to the cent, and a negative zero written
    as ``"0.00"``, it reads the same on both databases."""
    return f"{amount.quantize(Decimal('0.01')) + 0:.2f}"


# --- Visibility timeout sizing ----------------------------------------------------------------

VISIBILITY_WINDOW_DEFAULT = timedelta(hours=24)
VISIBILITY_FLOOR_DEFAULT = 30


@dataclass(frozen=True)
class LatencySummary:
    count: int
    p50_ms: float | None
    p99_ms: float | None
    window: timedelta


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Linear interpolation between closest ranks (PostgreSQL's ``percentile_cont``)."""
    if not sorted_values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= fraction <= 1:
        raise ValueError(f"percentile fraction must be within 0..1, got {fraction}")
    position = (len(sorted_values) - 1) * fraction
    low = math.floor(position)
    high = math.ceil(position)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def processor_latency_summary(*, window: timedelta = VISIBILITY_WINDOW_DEFAULT) -> LatencySummary:
    """Count, P50 and P99 of processor call latencies (every operation and outcome: the tail of
    timeouts is exactly what the sizing must cover) started within ``window``."""
    since = timezone.now() - window
    if connection.vendor == "postgresql":
        # Computed in the database: the window may hold millions of rows.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms), "
                "percentile_cont(0.99) WITHIN GROUP (ORDER BY latency_ms) "
                f"FROM {ProcessorAttempt._meta.db_table} WHERE started_at >= %s",
                [since],
            )
            count, p50, p99 = cursor.fetchone()
        return LatencySummary(count=count, p50_ms=p50, p99_ms=p99, window=window)
    values = list(
        ProcessorAttempt.objects.filter(started_at__gte=since)
        .order_by("latency_ms")
        .values_list("latency_ms", flat=True)
    )
    if not values:
        return LatencySummary(count=0, p50_ms=None, p99_ms=None, window=window)
    return LatencySummary(
        count=len(values),
        p50_ms=percentile(values, 0.5),
        p99_ms=percentile(values, 0.99),
        window=window,
    )


def visibility_timeout_from(summary: LatencySummary, *, floor: int) -> int:
    """P99 times two, in whole seconds rounded up, never below ``floor``."""
    if floor < 0:
        raise ValueError(f"floor must be zero or more seconds, got {floor}")
    if summary.p99_ms is None:
        return floor
    return max(floor, math.ceil(summary.p99_ms * 2 / 1000))


def recommended_visibility_timeout(
    *, window: timedelta = VISIBILITY_WINDOW_DEFAULT, floor: int = VISIBILITY_FLOOR_DEFAULT
) -> int:
    """The SQS visibility timeout, in seconds, that covers the processor's tail: P99 x 2.

    Not the average and not P90: a message whose processing outlives its visibility timeout is
    handed to a second worker. With no recorded calls in the window, the floor.
    """
    return visibility_timeout_from(processor_latency_summary(window=window), floor=floor)


def nocs_due_count(*, now: datetime | None = None, banking_days: int = 2) -> dict[str, int]:
    """Open NOCs due within the next ``banking_days`` banking days, and those already overdue
    (the dashboard's panel)."""
    now = now or timezone.now()
    horizon = add_banking_days(now, banking_days)
    open_nocs = NotificationOfChange.objects.filter(status=NocStatus.OPEN)
    return {
        "due_soon": open_nocs.filter(deadline__gte=now, deadline__lte=horizon).count(),
        "overdue": open_nocs.filter(deadline__lt=now).count(),
        "open": open_nocs.count(),
    }


def payouts_last4(payouts: Sequence[Payment]) -> dict[str, str]:
    """The destinations' last four digits the backend knows, one read per merchant on the
    page: what a payout's ``destination`` shows beside its token."""
    tokens_by_merchant: dict[str, list[str]] = defaultdict(list)
    for payout in payouts:
        tokens_by_merchant[payout.merchant_id].append(payout.source_token)
    backend = get_backend()
    last4: dict[str, str] = {}
    for merchant_id, tokens in tokens_by_merchant.items():
        last4.update(backend.accounts_last4(tokens=tokens, merchant_id=merchant_id))
    return last4
