"""One corruption per branch of the invariant checker not tripped elsewhere: each must fail the
check that names it, with that branch's finding, and no other check."""

import io
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from payments.models import (
    DoubleLoss,
    EventKind,
    EventOutcome,
    LedgerEntry,
    Payment,
    PaymentEvent,
    PaymentState,
    ProcessedEvent,
)
from payments.services.refunds import refund_create
from tests.chaos.histories import check, deliver, new_payment
from tests.factories import PaymentFactory

pytestmark = pytest.mark.django_db


def _only(report, check: str) -> list[str]:
    """The details of ``check``'s violations, after asserting no other check failed."""
    assert {v.check for v in report.violations} == {check}, report.render()
    return [v.detail for v in report.violations_of(check)]


def _one(report, check: str, finding: str):
    """The single violation of ``check``, which must name ``finding``; nothing else failed."""
    [detail] = _only(report, check)
    assert finding in detail, detail
    [violation] = report.violations
    return violation


def _settled_id(history) -> str:
    payment = history["payments"]["confirmed"]
    return PaymentEvent.objects.get(
        payment=payment, event_type="settled", outcome=EventOutcome.APPLIED
    ).processor_event_id


# --- charged_at_most_once ----------------------------------------------------------------------


def test_a_payment_charged_under_two_keys_fails(history):
    payment = history["payments"]["confirmed"]
    history["stats"]["charges_by_payment"][str(payment.id)] = 2  # each key once, the payment twice

    violation = _one(check(history), "charged_at_most_once", "under different keys")
    assert violation.ids == (str(payment.id),)


def test_a_canceled_payment_the_processor_charged_fails(history):
    payment = history["payments"]["canceled"]
    history["stats"]["charges"][str(payment.idempotency_key)] = 1

    violation = _one(check(history), "charged_at_most_once", "canceled before origination")
    assert violation.ids == (str(payment.id),)


def test_a_credit_for_a_canceled_payment_fails(history):
    payment = history["payments"]["canceled"]
    LedgerEntry.objects.create(
        payment=payment,
        merchant_id=payment.merchant_id,
        kind="credit",
        amount=payment.amount,
        currency=payment.currency,
    )

    report = check(history)

    assert {v.check for v in report.violations} == {"ledger_matches_confirmed"}, report.render()
    ids = {i for v in report.violations for i in v.ids}
    assert f"{payment.id} (canceled)" in ids


# --- event_applied_at_most_once: the dedup record against the event log -----------------------


def test_an_applied_event_without_its_dedup_record_fails(history):
    settled = _settled_id(history)
    ProcessedEvent.objects.filter(pk=settled).delete()

    violation = _one(check(history), "event_applied_at_most_once", "have no dedup record")
    assert violation.ids == (settled,)


def test_a_dedup_record_disagreeing_with_the_log_fails(history):
    settled = _settled_id(history)
    ProcessedEvent.objects.filter(pk=settled).update(outcome=EventOutcome.STALE)

    violation = _one(check(history), "event_applied_at_most_once", "disagree with the event log")
    assert violation.ids == (settled,)


def test_a_dedup_record_with_no_log_row_fails(history):
    ProcessedEvent.objects.create(
        processor_event_id="evt_recorded_never_logged",
        payment=history["payments"]["held"],
        event_type="settled",
        payload_hash="0" * 64,
        outcome=EventOutcome.APPLIED,
    )

    violation = _one(check(history), "event_applied_at_most_once", "no applied/stale row")
    assert violation.ids == ("evt_recorded_never_logged",)


# --- transitions_valid: the shape of each payment's event log ---------------------------------


def test_a_log_that_does_not_start_with_the_creation_row_fails(history):
    payment = new_payment("m-7", "1.00")
    payment.events.filter(kind=EventKind.CREATED).update(kind=EventKind.SUBMISSION)

    violation = _one(check(history), "transitions_valid", "does not start with the creation row")
    assert violation.ids == (str(payment.id),)


def test_a_payment_created_in_another_state_than_pending_fails(history):
    payment = new_payment("m-7", "1.00")
    payment.events.filter(kind=EventKind.CREATED).update(to_state=PaymentState.SUBMITTED)
    Payment.objects.filter(pk=payment.pk).update(state=PaymentState.SUBMITTED)

    violation = _one(check(history), "transitions_valid", "created in state 'submitted'")
    assert violation.ids == (str(payment.id),)


def test_a_second_creation_row_fails(history):
    payment = history["payments"]["held"]
    PaymentEvent.objects.create(
        payment=payment,
        kind=EventKind.CREATED,
        outcome=EventOutcome.APPLIED,
        to_state=PaymentState.PENDING,
    )

    violation = _one(check(history), "transitions_valid", "a second creation row")
    assert violation.ids == (str(payment.id),)


