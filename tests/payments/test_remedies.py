"""A returned debit's remedies exclude each other (``payments.services.remedies``): a
reinitiation charges the customer again, a dishonor that stands re-credits the merchant for the
original, and both at once would charge the customer twice. In either order, under a race on
PostgreSQL, and when the processor's answer comes after the reinitiation anyway."""

from datetime import timedelta

import pytest
from django.utils import timezone

from payments.exceptions import DishonorRefused, ReinitiationRefused
from payments.models import (
    AttemptOutcome,
    DishonorRequestStatus,
    LedgerEntry,
    LedgerEntryKind,
    Payment,
    ProcessorAttempt,
    ReturnDishonor,
)
from payments.processor.backends.http import reset_client
from payments.return_codes import dishonor_deadline
from payments.services import payment_apply_event, payment_reinitiate
from payments.services.dishonors import return_dishonor_request, return_dishonor_resend
from tests.factories import UserFactory, processor_event
from tests.payments.test_dishonor_requests import _returned
from tests.waiting import race
from triage.models import Alert

pytestmark = pytest.mark.django_db


@pytest.fixture
def unreachable_processor(module_settings):
    """A processor nothing answers for: every call fails with no answer (retryable)."""
    module_settings.PROCESSOR_BASE_URL = "http://127.0.0.1:9"
    reset_client()
    yield
    reset_client()


def _ask(payment: Payment):
    return return_dishonor_request(
        payment_id=payment.id, reason_code="R61", note="misrouted", user=UserFactory()
    )


# --- reinitiation first ------------------------------------------------------------------------


def test_a_reinitiated_return_is_not_dishonored_and_the_processor_is_not_called(
    unreachable_processor,
):
    payment = _returned(code="R01")
    again = payment_reinitiate(payment_id=payment.id)

    with pytest.raises(DishonorRefused, match=f"reinitiated as payment {again.id}") as refused:
        _ask(payment)

    assert "charge the customer twice" in str(refused.value)
    assert not ReturnDishonor.objects.filter(payment=payment).exists()
    assert not ProcessorAttempt.objects.filter(payment=payment, operation="dishonor").exists()


def test_a_request_the_processor_refused_leaves_the_return_reinitiable_then_cannot_be_resent(
    module_settings,
):
    module_settings.PROCESSOR_BACKEND = "payments.processor.backends.example.OtherProcessorBackend"
    payment = _returned(code="R01")
    assert not _ask(payment).sent  # this backend refuses dishonors: a 4xx-like rejection
    [attempt] = ProcessorAttempt.objects.filter(payment=payment, operation="dishonor")
    assert attempt.outcome == AttemptOutcome.REJECTED

    again = payment_reinitiate(payment_id=payment.id)

    with pytest.raises(DishonorRefused, match=f"reinitiated as payment {again.id}"):
        return_dishonor_resend(payment_id=payment.id)
    assert ProcessorAttempt.objects.filter(payment=payment, operation="dishonor").count() == 1


def test_a_reinitiation_of_a_reinitiation_blocks_the_dishonor_of_the_middle_entry(
    unreachable_processor,
):
    original = _returned(code="R01")
    first = payment_reinitiate(payment_id=original.id)
    Payment.objects.filter(pk=first.pk).update(state="submitted")
    first.refresh_from_db()
    payment_apply_event(event=processor_event(first, "settled", timestamp=timezone.now()))
    payment_apply_event(
        event=processor_event(first, "returned", reason_code="R01", timestamp=timezone.now())
    )
    second = payment_reinitiate(payment_id=first.id)

    with pytest.raises(DishonorRefused, match=f"reinitiated as payment {second.id}"):
        _ask(first)
    with pytest.raises(DishonorRefused, match=f"reinitiated as payment {first.id}"):
        _ask(original)


# --- dishonor first ----------------------------------------------------------------------------


def test_a_request_that_failed_with_no_answer_blocks_a_reinitiation_while_its_window_is_open(
    unreachable_processor,
):
    payment = _returned(code="R01")
    result = _ask(payment)
    assert not result.sent
    [attempt] = ProcessorAttempt.objects.filter(payment=payment, operation="dishonor")
    assert attempt.outcome == AttemptOutcome.RETRYABLE  # the processor may have taken it

    with pytest.raises(ReinitiationRefused, match="no answer from the processor") as refused:
        payment_reinitiate(payment_id=payment.id)

    assert refused.value.rule == "dishonor_pending"
    assert not Payment.objects.filter(reinitiation_of=payment).exists()


