"""Refunds of collected debits: the rules, exactly once under concurrency, the ledger, and the
double loss a return of the refunded debit makes (caught, never silent)."""

from decimal import Decimal

import pytest

from payments.exceptions import MoneyOutRefused
from payments.models import (
    DoubleLoss,
    DoubleLossStatus,
    LedgerEntry,
    LedgerEntryKind,
    LedgerEntryStatus,
    OutboxMessage,
    Payment,
    PaymentPurpose,
    PaymentState,
)
from payments.services import payment_apply_event
from payments.services.refunds import refund_create, refundable_amount
from tests.factories import PaymentFactory, processor_event
from tests.waiting import race
from triage.models import Alert

pytestmark = pytest.mark.django_db


def _confirmed(amount="100.00", **fields) -> Payment:
    return PaymentFactory(state=PaymentState.CONFIRMED, amount=Decimal(amount), **fields)


def _entry(payment: Payment, kind: str) -> LedgerEntry:
    return LedgerEntry.objects.get(payment=payment, kind=kind)


def test_a_refund_is_a_credit_to_the_debits_account_held_pending_in_the_ledger():
    debit = _confirmed()
    refund = refund_create(payment_id=debit.id, amount=Decimal("30.00"), reason="damaged")

    assert refund.purpose == PaymentPurpose.REFUND and refund.direction == "credit"
    assert refund.refund_of_id == debit.id and refund.state == PaymentState.PENDING
    assert refund.source_token == debit.source_token and refund.merchant_id == debit.merchant_id
    assert refund.idempotency_key != debit.idempotency_key
    entry = _entry(refund, LedgerEntryKind.REFUND)
    assert (entry.amount, entry.status) == (Decimal("-30.00"), LedgerEntryStatus.PENDING)
    assert OutboxMessage.objects.filter(group_id=str(refund.id)).count() == 1
    assert refundable_amount(debit) == Decimal("70.00")


def test_partial_refunds_add_up_to_the_debit_and_not_a_cent_more():
    debit = _confirmed()
    for amount in ("40.00", "35.00", "25.00"):
        refund_create(payment_id=debit.id, amount=Decimal(amount))
    assert refundable_amount(debit) == 0

    with pytest.raises(MoneyOutRefused) as refused:
        refund_create(payment_id=debit.id, amount=Decimal("0.01"))
    assert refused.value.rule == "refund_exceeds_refundable"
    assert debit.refunds.count() == 3


@pytest.mark.parametrize(
    ("state", "rule"),
    [
        (PaymentState.PENDING, "payment_not_confirmed"),
        (PaymentState.SUBMITTED, "payment_not_confirmed"),
        (PaymentState.FAILED, "payment_not_confirmed"),
        (PaymentState.CANCELED, "payment_not_confirmed"),
        (PaymentState.RETURNED, "payment_returned"),
    ],
)
def test_only_a_confirmed_debit_is_refunded(state, rule):
    debit = PaymentFactory(state=state)
    with pytest.raises(MoneyOutRefused) as refused:
        refund_create(payment_id=debit.id, amount=Decimal("1.00"))
    assert refused.value.rule == rule
    assert not Payment.objects.filter(refund_of=debit).exists()
    assert not LedgerEntry.objects.filter(kind=LedgerEntryKind.REFUND).exists()


def test_a_refund_is_not_refunded():
    refund = refund_create(payment_id=_confirmed().id, amount=Decimal("10.00"))
    Payment.objects.filter(pk=refund.pk).update(state=PaymentState.CONFIRMED)
    with pytest.raises(MoneyOutRefused) as refused:
        refund_create(payment_id=refund.id, amount=Decimal("1.00"))
    assert refused.value.rule == "payment_not_refundable"