def test_a_non_applied_row_written_in_another_state_fails(history):
    payment = history["payments"]["confirmed"]
    # A duplicate logged as if the payment were still submitted, after it was confirmed.
    PaymentEvent.objects.create(
        payment=payment,
        kind=EventKind.PROCESSOR_EVENT,
        outcome=EventOutcome.DUPLICATE,
        event_type="settled",
        processor_event_id=_settled_id(history),
        from_state=PaymentState.SUBMITTED,
        to_state=PaymentState.SUBMITTED,
    )

    violation = _one(
        check(history), "transitions_valid", "a duplicate row written in another state"
    )
    assert violation.ids[0].startswith(f"{payment.id} (row ")


def test_a_payment_with_no_event_log_fails(history):
    payment = PaymentFactory(state=PaymentState.PENDING)  # written around payment_create

    violation = _one(check(history), "transitions_valid", "a payment with no event log")
    assert violation.ids == (str(payment.id),)


# --- ledger_matches_confirmed: each credit against its payment --------------------------------


def _credit(history, name: str) -> LedgerEntry:
    return LedgerEntry.objects.get(payment=history["payments"][name], kind="credit")


def test_a_credit_of_another_amount_fails(history):
    credit = _credit(history, "confirmed")
    LedgerEntry.objects.filter(pk=credit.pk).update(amount=credit.amount + 1)

    details = _only(check(history), "ledger_matches_confirmed")
    assert len(details) == 2, details
    assert "1 credit(s) for another amount" in details[0]
    assert "differ from their confirmed total" in details[1]  # the same error, summed


def test_a_credit_to_another_merchant_fails(history):
    credit = _credit(history, "confirmed")
    LedgerEntry.objects.filter(pk=credit.pk).update(merchant_id="m-9")

    report = check(history)
    details = _only(report, "ledger_matches_confirmed")
    assert len(details) == 2, details
    assert "1 credit(s) to another merchant" in details[0]
    [by_merchant] = [v for v in report.violations if "confirmed total" in v.detail]
    assert [i.split(" ")[0] for i in by_merchant.ids] == ["m-1", "m-9"]


def test_a_confirmed_payment_without_a_credit_fails(history):
    payment = history["payments"]["second_merchant"]
    LedgerEntry.objects.filter(payment=payment).delete()

    report = check(history)
    details = _only(report, "ledger_matches_confirmed")
    assert len(details) == 2, details
    assert "1 confirmed (or returned) payment(s) without a credit" in details[0]
    assert report.violations[0].ids == (str(payment.id),)
    assert "differ from their confirmed total" in details[1]


def test_a_payment_credited_twice_fails(history):
    # The unique constraint forbids this; drop it (inside the test's transaction, rolled back
    # with it) to show the checker would catch the double credit the constraint prevents.
    table = LedgerEntry._meta.db_table
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
        [name] = [
            name
            for name, c in constraints.items()
            if c["unique"] and not c["primary_key"] and set(c["columns"]) == {"payment_id", "kind"}
        ]
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no deferred FK checks pending
        cursor.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT "{name}"')
    credit = _credit(history, "confirmed")
    LedgerEntry.objects.create(
        payment=credit.payment,
        merchant_id=credit.merchant_id,
        kind="credit",
        amount=credit.amount,
        currency=credit.currency,
    )

    report = check(history)
    details = _only(report, "ledger_matches_confirmed")
    assert len(details) == 2, details
    assert "1 payment(s) credited more than once" in details[0]
    assert report.violations[0].ids == (str(credit.payment_id),)
    assert "differ from their confirmed total" in details[1]


def test_the_clean_history_has_no_violation_to_begin_with(history):
    assert check(history).ok  # so each failure above is the corruption's, not the fixture's


# --- money out --------------------------------------------------------------------------------


def test_a_credit_key_sent_twice_fails(history):
    refund = history["payments"]["refund"]
    history["stats"]["credits_sent"][str(refund.idempotency_key)] = 2

    violation = _one(check(history), "credits_sent_at_most_once", "sent more than once")
    assert violation.ids == (str(refund.idempotency_key),)


def test_a_canceled_refund_the_processor_sent_fails(history):
    canceled = Payment.objects.get(refund_of=history["payments"]["double_loss"], state="canceled")
    history["stats"]["credits_sent"][str(canceled.idempotency_key)] = 1

    violation = _one(check(history), "credits_sent_at_most_once", "canceled here")
    assert violation.ids == (str(canceled.id),)


def test_refunds_over_what_the_debit_collected_fail(history):
    refund = history["payments"]["refund"]
    Payment.objects.filter(pk=refund.pk).update(amount=Decimal("20.01"))  # of 20.00 collected

    _one(check(history), "refunds_within_collected", "refunded more than they collected")


def test_a_refund_sent_before_the_return_without_its_double_loss_fails(history):
    DoubleLoss.objects.all().delete()

    violation = _one(check(history), "double_losses_flagged", "silently")
    assert str(history["payments"]["sent_refund"].id) in violation.ids[0]


def test_a_double_loss_never_alerted_fails(history):
    from triage.models import Alert

    Alert.objects.filter(key__startswith="payment.double_loss:").update(key="another.alert")

    _one(check(history), "double_losses_flagged", "never alerted")


