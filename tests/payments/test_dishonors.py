"""Dishonored and contested returns: each answer moves money exactly once, in any order."""

import itertools
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from payments.exceptions import EventConflict, InvalidTransition
from payments.models import (
    EventOutcome,
    LedgerEntry,
    MerchantReturnDay,
    Payment,
    PaymentEvent,
    PaymentState,
    ReturnDishonor,
)
from payments.selectors import merchant_balance
from payments.services import payment_apply_event
from payments.services.dishonors import dishonor_ledger_kinds
from tests.factories import PaymentFactory, processor_event
from tests.waiting import race
from triage.models import Alert

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("event_write_path")]

RETURNED_AT = datetime(2026, 11, 2, 15, 0, tzinfo=UTC)
_merchants = itertools.count()


def returned_payment(code: str = "R01", merchant: str = "m-1", amount: str = "40.00") -> Payment:
    """A payment settled, then returned after settlement (credit, then reversal)."""
    payment = PaymentFactory(
        state=PaymentState.SUBMITTED, merchant_id=merchant, amount=Decimal(amount)
    )
    payment_apply_event(event=processor_event(payment, "settled"))
    payment_apply_event(
        event=processor_event(payment, "returned", reason_code=code, timestamp=RETURNED_AT)
    )
    payment.refresh_from_db()
    assert payment.state == PaymentState.RETURNED
    return payment


def dishonored(payment: Payment, **fields):
    return processor_event(payment, "return_dishonored", **{"reason_code": "R61", **fields})


def contested(payment: Payment, **fields):
    return processor_event(payment, "dishonor_contested", **{"reason_code": "R76", **fields})


def kinds(payment: Payment) -> list[str]:
    return sorted(LedgerEntry.objects.filter(payment=payment).values_list("kind", flat=True))


def net(payment: Payment) -> Decimal:
    return sum(
        LedgerEntry.objects.filter(payment=payment).values_list("amount", flat=True), Decimal(0)
    )


def counts(merchant: str) -> tuple[int, int, int]:
    day = MerchantReturnDay.objects.get(merchant_id=merchant)
    return day.debits, day.returns, day.unauthorized_returns


# --- return_dishonored ---------------------------------------------------------------------


def test_a_dishonored_return_is_re_credited_once_and_leaves_the_return_rates():
    payment = returned_payment("R10")
    assert counts("m-1") == (1, 1, 1)

    result = payment_apply_event(event=dishonored(payment))

    assert result.outcome == EventOutcome.RECORDED
    assert (result.from_state, result.to_state) == ("returned", "returned")
    assert kinds(payment) == ["credit", "recredit", "reversal"]
    recredit = LedgerEntry.objects.get(payment=payment, kind="recredit")
    assert (recredit.amount, recredit.merchant_id) == (payment.amount, payment.merchant_id)
    assert net(payment) == payment.amount  # back to the settled amount
    assert counts("m-1") == (1, 0, 0)
    dishonor = ReturnDishonor.objects.get(payment=payment)
    assert dishonor.dishonored_event_id and not dishonor.contested_event_id
    assert dishonor.outcome == "dishonored: the return is undone"
    payment.refresh_from_db()
    assert payment.state == PaymentState.RETURNED  # a fact on the return, not a transition


def test_the_balance_counts_the_re_credit_in_the_net():
    payment = returned_payment(merchant="m-bal")
    payment_apply_event(event=dishonored(payment))

    [balance] = merchant_balance(merchant_id="m-bal")["balances"]

    assert balance["net"] == "40.00"
    assert balance["recredits"] == "40.00"


# --- dishonor_contested --------------------------------------------------------------------


def test_a_contest_after_the_dishonor_reverses_the_re_credit_once_and_the_return_counts_again():
    payment = returned_payment("R10")
    payment_apply_event(event=dishonored(payment))

    result = payment_apply_event(event=contested(payment))

    assert result.outcome == EventOutcome.RECORDED
    assert kinds(payment) == ["credit", "recredit", "recredit_reversal", "reversal"]
    assert LedgerEntry.objects.get(payment=payment, kind="recredit_reversal").amount == (
        -payment.amount
    )
    assert net(payment) == 0  # the return stands
    assert counts("m-1") == (1, 1, 1)
    dishonor = ReturnDishonor.objects.get(payment=payment)
    assert dishonor.contest_reason_code == "R76"
    assert dishonor.outcome == "contested: the return stands"