def test_a_refund_is_decided_against_the_sum_of_the_refunds_that_hold_and_no_others():
    debit = _confirmed()
    for amount in ("10.00", "20.00", "30.00"):
        refund_create(payment_id=debit.id, amount=Decimal(amount))
    # 20.00 failed and 10.00 canceled free their part again; 30.00 pending still holds.
    Payment.objects.filter(refund_of=debit, amount=Decimal("20.00")).update(
        state=PaymentState.FAILED
    )
    Payment.objects.filter(refund_of=debit, amount=Decimal("10.00")).update(
        state=PaymentState.CANCELED
    )

    with pytest.raises(MoneyOutRefused) as refused:
        refund_create(payment_id=debit.id, amount=Decimal("70.01"))
    last = refund_create(payment_id=debit.id, amount=Decimal("70.00"))

    assert refused.value.rule == "refund_exceeds_refundable"
    assert "70.00 USD still refundable" in str(refused.value)
    assert last.amount == Decimal("70.00") and refundable_amount(debit) == 0


def test_a_failed_refund_frees_its_amount_and_archives_its_entry():
    debit = _confirmed()
    refund = refund_create(payment_id=debit.id, amount=Decimal("100.00"))
    Payment.objects.filter(pk=refund.pk).update(state=PaymentState.SUBMITTED)
    refund.refresh_from_db()

    payment_apply_event(event=processor_event(refund, "failed", direction="credit"))

    assert _entry(refund, LedgerEntryKind.REFUND).status == LedgerEntryStatus.ARCHIVED
    assert refundable_amount(debit) == Decimal("100.00")


def test_a_settled_refund_posts_its_entry_and_a_returned_one_puts_the_money_back_once(
    django_capture_on_commit_callbacks,
):
    debit = _confirmed()
    refund = refund_create(payment_id=debit.id, amount=Decimal("60.00"))
    Payment.objects.filter(pk=refund.pk).update(state=PaymentState.SUBMITTED)
    refund.refresh_from_db()

    payment_apply_event(event=processor_event(refund, "settled", direction="credit"))
    entry = _entry(refund, LedgerEntryKind.REFUND)
    assert entry.status == LedgerEntryStatus.POSTED and entry.posted_at is not None

    from payments.metrics import CREDIT_RETURNS
    from payments.models import MerchantReturnDay

    counted = CREDIT_RETURNS.labels("refund")._value.get()
    returned = processor_event(refund, "returned", reason_code="R03")
    with django_capture_on_commit_callbacks(execute=True):
        payment_apply_event(event=returned)
        payment_apply_event(event=returned)  # a repeat: a duplicate
    # Counted apart: the merchant's return rates are its debits'.
    assert CREDIT_RETURNS.labels("refund")._value.get() == counted + 1
    assert not MerchantReturnDay.objects.filter(returns__gt=0).exists()
    back = LedgerEntry.objects.filter(payment=refund, kind=LedgerEntryKind.REFUND_RETURN)
    assert [e.amount for e in back] == [Decimal("60.00")]
    refund.refresh_from_db()
    assert refund.state == PaymentState.RETURNED
    # A returned refund moved no money to the customer: its amount is refundable again.
    assert refundable_amount(debit) == Decimal("100.00")


def test_an_event_that_calls_a_refund_a_debit_is_a_mismatch_for_a_person():
    from payments.exceptions import DirectionMismatch

    refund = refund_create(payment_id=_confirmed().id, amount=Decimal("5.00"))
    Payment.objects.filter(pk=refund.pk).update(state=PaymentState.SUBMITTED)
    refund.refresh_from_db()
    with pytest.raises(DirectionMismatch, match="reports a debit but payment .* is a credit"):
        payment_apply_event(event=processor_event(refund, "settled", direction="debit"))