def test_a_balance_answered_apart_from_its_entries_fails(history, monkeypatch):
    from payments import selectors

    right = selectors.merchant_money_figures

    def off_by_a_cent(**kwargs):
        figures = right(**kwargs)
        for figure in figures.values():
            figure["available"] = f"{Decimal(figure['available']) + Decimal('0.01'):.2f}"
        return figures

    monkeypatch.setattr(selectors, "merchant_money_figures", off_by_a_cent)

    _only(check(history), "balances_match_entries")


def test_day_totals_apart_from_the_entries_fail(history):
    """A payout reads the available balance from the day totals the ledger's triggers keep: a
    total the entries do not make is found, though the API's full read is right."""
    from payments.models import MerchantAvailableTotal

    payout = history["payments"]["payout"]
    MerchantAvailableTotal.objects.create(
        merchant_id=payout.merchant_id, currency=payout.currency, day="2001-01-02", amount="0.01"
    )

    violation = _one(
        check(history, totals_rebuilt=False), "balances_match_entries", "from the day totals differ"
    )
    [found] = violation.ids
    assert found.startswith(f"{payout.merchant_id} {payout.currency} (day totals make"), found


def test_day_totals_rebuilt_after_maintenance_agree_again(history):
    """A maintenance session fires no trigger: what it writes to the ledger is not in the day
    totals until ``manage.py totals_rebuild`` rebuilds them."""
    from django.core.management import call_command

    call_command("totals_rebuild", stdout=io.StringIO())
    payout = history["payments"]["payout"]
    LedgerEntry.objects.filter(payment=payout).update(amount=Decimal("-3.05"))  # of 3.00
    _one(
        check(history, totals_rebuilt=False), "balances_match_entries", "from the day totals differ"
    )

    out = io.StringIO()
    call_command("totals_rebuild", stdout=out)

    assert "available totals rebuilt" in out.getvalue(), out.getvalue()
    report = check(history, totals_rebuilt=False)
    assert report.ok, report.render()


def test_the_limits_day_totals_apart_from_the_payments_fail_until_rebuilt(history):
    """The exposure limits and the fraud rules read the day totals the payments' trigger keeps:
    a total no payments make (written by maintenance, with no trigger firing) is found and
    named, and ``manage.py totals_rebuild`` makes them agree again."""
    from django.core.management import call_command

    from payments.models import MerchantDayTotal

    call_command("totals_rebuild", stdout=io.StringIO())
    debit = history["payments"]["confirmed"]
    MerchantDayTotal.objects.create(
        merchant_id=debit.merchant_id,
        direction="debit",
        currency=debit.currency,
        day="2001-01-02",
        amount="0.01",
        entries=1,
    )

    violation = _one(
        check(history, totals_rebuilt=False),
        "limits_never_exceeded",
        "day total(s) the limits read differ from the payments",
    )
    [found] = violation.ids
    assert found.startswith(f"{debit.merchant_id} debit {debit.currency} 2001-01-02 "), found
    assert "(totals make 0.01 in 1, the payments 0.00 in 0)" in found, found
    assert "manage.py totals_rebuild" in violation.detail

    out = io.StringIO()
    call_command("totals_rebuild", stdout=out)

    assert "day totals rebuilt" in out.getvalue()
    report = check(history, totals_rebuilt=False)
    assert report.ok, report.render()


def test_a_payout_beyond_the_available_balance_fails(history):
    payout = history["payments"]["payout"]
    LedgerEntry.objects.filter(payment=payout).update(amount=Decimal("-3.11"))  # of 3.10

    violation = _one(check(history), "payouts_never_overdraw", "beyond the available balance")
    assert violation.ids[0].startswith(str(payout.id))


def test_a_refund_that_failed_before_its_debits_return_needs_no_double_loss(history):
    # The processor refused the refund (or its credit failed) before the debit came back: no
    # money was out when the return came, so none was lost twice. Seen in a 1,000-payment
    # chaos run: a refund rejected 0.6 s before its debit's R10, which the check took for sent.
    debit = new_payment("m-4", "30.00")
    deliver(history, debit, "submitted")
    deliver(history, debit, "settled")
    refund = refund_create(payment_id=debit.id, amount=Decimal("10.00"))
    Payment.objects.filter(pk=refund.pk).update(submission_started_at=timezone.now())
    deliver(history, refund, "submitted", direction="credit")
    deliver(history, refund, "failed", direction="credit")
    deliver(history, debit, "returned", reason_code="R10")

    assert not DoubleLoss.objects.filter(refund=refund).exists()
    report = check(history)
    assert report.ok, report.render()


def test_a_refund_that_failed_after_its_debits_return_without_its_double_loss_fails(history):
    # The other order: the refund was out when the return came, so its double loss must be
    # there (undone by the failure later), and a history without it is a silent loss.
    sent = history["payments"]["sent_refund"]
    deliver(history, sent, "failed", direction="credit")
    DoubleLoss.objects.filter(refund=sent).delete()

    violation = _one(check(history), "double_losses_flagged", "silently")
    assert str(sent.id) in violation.ids[0]
