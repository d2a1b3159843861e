"""Every balance figure follows from the ledger: random histories of debits, settlements,
returns, refunds and payouts (sent, settled, failed, returned), double losses and their closing,
each run through the services; then the API's figures (both versions' words) are recomputed from
the ledger rows, the available balance a payout reads from the day totals compared with them,
and the live balance from the payments' own states and what is owed from the double losses
(independent accounts of where the money is).
"""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from payments.banking_days import add_banking_days, available_cutoff
from payments.exceptions import MoneyOutRefused
from payments.models import (
    DoubleLoss,
    DoubleLossStatus,
    LedgerEntry,
    LedgerEntryStatus,
    Payment,
    PaymentPurpose,
    PaymentState,
)
from payments.selectors import merchant_balance, merchant_balances, merchant_money_figures
from payments.services import payment_apply_event
from payments.services.available import merchant_available
from payments.services.payouts import payout_create
from payments.services.refunds import double_loss_resolve, refund_create
from tests.factories import PaymentFactory, UserFactory, processor_event

MERCHANT = "m-property"
PAYEE = "tok_payout_acct_0001"
HOLDING = (PaymentState.PENDING, PaymentState.SUBMITTED, PaymentState.CONFIRMED)
ZERO = Decimal("0")

amounts = st.decimals(min_value=Decimal("0.01"), max_value=Decimal("500"), places=2)
step = st.one_of(
    st.tuples(st.just("debit"), amounts),
    st.tuples(st.just("settle"), st.integers(0, 9)),
    st.tuples(st.just("return"), st.integers(0, 9)),
    st.tuples(st.just("refund"), st.integers(0, 9), amounts),
    st.tuples(st.just("refund"), st.integers(0, 9), st.just(Decimal("0.01"))),
    # A refund sent, then its debit returned: a double loss.
    st.tuples(st.just("refund_sent_then_return"), st.integers(0, 9), amounts),
    st.tuples(st.just("submit_refund"), st.integers(0, 19)),
    st.tuples(
        st.sampled_from(["settle_refund", "fail_refund", "return_refund"]), st.integers(0, 19)
    ),
    st.tuples(
        st.just("close_loss"), st.integers(0, 9), st.sampled_from(["recovered", "written_off"])
    ),
    # A payout of the available balance, sent, settled, failed and returned as a refund is.
    st.tuples(st.just("payout"), amounts),
)


def _pick(rows: list, index: int):
    return rows[index % len(rows)] if rows else None


def _run(history: list, debits: list[Payment], refunds: list[Payment]) -> None:
    user = UserFactory()
    for op, *args in history:
        if op == "debit":
            debits.append(PaymentFactory(merchant_id=MERCHANT, state="submitted", amount=args[0]))
        elif op in ("settle", "return") and (debit := _pick(debits, args[0])) is not None:
            debit.refresh_from_db()
            if debit.state == PaymentState.SUBMITTED and op == "settle":
                payment_apply_event(event=processor_event(debit, "settled"))
            elif debit.state == PaymentState.CONFIRMED and op == "return":
                payment_apply_event(event=processor_event(debit, "returned", reason_code="R10"))
        elif op == "refund" and (debit := _pick(debits, args[0])) is not None:
            try:
                refunds.insert(0, refund_create(payment_id=debit.id, amount=args[1]))
            except MoneyOutRefused:
                pass
        elif op == "payout":
            try:
                refunds.insert(
                    0,
                    payout_create(merchant_id=MERCHANT, amount=args[0], destination_token=PAYEE),
                )
            except MoneyOutRefused:
                pass
        elif op == "refund_sent_then_return" and (debit := _pick(debits, args[0])) is not None:
            _run([("refund", 0, args[1]), ("submit_refund", 0), ("return", 0)], [debit], refunds)
        elif op == "submit_refund" and (refund := _pick(refunds, args[0])) is not None:
            Payment.objects.filter(pk=refund.pk, state=PaymentState.PENDING).update(
                state=PaymentState.SUBMITTED, submission_started_at=timezone.now()
            )
        elif op.endswith("_refund") and (refund := _pick(refunds, args[0])) is not None:
            refund.refresh_from_db()
            event_type = {"settle": "settled", "fail": "failed", "return": "returned"}[
                op.split("_")[0]
            ]
            if refund.state == PaymentState.SUBMITTED and event_type != "returned":
                payment_apply_event(event=processor_event(refund, event_type, direction="credit"))
            elif refund.state == PaymentState.CONFIRMED and event_type == "returned":
                payment_apply_event(event=processor_event(refund, "returned", reason_code="R03"))
        elif op == "close_loss":
            open_losses = list(DoubleLoss.objects.filter(status=DoubleLossStatus.OPEN))
            if (loss := _pick(open_losses, args[0])) is not None:
                double_loss_resolve(loss_id=loss.pk, status=args[1], user=user, note="property")


