"""Returns after settlement: every returned payment reversed exactly once, its credit kept, and
each corruption of that failing the one check that names it."""

from decimal import Decimal

import pytest

from payments.models import (
    EventKind,
    EventOutcome,
    LedgerEntry,
    PaymentEvent,
    PaymentState,
)
from tests.chaos.histories import check, failed_checks

pytestmark = pytest.mark.django_db


def test_a_returned_payment_without_its_reversal_fails_only_returns_reversed(history):
    payment = history["payments"]["settled_returned"]
    LedgerEntry.objects.filter(payment=payment, kind="reversal").delete()

    report = check(history)

    assert failed_checks(report) == {"returns_reversed"}
    details = [v.detail for v in report.violations_of("returns_reversed")]
    assert any("returned payment(s) without a reversal" in d for d in details), details
    assert any("ledger net differs from confirmed total - returned total" in d for d in details)
    [missing] = [v for v in report.violations_of("returns_reversed") if "without" in v.detail]
    assert missing.ids == (str(payment.id),)


def test_a_reversal_without_a_return_fails_only_returns_reversed(history):
    payment = history["payments"]["second_merchant"]  # confirmed, never returned
    LedgerEntry.objects.create(
        payment=payment, merchant_id=payment.merchant_id, kind="reversal", amount=-payment.amount
    )

    report = check(history)

    assert failed_checks(report) == {"returns_reversed"}
    [orphan] = [
        v for v in report.violations_of("returns_reversed") if "without a return" in v.detail
    ]
    assert orphan.ids == (f"{payment.id} (confirmed)",)


def test_a_reversal_for_another_amount_fails_only_returns_reversed(history):
    payment = history["payments"]["settled_returned"]
    LedgerEntry.objects.filter(payment=payment, kind="reversal").update(amount=Decimal("-1.00"))

    report = check(history)

    assert failed_checks(report) == {"returns_reversed"}
    details = [v.detail for v in report.violations_of("returns_reversed")]
    assert any("reversal(s) for another amount" in d for d in details), details


def test_a_reversal_booked_to_another_merchant_fails_only_returns_reversed(history):
    payment = history["payments"]["settled_returned"]
    LedgerEntry.objects.filter(payment=payment, kind="reversal").update(merchant_id="m-1")

    report = check(history)

    assert failed_checks(report) == {"returns_reversed"}
    details = [v.detail for v in report.violations_of("returns_reversed")]
    assert any("reversal(s) of another merchant" in d for d in details), details
    assert any("ledger net differs" in d for d in details), details


def test_a_returned_payment_without_its_credit_fails_only_the_ledger_check(history):
    payment = history["payments"]["settled_returned"]
    LedgerEntry.objects.filter(payment=payment, kind="credit").delete()

    report = check(history)

    assert failed_checks(report) == {"ledger_matches_confirmed"}
    details = [v.detail for v in report.violations_of("ledger_matches_confirmed")]
    assert any("confirmed (or returned) payment(s) without a credit" in d for d in details)


def test_a_return_applied_to_an_unsettled_payment_in_the_log_fails_transitions(history):
    payment = history["payments"]["held"]  # pending
    PaymentEvent.objects.create(
        payment=payment,
        kind=EventKind.PROCESSOR_EVENT,
        outcome=EventOutcome.APPLIED,
        event_type="returned",
        processor_event_id="evt_return_from_pending",
        from_state=PaymentState.PENDING,
        to_state=PaymentState.RETURNED,
    )

    report = check(history)

    assert any(
        "pending->returned" in v.ids[0]
        for v in report.violations_of("transitions_valid")
        if "does not allow" in v.detail
    )