def test_a_return_of_the_debit_cancels_a_refund_not_sent_yet(django_capture_on_commit_callbacks):
    debit = _confirmed()
    refund = refund_create(payment_id=debit.id, amount=Decimal("20.00"))

    with django_capture_on_commit_callbacks(execute=True):
        payment_apply_event(event=processor_event(debit, "returned", reason_code="R10"))

    refund.refresh_from_db()
    assert refund.state == PaymentState.CANCELED
    assert _entry(refund, LedgerEntryKind.REFUND).status == LedgerEntryStatus.ARCHIVED
    assert not DoubleLoss.objects.exists()
    assert not Alert.objects.filter(key__startswith="payment.double_loss").exists()


@pytest.mark.parametrize("refund_state", [PaymentState.SUBMITTED, PaymentState.CONFIRMED])
def test_a_return_after_a_refund_was_sent_is_a_double_loss_booked_and_alerted(
    django_capture_on_commit_callbacks, refund_state
):
    debit = _confirmed()
    refund = refund_create(payment_id=debit.id, amount=Decimal("45.00"))
    Payment.objects.filter(pk=refund.pk).update(state=refund_state)
    returned = processor_event(debit, "returned", reason_code="R10")

    with django_capture_on_commit_callbacks(execute=True):
        payment_apply_event(event=returned)
        payment_apply_event(event=returned)  # a repeat: one double loss still

    loss = DoubleLoss.objects.get()
    assert (loss.payment_id, loss.refund_id, loss.amount) == (debit.id, refund.id, Decimal("45.00"))
    assert loss.status == DoubleLossStatus.OPEN and loss.refund_state == refund_state
    owed = _entry(refund, LedgerEntryKind.RECOVERY_OWED)
    assert (owed.amount, owed.status) == (Decimal("45.00"), LedgerEntryStatus.PENDING)
    alert = Alert.objects.get(key=f"payment.double_loss:{refund.id}")
    assert alert.severity == "high" and "has the money twice" in alert.summary


def test_a_refund_in_flight_when_the_debit_returns_is_a_double_loss_undone_if_it_fails():
    debit = _confirmed()
    refund = refund_create(payment_id=debit.id, amount=Decimal("45.00"))
    # The submission has begun: the credit may be at the processor, so it is not canceled.
    Payment.objects.filter(pk=refund.pk).update(submission_started_at="2026-11-02T12:00:00Z")

    payment_apply_event(event=processor_event(debit, "returned", reason_code="R07"))
    refund.refresh_from_db()
    assert refund.state == PaymentState.PENDING
    assert DoubleLoss.objects.get().status == DoubleLossStatus.OPEN

    Payment.objects.filter(pk=refund.pk).update(state=PaymentState.SUBMITTED)
    refund.refresh_from_db()
    payment_apply_event(event=processor_event(refund, "failed", direction="credit"))

    assert DoubleLoss.objects.get().status == DoubleLossStatus.UNDONE
    assert _entry(refund, LedgerEntryKind.RECOVERY_OWED).status == LedgerEntryStatus.ARCHIVED


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_refunds_never_refund_more_than_was_collected():
    debit = _confirmed(amount="100.00")
    amounts = [Decimal("7.00")] * 20  # 140.00 asked for, 100.00 collected

    results = race(*(lambda a=a: refund_create(payment_id=debit.id, amount=a) for a in amounts))

    made = [r for r in results if isinstance(r, Payment)]
    refused = [r for r in results if isinstance(r, MoneyOutRefused)]
    assert len(made) + len(refused) == 20, results
    assert len(made) == 14  # 14 x 7.00 = 98.00; the 15th would be 105.00
    assert {r.rule for r in refused} == {"refund_exceeds_refundable"}
    total = sum(r.amount for r in Payment.objects.filter(refund_of=debit))
    assert total == Decimal("98.00") <= debit.amount
    assert LedgerEntry.objects.filter(kind=LedgerEntryKind.REFUND).count() == 14