def _recomputed(now) -> dict:
    """The figures from the ledger rows, in Python."""
    from payments import conf as payments_conf

    cutoff = available_cutoff(now, payments_conf.AVAILABLE_AFTER_BANKING_DAYS)
    rows = list(LedgerEntry.objects.filter(merchant_id=MERCHANT).select_related("payment"))
    live = [r for r in rows if r.status != LedgerEntryStatus.ARCHIVED]
    posted = [r for r in rows if r.status == LedgerEntryStatus.POSTED]
    settled_past = {
        r.payment_id for r in rows if r.kind == "credit" and (r.posted_at or r.created_at) <= cutoff
    }
    available = ZERO
    for r in rows:
        if r.payment.purpose == PaymentPurpose.COLLECTION:
            # A debit counts whole once its credit is past the reserve, not at all before.
            if r.payment_id in settled_past and r.status == LedgerEntryStatus.POSTED:
                available += r.amount
        elif r.amount < 0 and r.status != LedgerEntryStatus.ARCHIVED:
            available += r.amount  # money out, held or sent
        elif r.amount > 0 and r.status == LedgerEntryStatus.POSTED:
            available += r.amount  # money out back, a recovery recovered
    out = sum((r.amount for r in live if r.kind in ("refund", "payout")), ZERO)
    back = sum((r.amount for r in live if r.kind in ("refund_return", "payout_return")), ZERO)
    return {
        "pending": f"{sum((r.amount for r in live), ZERO):.2f}",
        "posted": f"{sum((r.amount for r in posted), ZERO):.2f}",
        "available": f"{available:.2f}",
        "money_out": f"{-out - back:.2f}",
    }


def _recomputed_in_words(now) -> dict:
    """Version 2026-12-01's figures from the ledger rows, in Python, each by its definition
    (``CurrencyBalanceOutputSerializer``'s help texts)."""
    from payments import conf as payments_conf

    cutoff = available_cutoff(now, payments_conf.AVAILABLE_AFTER_BANKING_DAYS)
    rows = list(LedgerEntry.objects.filter(merchant_id=MERCHANT).select_related("payment"))
    settled_past = {
        r.payment_id for r in rows if r.kind == "credit" and (r.posted_at or r.created_at) <= cutoff
    }
    pending = [r for r in rows if r.status == LedgerEntryStatus.PENDING]
    posted = [r for r in rows if r.status == LedgerEntryStatus.POSTED]
    reserved = [
        r
        for r in posted
        if r.payment.purpose == PaymentPurpose.COLLECTION and r.payment_id not in settled_past
    ]
    return {
        "currency": "USD",
        "pending": f"{sum((r.amount for r in pending if r.kind != 'recovery_owed'), ZERO):.2f}",
        "posted": f"{sum((r.amount for r in posted), ZERO):.2f}",
        "available": _recomputed(now)["available"],
        "reserved": f"{sum((r.amount for r in reserved), ZERO):.2f}",
        "owed": f"{sum((r.amount for r in pending if r.kind == 'recovery_owed'), ZERO):.2f}",
    }


def _owed_from_losses() -> Decimal:
    """What the merchant is owed, told by the double losses alone."""
    open_losses = DoubleLoss.objects.filter(merchant_id=MERCHANT, status=DoubleLossStatus.OPEN)
    return sum((loss.amount for loss in open_losses), ZERO)


def _pending_from_states() -> Decimal:
    """Where the money is, told by the payments and double losses alone."""
    total = ZERO
    for payment in Payment.objects.filter(merchant_id=MERCHANT):
        if payment.purpose == PaymentPurpose.COLLECTION:
            total += payment.amount if payment.state == PaymentState.CONFIRMED else ZERO
        elif payment.state in (
            PaymentState.PENDING,
            PaymentState.SUBMITTED,
            PaymentState.CONFIRMED,
        ):
            total -= payment.amount
    for loss in DoubleLoss.objects.filter(merchant_id=MERCHANT):
        if loss.status in (DoubleLossStatus.OPEN, DoubleLossStatus.RECOVERED):
            total += loss.amount
    return total


