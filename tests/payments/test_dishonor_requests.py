"""The operator's dishonor request: its rules, the call to the processor over HTTP (the
sandbox), and a failed call kept with its attempt, never lost."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import requests
from django.utils import timezone

from payments.exceptions import DishonorRefused
from payments.models import (
    AttemptOutcome,
    DishonorRequestStatus,
    Payment,
    PaymentState,
    ProcessorAttempt,
    ReturnDishonor,
)
from payments.processor.backends.http import get_client, reset_client
from payments.return_codes import dishonor_deadline
from payments.services import payment_apply_event
from payments.services.dishonors import (
    DISHONOR_OPERATION,
    return_dishonor_request,
    return_dishonor_resend,
)
from tests.factories import PaymentFactory, UserFactory, processor_event
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db

AUTH = {"Authorization": "Bearer test-processor-key"}


def _returned(sandbox=None, *, code="R01", returned_at=None, late=False) -> Payment:
    """A payment the processor (the sandbox, when given) charged, settled and returned."""
    payment = PaymentFactory(state=PaymentState.SUBMITTED, amount=Decimal("25.00"))
    if sandbox is not None:
        accepted = get_client().debit_create(
            idempotency_key=payment.idempotency_key,
            payment_id=payment.id,
            amount=payment.amount,
            currency="USD",
            source_token="tok_nsf_dishonor",
        )
        Payment.objects.filter(pk=payment.pk).update(processor_id=accepted.processor_id)
        debit = sandbox.debit(str(payment.idempotency_key))
        # The sandbox's own callbacks settle it first (there is no callback URL to send them to).
        wait_for(lambda: debit.status == "settled", 5, "the sandbox to settle the debit")
        sandbox._debit_status_set(debit, "returned")
    payment_apply_event(event=processor_event(payment, "settled"))
    returned_at = returned_at or timezone.now()
    if late:  # settled long before the return: past R01's 2 banking days
        Payment.objects.filter(pk=payment.pk).update(
            state_changed_at=returned_at - timedelta(days=10)
        )
    payment_apply_event(
        event=processor_event(payment, "returned", reason_code=code, timestamp=returned_at)
    )
    payment.refresh_from_db()
    return payment


def test_a_request_within_the_window_is_sent_once_and_recorded_with_its_attempt(sandbox):
    payment = _returned(sandbox)
    operator = UserFactory()

    result = return_dishonor_request(
        payment_id=payment.id, reason_code="r61", note="misrouted: ticket 4411", user=operator
    )

    assert result.sent and result.error == ""
    dishonor = ReturnDishonor.objects.get(payment=payment)
    assert dishonor.request_status == DishonorRequestStatus.SENT
    assert (dishonor.reason_code, dishonor.note) == ("R61", "misrouted: ticket 4411")
    assert dishonor.requested_by == operator and dishonor.requested_at is not None
    [attempt] = ProcessorAttempt.objects.filter(payment=payment, operation=DISHONOR_OPERATION)
    assert attempt.outcome == AttemptOutcome.ACCEPTED and attempt.http_status == 202
    assert attempt.idempotency_key == dishonor.idempotency_key
    assert sandbox.stats()["dishonors"] == 1


def test_the_sandbox_answers_a_known_dishonor_key_with_the_original_result(sandbox):
    payment = _returned(sandbox)
    result = return_dishonor_request(
        payment_id=payment.id, reason_code="R69", note="field errors", user=UserFactory()
    )
    key = result.dishonor.idempotency_key

    again = get_client().return_dishonor(
        idempotency_key=key,
        debit_idempotency_key=payment.idempotency_key,
        payment_id=payment.id,
        processor_id=payment.processor_id,
        return_event_id=result.dishonor.ach_return.processor_event_id,
        reason_code="R69",
        amount=payment.amount,
        currency="USD",
    )

    assert again.created is False
    assert sandbox.stats()["dishonors"] == 1


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"reason_code": "R01"}, 400, "reason_code"),
        ({"reason_code": "R61"}, 404, "no debit"),
    ],
    ids=["not-a-dishonor-code", "unknown-debit"],
)
def test_the_sandbox_refuses_a_bad_dishonor_request_naming_it(sandbox, body, status, message):
    import uuid

    answer = requests.post(
        f"{sandbox.base_url}/v1/ach/debits/{uuid.uuid4()}/dishonors",
        json=body,
        headers={**AUTH, "Idempotency-Key": str(uuid.uuid4())},
        timeout=5,
    )

    assert answer.status_code == status
    assert message in answer.text


def test_the_sandbox_refuses_a_dishonor_of_a_debit_that_was_not_returned(sandbox):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    get_client().debit_create(
        idempotency_key=payment.idempotency_key,
        payment_id=payment.id,
        amount=payment.amount,
        currency="USD",
        source_token="tok_sandbox_01",
    )
    import uuid

    answer = requests.post(
        f"{sandbox.base_url}/v1/ach/debits/{payment.idempotency_key}/dishonors",
        json={"reason_code": "R61"},
        headers={**AUTH, "Idempotency-Key": str(uuid.uuid4())},
        timeout=5,
    )

    assert answer.status_code == 409
    assert "not returned" in answer.text


def test_a_processor_failure_keeps_the_request_as_failed_with_its_error_then_a_resend_goes(
    sandbox,
):
    payment = _returned(sandbox)
    sandbox.outage_start("503")

    failed = return_dishonor_request(
        payment_id=payment.id, reason_code="R67", note="duplicate return", user=UserFactory()
    )

    assert not failed.sent
    assert "HTTP 503" in failed.error
    dishonor = ReturnDishonor.objects.get(payment=payment)
    assert dishonor.request_status == DishonorRequestStatus.FAILED
    assert "HTTP 503" in dishonor.last_error
    [attempt] = ProcessorAttempt.objects.filter(payment=payment, operation=DISHONOR_OPERATION)
    assert attempt.outcome == AttemptOutcome.RETRYABLE and attempt.http_status == 503

    sandbox.outage_stop()
    sent = return_dishonor_resend(payment_id=payment.id)

    assert sent.sent
    dishonor.refresh_from_db()
    assert dishonor.request_status == DishonorRequestStatus.SENT and dishonor.last_error == ""
    attempts = ProcessorAttempt.objects.filter(payment=payment, operation=DISHONOR_OPERATION)
    assert [a.attempt_number for a in attempts] == [1, 2]
    assert {a.idempotency_key for a in attempts} == {dishonor.idempotency_key}
    assert sandbox.stats()["dishonors"] == 1


def test_a_processor_that_cannot_be_reached_leaves_a_connection_error_on_record(module_settings):
    module_settings.PROCESSOR_BASE_URL = "http://127.0.0.1:9"  # nothing listens there
    reset_client()
    payment = _returned()
    try:
        result = return_dishonor_request(
            payment_id=payment.id, reason_code="R61", note="misrouted", user=UserFactory()
        )
    finally:
        reset_client()

    assert not result.sent
    attempt = ProcessorAttempt.objects.get(payment=payment, operation=DISHONOR_OPERATION)
    assert attempt.error_kind == "connection"
    assert ReturnDishonor.objects.get(payment=payment).request_status == "failed"


def test_a_backend_without_dishonors_is_recorded_as_a_rejected_attempt(module_settings):
    module_settings.PROCESSOR_BACKEND = "payments.processor.backends.example.OtherProcessorBackend"
    payment = _returned()

    result = return_dishonor_request(
        payment_id=payment.id, reason_code="R61", note="misrouted", user=UserFactory()
    )

    assert not result.sent
    assert "OtherProcessorBackend cannot ask its processor to dishonor a return" in result.error
    attempt = ProcessorAttempt.objects.get(payment=payment, operation=DISHONOR_OPERATION)
    assert attempt.outcome == AttemptOutcome.REJECTED
    assert ReturnDishonor.objects.get(payment=payment).request_status == "failed"


# --- refusals: nothing written, nothing sent -------------------------------------------------


def _refused(payment: Payment, match: str, **fields) -> None:
    request = {"reason_code": "R61", "note": "a note", "user": UserFactory(), **fields}
    with pytest.raises(DishonorRefused, match=match):
        return_dishonor_request(payment_id=payment.id, **request)
    assert not ReturnDishonor.objects.filter(payment=payment).exists()
    assert not ProcessorAttempt.objects.filter(operation=DISHONOR_OPERATION).exists()


@pytest.mark.parametrize("state", ["pending", "submitted", "confirmed", "failed"])
def test_a_payment_that_is_not_returned_after_settlement_is_refused(state):
    _refused(PaymentFactory(state=state), "not returned after settlement")


@pytest.mark.parametrize("code", ["R01", "R63", "R71", "", "R61\x00"])
def test_a_code_outside_the_dishonor_codes_is_refused(code):
    _refused(_returned(), "is not a dishonor reason code", reason_code=code)


def test_an_untimely_return_dishonor_needs_a_late_return():
    _refused(_returned(), "needs a late return", reason_code="R68")


def test_an_untimely_return_dishonor_of_a_late_return_is_allowed(sandbox):
    payment = _returned(sandbox, late=True)
    assert payment.ach_return.late

    result = return_dishonor_request(
        payment_id=payment.id, reason_code="R68", note="late by 8 days", user=UserFactory()
    )

    assert result.sent


def test_a_request_without_a_note_is_refused():
    _refused(_returned(), "needs a note", note="   ")


def test_a_request_past_five_banking_days_after_the_return_is_refused():
    returned_at = datetime(2026, 11, 2, 15, 0, tzinfo=UTC)  # a Monday
    payment = _returned(returned_at=returned_at)
    deadline = dishonor_deadline(returned_at)
    assert deadline.date().isoformat() == "2026-11-09"

    _refused(payment, "within 5 banking days", now=deadline + timedelta(seconds=1))


def test_a_request_on_the_last_day_of_the_window_is_taken(sandbox):
    returned_at = timezone.now() - timedelta(days=1)
    payment = _returned(sandbox, returned_at=returned_at)

    result = return_dishonor_request(
        payment_id=payment.id,
        reason_code="R61",
        note="misrouted",
        user=UserFactory(),
        now=dishonor_deadline(returned_at),
    )

    assert result.sent


def test_a_second_request_is_refused_and_a_sent_one_cannot_be_resent(sandbox):
    payment = _returned(sandbox)
    return_dishonor_request(payment_id=payment.id, reason_code="R61", note="n", user=None)

    with pytest.raises(DishonorRefused, match="already has a dishonor"):
        return_dishonor_request(payment_id=payment.id, reason_code="R62", note="n", user=None)
    with pytest.raises(DishonorRefused, match="no dishonor request waiting"):
        return_dishonor_resend(payment_id=payment.id)
    assert sandbox.stats()["dishonors"] == 1


def test_an_unknown_payment_is_refused_by_name():
    from payments.exceptions import PaymentNotFound

    with pytest.raises(PaymentNotFound):
        return_dishonor_request(payment_id="nope", reason_code="R61", note="n", user=None)


def test_an_answer_to_a_request_recorded_as_failed_marks_it_sent(module_settings):
    module_settings.PROCESSOR_BASE_URL = "http://127.0.0.1:9"  # the call fails here...
    reset_client()
    payment = _returned()
    try:
        return_dishonor_request(payment_id=payment.id, reason_code="R61", note="n", user=None)
    finally:
        reset_client()
    assert ReturnDishonor.objects.get(payment=payment).request_status == "failed"

    # ... yet the processor had it: its answer comes.
    payment_apply_event(event=processor_event(payment, "return_dishonored", reason_code="R61"))

    dishonor = ReturnDishonor.objects.get(payment=payment)
    assert dishonor.request_status == DishonorRequestStatus.SENT
    assert not dishonor.unrequested
    with pytest.raises(DishonorRefused, match="no dishonor request waiting"):
        return_dishonor_resend(payment_id=payment.id)


@pytest.mark.django_db(transaction=True)
def test_two_operators_asking_at_once_make_one_request(module_settings):
    from tests.waiting import race

    module_settings.PROCESSOR_BASE_URL = "http://127.0.0.1:9"
    reset_client()
    payment = _returned()

    def ask():
        return return_dishonor_request(
            payment_id=payment.id, reason_code="R61", note="n", user=None
        )

    try:
        results = race(ask, ask)
    finally:
        reset_client()

    refused = [r for r in results if isinstance(r, DishonorRefused)]
    made = [r for r in results if not isinstance(r, Exception)]
    assert len(refused) == 1 and "already has a dishonor" in str(refused[0])
    assert len(made) == 1
    assert ReturnDishonor.objects.filter(payment=payment).count() == 1
    assert ProcessorAttempt.objects.filter(operation=DISHONOR_OPERATION).count() == 1