def test_past_its_window_an_unanswered_request_no_longer_blocks_a_reinitiation(
    unreachable_processor,
):
    payment = _returned(code="R01")
    _ask(payment)
    deadline = dishonor_deadline(payment.ach_return.returned_at)

    again = payment_reinitiate(payment_id=payment.id, now=deadline + timedelta(minutes=1))

    assert again.reinitiation_of_id == payment.id


@pytest.mark.parametrize("status", [DishonorRequestStatus.REQUESTED, DishonorRequestStatus.SENT])
def test_a_request_waiting_for_its_answer_blocks_a_reinitiation(status, unreachable_processor):
    payment = _returned(code="R01")
    _ask(payment)
    ReturnDishonor.objects.filter(payment=payment).update(request_status=status)

    with pytest.raises(ReinitiationRefused) as refused:
        payment_reinitiate(payment_id=payment.id)

    assert refused.value.rule == "dishonor_pending"


# --- both at once ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_dishonor_and_a_reinitiation_racing_on_one_return_leave_exactly_one_remedy(
    unreachable_processor,
):
    """Twenty returns, each raced by two threads on PostgreSQL: whichever takes the returned
    entry's row lock first wins, and the other is refused naming it."""
    outcomes = {"dishonor": 0, "reinitiation": 0}
    for _ in range(20):
        payment = _returned(code="R01")
        dishonor, reinitiation = race(
            lambda p=payment: _ask(p), lambda p=payment: payment_reinitiate(payment_id=p.id)
        )
        refused = [r for r in (dishonor, reinitiation) if isinstance(r, Exception)]
        assert len(refused) == 1, (dishonor, reinitiation)
        assert isinstance(refused[0], DishonorRefused | ReinitiationRefused), refused
        made_dishonor = ReturnDishonor.objects.filter(payment=payment).exists()
        made_reinitiation = Payment.objects.filter(reinitiation_of=payment).exists()
        assert made_dishonor != made_reinitiation
        outcomes["dishonor" if made_dishonor else "reinitiation"] += 1
    assert sum(outcomes.values()) == 20


# --- what no check can stop: the processor's answer after a reinitiation -------------------------


def test_a_dishonor_that_stands_after_a_reinitiation_is_booked_and_raised_high(
    unreachable_processor, django_capture_on_commit_callbacks
):
    payment = _returned(code="R01")
    _ask(payment)  # timed out: the processor may have taken it
    deadline = dishonor_deadline(payment.ach_return.returned_at)
    again = payment_reinitiate(payment_id=payment.id, now=deadline + timedelta(minutes=1))

    with django_capture_on_commit_callbacks(execute=True):
        payment_apply_event(event=processor_event(payment, "return_dishonored", reason_code="R61"))

    kinds = LedgerEntry.objects.filter(payment=payment).values_list("kind", flat=True)
    assert list(kinds).count(LedgerEntryKind.RECREDIT) == 1  # the money moved: booked
    alert = Alert.objects.get(key=f"payment.dishonor_after_reinitiation:{payment.id}")
    assert alert.severity == "high"
    assert str(again.id) in alert.summary and "charges the customer again" in alert.summary


@pytest.mark.django_db(transaction=True)
def test_a_dishonor_answer_racing_a_reinitiation_is_either_refused_before_or_alerted_after():
    """The processor's ``return_dishonored`` (one we never asked for) lands while an operator
    reinitiates: both take the returned entry's row lock. Either the answer comes first and the
    reinitiation is refused, or the reinitiation comes first and the booked answer raises the
    high alert; never a reinitiation beside a standing dishonor nobody is told of."""
    from django.db import transaction

    orders = {"answer first": 0, "reinitiation first": 0}
    for _ in range(10):
        payment = _returned(code="R01")
        answer = processor_event(payment, "return_dishonored", reason_code="R61")

        def apply_answer(event=answer):
            with transaction.atomic():  # the worker's transaction; the alert follows commit
                return payment_apply_event(event=event)

        _, made = race(apply_answer, lambda p=payment: payment_reinitiate(payment_id=p.id))
        kinds = list(LedgerEntry.objects.filter(payment=payment).values_list("kind", flat=True))
        assert kinds.count(LedgerEntryKind.RECREDIT) == 1
        alerted = Alert.objects.filter(
            key=f"payment.dishonor_after_reinitiation:{payment.id}"
        ).exists()
        if isinstance(made, Exception):
            assert isinstance(made, ReinitiationRefused) and made.rule == "return_dishonored"
            assert not alerted
            orders["answer first"] += 1
        else:
            assert made.reinitiation_of_id == payment.id
            assert alerted
            orders["reinitiation first"] += 1
    assert sum(orders.values()) == 10