def test_a_contest_before_the_dishonor_writes_nothing_until_the_dishonor_then_both():
    payment = returned_payment("R10")

    first = payment_apply_event(event=contested(payment))

    assert first.outcome == EventOutcome.RECORDED
    assert kinds(payment) == ["credit", "reversal"]
    assert counts("m-1") == (1, 1, 1)

    payment_apply_event(event=dishonored(payment))

    assert kinds(payment) == ["credit", "recredit", "recredit_reversal", "reversal"]
    assert net(payment) == 0
    assert counts("m-1") == (1, 1, 1)


def test_a_contest_raises_a_medium_alert_that_the_return_stands(
    django_capture_on_commit_callbacks,
):
    payment = returned_payment()
    payment_apply_event(event=dishonored(payment))
    with django_capture_on_commit_callbacks(execute=True):
        payment_apply_event(event=contested(payment))

    alert = Alert.objects.get(key=f"payment.dishonor_contested:{payment.id}")
    assert alert.severity == "medium"
    assert "the return stands" in alert.summary
    assert "re-credit is reversed" in alert.summary


# --- repeats, refusals, flags --------------------------------------------------------------


def test_a_repeated_answer_is_a_duplicate_a_new_id_stale_another_payload_a_conflict():
    payment = returned_payment()
    event = dishonored(payment)
    payment_apply_event(event=event)

    again = payment_apply_event(event=event)
    new_id = payment_apply_event(event=dishonored(payment))

    assert again.outcome == EventOutcome.DUPLICATE
    assert new_id.outcome == EventOutcome.STALE
    with pytest.raises(EventConflict):
        payment_apply_event(
            event=dishonored(
                payment, processor_event_id=event.processor_event_id, timestamp=timezone.now()
            )
        )
    assert kinds(payment) == ["credit", "recredit", "reversal"]
    assert counts("m-1") == (1, 0, 0)


@pytest.mark.parametrize("state", ["submitted", "confirmed", "failed"])
@pytest.mark.parametrize("event_type", ["return_dishonored", "dishonor_contested"])
def test_an_answer_for_a_payment_with_no_return_after_settlement_is_refused(state, event_type):
    payment = PaymentFactory(state=state)

    with pytest.raises(InvalidTransition, match="no return after settlement to dishonor"):
        payment_apply_event(event=processor_event(payment, event_type, reason_code="R61"))

    assert not LedgerEntry.objects.filter(payment=payment).exists()
    assert not PaymentEvent.objects.filter(payment=payment).exists()
    assert not ReturnDishonor.objects.exists()


def test_an_answer_for_another_amount_is_a_mismatch_and_writes_nothing():
    payment = returned_payment()

    with pytest.raises(Exception, match="reports 1.00"):
        payment_apply_event(event=dishonored(payment, amount=Decimal("1.00")))

    assert kinds(payment) == ["credit", "reversal"]


def test_an_answer_we_never_asked_for_is_booked_flagged_and_alerted(
    django_capture_on_commit_callbacks,
):
    payment = returned_payment()
    with django_capture_on_commit_callbacks(execute=True):
        payment_apply_event(event=dishonored(payment, reason_code="R99"))

    dishonor = ReturnDishonor.objects.get(payment=payment)
    assert dishonor.unrequested and dishonor.unknown_code
    assert kinds(payment) == ["credit", "recredit", "reversal"]
    keys = set(Alert.objects.values_list("key", flat=True))
    assert {
        f"payment.dishonor_unrequested:{payment.id}",
        f"payment.dishonor_unknown_code:{payment.id}",
    } <= keys


