"""submit_payment messages through the worker, against the sandbox processor over real HTTP."""

from decimal import Decimal

import pytest

from callbacks.models import PaymentHold, ProcessingError, QueueMessage
from payments.models import AttemptOutcome, PaymentState, ProcessorAttempt
from payments.services import payment_cancel, payment_create
from tests.callbacks.worker_support import drain, run_worker, send_body
from tests.factories import PaymentFactory

pytestmark = pytest.mark.django_db(transaction=True)


def submit_message(sqs_queues, payment) -> str:
    body = {"kind": "submit_payment", "payment_id": str(payment.id)}
    return send_body(sqs_queues.client, sqs_queues.url, payment.id, body)


def test_retryable_processor_error_backs_off_and_retries_with_the_same_key(
    sqs_queues, sandbox, fast_retries
):
    payment = PaymentFactory(state=PaymentState.PENDING, source_token="tok_fail5xx_1abc")
    message_id = submit_message(sqs_queues, payment)

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    attempts = list(ProcessorAttempt.objects.filter(payment=payment).order_by("attempt_number"))
    assert [a.outcome for a in attempts] == [AttemptOutcome.RETRYABLE, AttemptOutcome.ACCEPTED]
    assert {a.idempotency_key for a in attempts} == {payment.idempotency_key}
    [error] = ProcessingError.objects.filter(message_id=message_id)
    assert error.retryable and error.attempt_number == 1 and error.delay_seconds == 0
    assert "503" in error.message
    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.outcome, record.attempts) == ("done", "submitted", 2)
    assert sandbox.stats()["charges_by_payment"] == {str(payment.id): 1}
    assert drain(sqs_queues.client, sqs_queues.url) == []


def test_retry_after_from_the_processor_is_a_floor_for_the_backoff(
    sqs_queues, sandbox, module_settings
):
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0.01
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0.01
    payment = PaymentFactory(state=PaymentState.PENDING, source_token="tok_429_1abcdef")
    message_id = submit_message(sqs_queues, payment)

    run_worker()

    [error] = ProcessingError.objects.filter(message_id=message_id)
    assert error.delay_seconds >= 2  # the sandbox sends Retry-After: 2
    submitted_at = ProcessorAttempt.objects.get(payment=payment, attempt_number=2).started_at
    assert (submitted_at - error.created_at).total_seconds() >= 1.9
    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED


def test_rejected_submission_fails_the_payment_and_deletes_the_message(sqs_queues, sandbox):
    payment = PaymentFactory(state=PaymentState.PENDING, source_token="tok_reject_closed")
    message_id = submit_message(sqs_queues, payment)

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.FAILED
    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.outcome, record.attempts) == ("done", "rejected", 1)
    assert not ProcessingError.objects.exists()
    assert not PaymentHold.objects.exists()
    assert drain(sqs_queues.client, sqs_queues.url) == []
    assert drain(sqs_queues.client, sqs_queues.dlq_url) == []


def test_processor_down_past_the_attempt_limit_dead_letters_the_submission(
    sqs_queues, sandbox, fast_retries, module_settings
):
    # One message failing on its own, below the breaker's thresholds: its own budget decides.
    module_settings.PROCESSOR_BREAKER_FAILURES = 100
    payment = PaymentFactory(state=PaymentState.PENDING, source_token="tok_fail5xx_9abc")
    message_id = submit_message(sqs_queues, payment)

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING
    assert ProcessorAttempt.objects.filter(payment=payment).count() == 6
    assert QueueMessage.objects.get(message_id=message_id).status == "dead_lettered"
    assert PaymentHold.objects.filter(payment_id=str(payment.id), released_at=None).exists()
    assert len(drain(sqs_queues.client, sqs_queues.dlq_url)) == 1


def test_submission_of_a_payment_no_longer_pending_is_skipped(sqs_queues, sandbox):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    message_id = submit_message(sqs_queues, payment)

    run_worker()

    assert QueueMessage.objects.get(message_id=message_id).outcome == "skipped"
    assert not ProcessorAttempt.objects.exists()
    assert sandbox.stats()["total_charges"] == 0


def test_created_payment_is_relayed_from_the_outbox_and_submitted(sqs_queues, sandbox):
    payment = payment_create(
        merchant_id="merchant-1", amount=Decimal("42.00"), source_token="tok_good_account"
    )

    run_worker(relay=True)

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    assert sandbox.stats()["charges_by_payment"] == {str(payment.id): 1}
    assert QueueMessage.objects.get(kind="submit_payment").outcome == "submitted"


def test_a_canceled_payments_submit_message_is_done_and_nothing_reaches_the_processor(
    sqs_queues, sandbox
):
    """A cancel that won the row lock before the worker: the relayed submit_payment message is
    done (not an error, never retried or dead-lettered) and the processor hears nothing."""
    payment = payment_create(
        merchant_id="m-1", amount=Decimal("12.00"), source_token="tok_plain_cancel"
    )
    assert payment_cancel(payment_id=payment.id).canceled

    run_worker(relay=True)

    payment.refresh_from_db()
    assert payment.state == PaymentState.CANCELED
    record = QueueMessage.objects.get(payment_id=payment.id)
    assert (record.status, record.outcome, record.attempts) == ("done", "skipped", 1)
    assert not ProcessingError.objects.filter(payment_id=payment.id).exists()
    assert sandbox.stats()["requests"] == {}
    assert drain(sqs_queues.client, sqs_queues.url) == []