def test_a_refund_takes_a_fixed_number_of_statements_however_many_came_before(
    django_assert_num_queries,
):
    debit = _confirmed(amount="100.00", merchant_id="acme")
    for _ in range(3):
        refund_create(payment_id=debit.id, amount=Decimal("10.00"))
    _confirmed(merchant_id="acme")

    # In the caller's transaction (the test's), without a savepoint: the debit's row lock; the
    # merchant's money-out lock (shared) with the read of its exposure limits (none here: no
    # exposure lock, no sum; the fraud rules are off) and of what the debit's refunds hold;
    # then the refund, its ledger entry, its audit row, its submit command and its merchant's
    # event, in one statement.
    with django_assert_num_queries(3):
        refund = refund_create(payment_id=debit.id, amount=Decimal("10.00"))

    assert refundable_amount(debit) == Decimal("60.00")
    assert OutboxMessage.objects.filter(group_id=str(refund.id)).count() == 1


@pytest.mark.django_db(transaction=True)
def test_refunds_of_one_merchant_do_not_wait_on_each_other():
    import threading

    from django.db import connection, transaction

    first, second = _confirmed(merchant_id="acme"), _confirmed(merchant_id="acme")
    made: list = []

    def refund_second() -> None:
        try:
            made.append(refund_create(payment_id=second.id, amount=Decimal("10.00")))
        finally:
            connection.close()

    other = threading.Thread(target=refund_second)
    with transaction.atomic():
        # The first refund holds its debit's row and its share of the merchant's lock until
        # this transaction ends; the second one, of another debit, is made meanwhile.
        refund_create(payment_id=first.id, amount=Decimal("10.00"))
        other.start()
        other.join(10)
        finished_while_held = not other.is_alive()
    other.join(30)

    assert finished_while_held
    assert [r.refund_of_id for r in made] == [second.id]


def test_a_held_refund_waits_for_its_debits_window_and_a_return_cancels_it_unsent(
    module_settings,
):
    from datetime import timedelta

    from django.utils import timezone

    from payments.services.refunds import refunds_release

    module_settings.REFUND_HOLD_BANKING_DAYS = 5
    debit = _confirmed()
    Payment.objects.filter(pk=debit.pk).update(state_changed_at=timezone.now())
    held = refund_create(payment_id=debit.id, amount=Decimal("10.00"))
    other = _confirmed()
    kept = refund_create(payment_id=other.id, amount=Decimal("10.00"))

    held.refresh_from_db()
    assert held.hold_until is not None and held.hold_until > timezone.now()
    assert not OutboxMessage.objects.filter(group_id=str(held.id)).exists()
    assert refunds_release() == 0  # not yet

    payment_apply_event(event=processor_event(debit, "returned", reason_code="R10"))
    later = timezone.now() + timedelta(days=30)
    assert refunds_release(now=later) == 1  # the other one; the canceled one stays unsent
    assert refunds_release(now=later) == 0  # each once
    held.refresh_from_db()
    assert held.state == PaymentState.CANCELED and not DoubleLoss.objects.exists()
    assert not OutboxMessage.objects.filter(group_id=str(held.id)).exists()
    assert OutboxMessage.objects.filter(group_id=str(kept.id)).count() == 1


def test_money_out_and_double_losses_are_counted_once_committed(
    django_capture_on_commit_callbacks,
):
    from payments.metrics import DOUBLE_LOSSES, MONEY_OUT

    made = MONEY_OUT.labels("refund", "pending")._value.get()
    losses = DOUBLE_LOSSES._value.get()
    debit = _confirmed()
    with django_capture_on_commit_callbacks(execute=True):
        refund = refund_create(payment_id=debit.id, amount=Decimal("5.00"))
    Payment.objects.filter(pk=refund.pk).update(state=PaymentState.SUBMITTED)
    with django_capture_on_commit_callbacks(execute=True):
        payment_apply_event(event=processor_event(debit, "returned", reason_code="R10"))

    assert MONEY_OUT.labels("refund", "pending")._value.get() == made + 1
    assert DOUBLE_LOSSES._value.get() == losses + 1