def test_the_ledger_refuses_a_second_re_credit_and_entries_of_the_wrong_sign():
    payment = returned_payment()
    payment_apply_event(event=dishonored(payment))
    other = returned_payment(merchant="m-sign")
    entry = {"merchant_id": payment.merchant_id, "currency": "USD"}

    with pytest.raises(IntegrityError, match="ledger_one_entry_per_kind"), transaction.atomic():
        LedgerEntry.objects.create(payment=payment, kind="recredit", amount=payment.amount, **entry)
    with pytest.raises(IntegrityError, match="ledger_recredit_positive"), transaction.atomic():
        LedgerEntry.objects.create(payment=other, kind="recredit", amount=Decimal("-1"), **entry)
    with pytest.raises(IntegrityError, match="recredit_reversal_negative"), transaction.atomic():
        LedgerEntry.objects.create(
            payment=other, kind="recredit_reversal", amount=Decimal("1"), **entry
        )


# --- any order, any repeats: the ledger is what the history says --------------------------

ANSWERS = ("return_dishonored", "dishonor_contested")


def _expected_kinds(delivered: set[str]) -> list[str]:
    return sorted(
        {"credit", "reversal"}
        | dishonor_ledger_kinds(
            reversed_=True,
            dishonored="return_dishonored" in delivered,
            contested="dishonor_contested" in delivered,
        )
    )


def test_every_order_of_both_answers_leaves_the_same_ledger_and_counters():
    results = {}
    for order in itertools.permutations(ANSWERS):
        merchant = f"m-order-{next(_merchants)}"
        payment = returned_payment("R10", merchant=merchant)
        for event_type in order:
            payment_apply_event(event=processor_event(payment, event_type, reason_code="R61"))
        results[order] = (tuple(kinds(payment)), net(payment), counts(merchant))

    assert set(results.values()) == {
        (("credit", "recredit", "recredit_reversal", "reversal"), Decimal(0), (1, 1, 1))
    }


# Each step: which answer, and whether it is a new event or a redelivery of an earlier one.
_steps = st.lists(
    st.tuples(st.sampled_from(ANSWERS), st.sampled_from(("new", "redeliver"))),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=_steps)
def test_any_sequence_of_answers_and_redeliveries_leaves_the_ledger_its_history_says(steps):
    merchant = f"m-prop-{next(_merchants)}"
    payment = returned_payment("R10", merchant=merchant)
    sent: dict[str, list] = {}
    for event_type, how in steps:
        earlier = sent.get(event_type)
        if how == "redeliver" and earlier:
            event = earlier[0]
        else:
            event = processor_event(payment, event_type, reason_code="R61")
            sent.setdefault(event_type, []).append(event)
        payment_apply_event(event=event)

    recorded = set(
        PaymentEvent.objects.filter(
            payment=payment, outcome=EventOutcome.RECORDED, event_type__in=ANSWERS
        ).values_list("event_type", flat=True)
    )
    assert recorded == set(sent)  # each answer recorded once, whatever the repeats
    assert kinds(payment) == _expected_kinds(recorded)
    expected_net = payment.amount if recorded == {"return_dishonored"} else Decimal(0)
    assert net(payment) == expected_net
    returns = 0 if recorded == {"return_dishonored"} else 1
    assert counts(merchant) == (1, returns, returns)


# --- two threads racing on PostgreSQL ------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(2))
def test_two_threads_racing_a_dishonor_and_its_duplicate_write_one_re_credit(attempt):
    payment = returned_payment()
    event = dishonored(payment)

    results = race(
        lambda: payment_apply_event(event=event), lambda: payment_apply_event(event=event)
    )

    assert sorted(r.outcome for r in results) == ["duplicate", "recorded"]
    assert kinds(payment) == ["credit", "recredit", "reversal"]
    assert counts("m-1") == (1, 0, 0)


@pytest.mark.django_db(transaction=True)
def test_two_threads_racing_two_dishonors_with_different_ids_write_one_re_credit():
    payment = returned_payment()

    results = race(
        lambda: payment_apply_event(event=dishonored(payment)),
        lambda: payment_apply_event(event=dishonored(payment)),
    )

    assert sorted(r.outcome for r in results) == ["recorded", "stale"]
    assert kinds(payment) == ["credit", "recredit", "reversal"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(2))