_COUNTS = ("confirmed_count", "confirmed_total", "returned_count", "returned_total")


def _counts_answered() -> dict:
    (usd,) = merchant_balance(merchant_id=MERCHANT)["balances"]
    return {name: usd[name] for name in _COUNTS}


def _counts_from_states() -> dict:
    """The collected debits confirmed and returned, from the payments themselves: a refund,
    whatever its state, is money out and counts in neither."""
    figures = {}
    for state in (PaymentState.CONFIRMED, PaymentState.RETURNED):
        debits = Payment.objects.filter(
            merchant_id=MERCHANT, purpose=PaymentPurpose.COLLECTION, state=state
        )
        figures[f"{state}_count"] = debits.count()
        figures[f"{state}_total"] = f"{sum((d.amount for d in debits), ZERO):.2f}"
    return figures


@pytest.mark.django_db
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    opening=st.lists(amounts, min_size=1, max_size=5),
    history=st.lists(step, min_size=1, max_size=30),
)
def test_every_balance_figure_follows_from_the_entries(opening, history):
    # Settled debits first, so most histories have something to refund and return.
    history = [
        *(("debit", amount) for amount in opening),
        *(("settle", i) for i in range(len(opening))),
        *history,
    ]
    with transaction.atomic():
        _run(history, [], [])
        now = timezone.now()
        for moment in (now, now + timedelta(days=30)):
            answered = merchant_money_figures(merchant_id=MERCHANT, now=moment).get("USD")
            if answered is None:
                assert not LedgerEntry.objects.filter(merchant_id=MERCHANT).exists()
                continue
            assert answered == _recomputed(moment), history
            # The payout's read of the day totals, folded or not, says the same.
            for locked in (False, True):
                kept = merchant_available(
                    merchant_id=MERCHANT, currency="USD", now=moment, locked=locked
                )
                assert kept == Decimal(answered["available"]), history
            (in_words,) = merchant_balances(merchant_id=MERCHANT, now=moment)["balances"]
            assert in_words == _recomputed_in_words(moment), history
            figure = {
                name: Decimal(value) for name, value in in_words.items() if name != "currency"
            }
            # What has settled or is leaving is either free to pay out or held in the reserve;
            # every live entry is settled, in flight or owed.
            assert figure["available"] + figure["reserved"] == figure["posted"] + figure["pending"]
            live = figure["posted"] + figure["pending"] + figure["owed"]
            assert live == Decimal(answered["pending"]), history
            assert figure["owed"] == _owed_from_losses(), history
        if answered is not None:
            assert Decimal(answered["pending"]) == _pending_from_states(), history
            assert _counts_answered() == _counts_from_states(), history
        event(f"double losses: {min(DoubleLoss.objects.count(), 2)}")
        event(f"refunds: {min(Payment.objects.filter(purpose=PaymentPurpose.REFUND).count(), 3)}")
        event(f"payouts: {min(Payment.objects.filter(purpose=PaymentPurpose.PAYOUT).count(), 2)}")
        for debit in Payment.objects.filter(purpose=PaymentPurpose.COLLECTION):
            held = debit.refunds.filter(
                state__in=(PaymentState.PENDING, PaymentState.SUBMITTED, PaymentState.CONFIRMED)
            )
            assert sum((r.amount for r in held), ZERO) <= debit.amount
        transaction.set_rollback(True)


@given(
    now=st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2027, 12, 31)),
    before=st.integers(0, 60 * 24 * 20),
    days=st.integers(0, 10),
)
def test_the_available_cutoff_is_exactly_where_the_reserve_ends(now, before, days):
    now = now.replace(tzinfo=UTC)
    moment = now - timedelta(minutes=before)
    cutoff = available_cutoff(now, days)
    if days == 0:
        assert moment <= cutoff and now + timedelta(days=3650) <= cutoff  # no wait at all
    else:
        assert (moment <= cutoff) == (add_banking_days(moment, days) <= now)


@pytest.mark.parametrize(
    ("total", "written"),
    [
        # SQLite sums decimals as floats: entries that cancel out can total a hair below zero.
        (Decimal("-1.42108547152020E-14"), "0.00"),
        (Decimal("-0.00"), "0.00"),
        (Decimal("2057.55"), "2057.55"),
        (Decimal("-13717"), "-13717.00"),
        (Decimal("0.1") + Decimal("0.2"), "0.30"),
    ],
)
def test_a_figure_is_written_to_the_cent_and_zero_is_never_negative(total, written):
    from payments.selectors import cents_text

    assert cents_text(total) == written