def _ledger(payment: Payment) -> set[tuple]:
    return {
        (e.kind, e.amount, e.status, e.posted_at)
        for e in LedgerEntry.objects.filter(payment=payment)
    }


@pytest.mark.parametrize("order", ["settled_first", "returned_first"])
def test_a_refund_settled_then_returned_ends_returned_whatever_the_delivery_order(
    order, django_capture_on_commit_callbacks
):
    """The processor settled the refund, then the receiving bank returned it. Delivered in that
    order or the other (the settlement's callback lost and pulled back after the return), the
    refund ends ``returned`` with its entry posted and the money back once; before, the late
    settlement was only recorded and the refund stayed ``failed``."""
    from datetime import timedelta

    from payments.models import PaymentReturn
    from payments.selectors import merchant_balance

    debit = _confirmed()
    refund = refund_create(payment_id=debit.id, amount=Decimal("30.00"))
    Payment.objects.filter(pk=refund.pk).update(state=PaymentState.SUBMITTED)
    refund.refresh_from_db()
    settled = processor_event(refund, "settled", direction="credit")
    returned = processor_event(
        refund,
        "returned",
        direction="credit",
        reason_code="R03",
        timestamp=settled.timestamp + timedelta(days=1),
    )
    events = [settled, returned] if order == "settled_first" else [returned, settled]

    with django_capture_on_commit_callbacks(execute=True):
        outcomes = [payment_apply_event(event=event).outcome for event in events]
        # Each delivered again: a duplicate, nothing twice.
        again = [payment_apply_event(event=event).outcome for event in events]

    assert outcomes == ["applied", "applied"] and again == ["duplicate", "duplicate"]
    refund.refresh_from_db()
    assert refund.state == PaymentState.RETURNED
    entries = LedgerEntry.objects.filter(payment=refund)
    assert sorted((e.kind, e.amount, e.status) for e in entries) == [
        (LedgerEntryKind.REFUND, Decimal("-30.00"), LedgerEntryStatus.POSTED),
        (LedgerEntryKind.REFUND_RETURN, Decimal("30.00"), LedgerEntryStatus.POSTED),
    ]
    assert all(e.posted_at is not None for e in entries)
    record = PaymentReturn.objects.get(payment=refund)
    assert record.after_settlement and record.settled_at is not None
    assert refundable_amount(debit) == Decimal("100.00")
    # The refund's entry and its return's, each once: nothing net (the debit's own credit is
    # not in this test's ledger).
    [balance] = merchant_balance(merchant_id=debit.merchant_id)["balances"]
    assert balance["net"] == "0.00"


def test_a_refund_returned_before_its_settlement_came_has_its_money_back_once():
    """Only the return delivered yet: the refund is ``failed``, but a credit is returned only
    after it settled, so its entry is posted and the money is back; a settlement made after
    that return is a conflict, refused, nothing written."""
    from datetime import timedelta

    from payments.exceptions import InvalidTransition

    debit = _confirmed()
    refund = refund_create(payment_id=debit.id, amount=Decimal("30.00"))
    Payment.objects.filter(pk=refund.pk).update(state=PaymentState.SUBMITTED)
    refund.refresh_from_db()
    returned = processor_event(refund, "returned", direction="credit", reason_code="R03")
    payment_apply_event(event=returned)

    refund.refresh_from_db()
    assert refund.state == PaymentState.FAILED
    held = _ledger(refund)
    assert held == {
        (LedgerEntryKind.REFUND, Decimal("-30.00"), LedgerEntryStatus.POSTED, returned.timestamp),
        (
            LedgerEntryKind.REFUND_RETURN,
            Decimal("30.00"),
            LedgerEntryStatus.POSTED,
            returned.timestamp,
        ),
    }
    later = processor_event(
        refund, "settled", direction="credit", timestamp=returned.timestamp + timedelta(days=1)
    )
    with pytest.raises(InvalidTransition):
        payment_apply_event(event=later)
    assert _ledger(refund) == held