def test_two_threads_racing_the_dishonor_and_its_contest_leave_the_contested_ledger(attempt):
    payment = returned_payment("R10")

    results = race(
        lambda: payment_apply_event(event=dishonored(payment)),
        lambda: payment_apply_event(event=contested(payment)),
    )

    assert [r.outcome for r in results] == ["recorded", "recorded"]
    assert kinds(payment) == ["credit", "recredit", "recredit_reversal", "reversal"]
    assert net(payment) == 0
    assert counts("m-1") == (1, 1, 1)


def test_the_window_helper_gives_five_banking_days_after_the_return():
    from payments.return_codes import dishonor_deadline

    # Monday 2026-11-02: Tue..Fri are 4, Veterans Day (Wed 11-11) is next week; Mon 11-09 is 5.
    assert dishonor_deadline(RETURNED_AT).date() == (RETURNED_AT + timedelta(days=7)).date()


def test_the_merchants_return_rates_leave_out_a_dishonored_return_and_count_a_contested_one():
    from triage.operations.return_rates import merchant_return_rates

    def rates():
        [row] = merchant_return_rates(merchant_ids=["m-rate"])
        return row.debits, row.returns, row.unauthorized_returns

    payment = returned_payment("R10", merchant="m-rate")
    assert rates() == (1, 1, 1)

    payment_apply_event(event=dishonored(payment))
    assert rates() == (1, 0, 0)

    payment_apply_event(event=contested(payment))
    assert rates() == (1, 1, 1)


_with_return = st.permutations(["returned", *ANSWERS]).flatmap(
    lambda order: st.tuples(
        st.just(order), st.lists(st.sampled_from(["returned", *ANSWERS]), max_size=3)
    )
)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=_with_return)
def test_answers_that_overtake_the_return_are_refused_until_it_is_applied_then_book_once(
    sequence,
):
    """The worker retries a refused event: whatever overtook the return applies after it."""
    order, redeliveries = sequence
    merchant = f"m-early-{next(_merchants)}"
    payment = PaymentFactory(
        state=PaymentState.SUBMITTED, merchant_id=merchant, amount=Decimal("12.00")
    )
    payment_apply_event(event=processor_event(payment, "settled"))
    codes = {"returned": "R01", "return_dishonored": "R61", "dishonor_contested": "R76"}
    events = {t: processor_event(payment, t, reason_code=codes[t]) for t in order}
    retry = []
    for event_type in [*order, *redeliveries]:
        try:
            payment_apply_event(event=events[event_type])
        except InvalidTransition:
            assert event_type in ANSWERS  # only an answer can come too early
            retry.append(events[event_type])
    for event in retry:  # the worker's retry, after the return
        payment_apply_event(event=event)

    assert kinds(payment) == ["credit", "recredit", "recredit_reversal", "reversal"]
    assert net(payment) == 0
    assert counts(merchant) == (1, 1, 0)


def test_the_host_is_told_inside_the_transaction_what_each_answer_booked():
    from payments.signals import payment_dishonor_booked

    booked = []

    def receiver(sender, payment, event, dishonor, entries, **kwargs):
        booked.append((event.event_type, event.outcome, [e.kind for e in entries]))

    payment = returned_payment()
    payment_dishonor_booked.connect(receiver, sender=Payment)
    try:
        event = contested(payment)
        payment_apply_event(event=event)
        payment_apply_event(event=event)  # a duplicate books nothing and says nothing
        payment_apply_event(event=dishonored(payment))
    finally:
        payment_dishonor_booked.disconnect(receiver, sender=Payment)

    assert booked == [
        ("dishonor_contested", "recorded", []),
        ("return_dishonored", "recorded", ["recredit", "recredit_reversal"]),
    ]


def test_a_receiver_that_raises_rolls_the_answer_back():
    from payments.signals import payment_dishonor_booked

    def receiver(**kwargs):
        raise RuntimeError("the host's books are down")

    payment = returned_payment()
    payment_dishonor_booked.connect(receiver, sender=Payment)
    try:
        with pytest.raises(RuntimeError):
            payment_apply_event(event=dishonored(payment))
    finally:
        payment_dishonor_booked.disconnect(receiver, sender=Payment)

    assert kinds(payment) == ["credit", "reversal"]
    assert not ReturnDishonor.objects.filter(payment=payment).exists()
    assert not PaymentEvent.objects.filter(payment=payment, event_type="return_dishonored")
