"""Dishonored and contested returns: a history with answers out of order and redelivered
passes, and each corruption of its ledger fails the one check that names it."""

from decimal import Decimal

import pytest

from payments.models import EventKind, EventOutcome, LedgerEntry, PaymentEvent, ReturnDishonor
from tests.chaos.histories import check, deliver, failed_checks, new_payment, redeliver

pytestmark = pytest.mark.django_db


def _returned(history: dict, merchant: str, amount: str):
    payment = new_payment(merchant, amount)
    deliver(history, payment, "submitted")
    deliver(history, payment, "settled")
    deliver(history, payment, "returned", reason_code="R01")
    return payment


@pytest.fixture
def dishonors(history):
    """The clean history, plus: a return dishonored (its answer redelivered, and resent under
    a new id); one whose contest overtook its dishonor; one dishonored then contested."""
    dishonored = _returned(history, "m-4", "6.00")
    first = deliver(history, dishonored, "return_dishonored", reason_code="R61")
    redeliver(history, dishonored, "return_dishonored", first, reason_code="R61")
    deliver(history, dishonored, "return_dishonored", reason_code="R61")  # stale: new id

    contest_first = _returned(history, "m-4", "2.50")
    deliver(history, contest_first, "dishonor_contested", reason_code="R76")
    deliver(history, contest_first, "return_dishonored", reason_code="R69")

    in_order = _returned(history, "m-5", "1.25")
    deliver(history, in_order, "return_dishonored", reason_code="R67")
    contest = deliver(history, in_order, "dishonor_contested", reason_code="R75")
    redeliver(history, in_order, "dishonor_contested", contest, reason_code="R75")

    for payment in (dishonored, contest_first, in_order):
        history["stats"]["charges"][str(payment.idempotency_key)] = 1
        history["stats"]["charges_by_payment"][str(payment.id)] = 1
    history["payments"].update(
        {"dishonored": dishonored, "contest_first": contest_first, "in_order": in_order}
    )
    return history


def test_answers_out_of_order_and_redelivered_pass_every_check(dishonors):
    report = check(dishonors)

    assert report.ok, report.render()
    assert report.checked["dishonors_booked"] == {
        "payments with answers": 3,
        "dishonored": 3,
        "contested": 2,
        "entries": 5,
    }


def test_a_dishonor_without_its_re_credit_fails_only_dishonors_booked(dishonors):
    payment = dishonors["payments"]["dishonored"]
    LedgerEntry.objects.filter(payment=payment, kind="recredit").delete()

    report = check(dishonors)

    assert failed_checks(report) == {"dishonors_booked"}
    details = [v.detail for v in report.violations_of("dishonors_booked")]
    assert any("without their ledger entry" in d for d in details), details
    assert any("ledger net differs from what their payments' histories say" in d for d in details)


def test_a_contest_that_overtook_its_dishonor_without_the_reversal_fails(dishonors):
    payment = dishonors["payments"]["contest_first"]
    LedgerEntry.objects.filter(payment=payment, kind="recredit_reversal").delete()

    report = check(dishonors)

    assert failed_checks(report) == {"dishonors_booked"}
    [missing] = [v for v in report.violations_of("dishonors_booked") if "without their" in v.detail]
    assert missing.ids == (f"{payment.id} (recredit_reversal)",)


def test_a_re_credit_the_log_does_not_call_for_fails_only_dishonors_booked(dishonors):
    payment = dishonors["payments"]["settled_returned"]  # returned, never dishonored
    LedgerEntry.objects.create(
        payment=payment, merchant_id=payment.merchant_id, kind="recredit", amount=payment.amount
    )

    report = check(dishonors)

    assert failed_checks(report) == {"dishonors_booked"}
    details = [v.detail for v in report.violations_of("dishonors_booked")]
    assert any("does not call for" in d for d in details), details


def test_a_re_credit_for_another_amount_fails_only_dishonors_booked(dishonors):
    payment = dishonors["payments"]["dishonored"]
    LedgerEntry.objects.filter(payment=payment, kind="recredit").update(amount=Decimal("1.00"))

    report = check(dishonors)

    assert failed_checks(report) == {"dishonors_booked"}
    details = [v.detail for v in report.violations_of("dishonors_booked")]
    assert any("for another amount or merchant" in d for d in details), details


def test_a_dishonor_record_that_disagrees_with_the_log_fails_only_dishonors_booked(dishonors):
    payment = dishonors["payments"]["in_order"]
    ReturnDishonor.objects.filter(payment=payment).update(contested_event_id="")

    report = check(dishonors)

    assert failed_checks(report) == {"dishonors_booked"}
    details = [v.detail for v in report.violations_of("dishonors_booked")]
    assert any("disagree with the log" in d for d in details), details


def test_an_answer_marked_stale_that_was_never_recorded_fails_transitions_valid(dishonors):
    payment = dishonors["payments"]["in_order"]
    # The contest's recorded row relabelled stale: as if the answer had been dropped.
    PaymentEvent.objects.filter(
        payment=payment,
        kind=EventKind.PROCESSOR_EVENT,
        event_type="dishonor_contested",
        outcome=EventOutcome.RECORDED,
    ).update(outcome=EventOutcome.STALE)

    report = check(dishonors)

    assert "transitions_valid" in failed_checks(report)
    details = [v.detail for v in report.violations_of("transitions_valid")]
    assert any("marked stale that was never recorded before" in d for d in details), details


@pytest.mark.parametrize("booked_on_house, problems", [(True, 0), (False, 2)])
def test_a_micro_entry_dishonored_is_booked_on_the_house_account(booked_on_house, problems):
    # An account validation's offsetting debit, returned, its return dishonored: booked on the
    # account MICRO_ENTRY_COST names (the house's by default), not its merchant's.
    from chaos.invariants.dishonors import check_dishonors
    from chaos.invariants.report import Report
    from payments.models import HOUSE_ACCOUNT, PaymentPurpose, PaymentState
    from tests.factories import PaymentEventFactory, PaymentFactory, account_validated

    payment = PaymentFactory(
        merchant_id="m-4",
        amount=Decimal("1.80"),
        purpose=PaymentPurpose.MICRO_ENTRY,
        account_validation=account_validated("tok_micro_dishonor_01", "m-4"),
        state=PaymentState.RETURNED,
    )
    PaymentEventFactory(
        payment=payment,
        kind=EventKind.PROCESSOR_EVENT,
        outcome=EventOutcome.RECORDED,
        event_type="return_dishonored",
    )
    LedgerEntry.objects.create(
        payment=payment,
        merchant_id=HOUSE_ACCOUNT if booked_on_house else payment.merchant_id,
        kind="recredit",
        amount=payment.amount,
    )

    def booking_problems() -> list[str]:
        # The dishonor record (with its return) is not made here: only the booking is checked.
        report = Report()
        check_dishonors(report)
        return [
            v.detail
            for v in report.violations_of("dishonors_booked")
            if "another amount or merchant" in v.detail or "ledger net differs" in v.detail
        ]

    assert len(booking_problems()) == problems
