"""submit_payment messages through the worker, against the sandbox processor over real HTTP."""

import json
from decimal import Decimal

import pytest
from django.utils import timezone

from callbacks import sqs
from callbacks.models import PaymentHold, ProcessingError, QueueMessage
from callbacks.services import ReceivedMessage, message_send_behind, moves_behind
from payments.models import (
    AttemptOutcome,
    LedgerEntry,
    Payment,
    PaymentEvent,
    PaymentState,
    ProcessorAttempt,
)
from payments.services import payment_cancel, payment_create
from tests.callbacks.worker_support import drain, receive_head, run_worker, send_body, send_event
from tests.factories import PaymentFactory, QueueMessageFactory

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


# --- a processor event ahead of the submission it waits for ------------------------------------


def taken_submission(payment) -> None:
    """An earlier submission of the payment marked it and made its call, which failed
    retryably (the submission then parked): the processor may have the debit, and the payment
    is still pending."""
    Payment.objects.filter(pk=payment.pk).update(submission_started_at=timezone.now())


def test_a_settlement_ahead_of_its_payments_submission_goes_behind_it_and_both_apply(
    sqs_queues, sandbox, fast_retries
):
    # A hold's release sent the submission back after the processor's callback had arrived:
    # the settlement is the group's head, the submission behind it. Retried in place, the
    # settlement kept the submission waiting until it was dead-lettered, and the payment went
    # to a person.
    payment = PaymentFactory(state=PaymentState.PENDING, source_token="tok_ok_behind1")
    taken_submission(payment)
    settled_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    submission_id = submit_message(sqs_queues, payment)

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert LedgerEntry.objects.filter(payment=payment).count() == 1
    assert sandbox.stats()["charges_by_payment"] == {str(payment.id): 1}
    original = QueueMessage.objects.get(message_id=settled_id)
    assert (original.status, original.outcome, original.attempts) == ("done", "moved_behind", 1)
    [error] = ProcessingError.objects.filter(message_id=settled_id)
    assert error.error_class == "payments.exceptions.InvalidTransition" and error.retryable
    assert "sent to the back of its group (move 1 of 3)" in error.message
    assert QueueMessage.objects.get(message_id=submission_id).outcome == "submitted"
    applied = PaymentEvent.objects.get(payment=payment, to_state=PaymentState.CONFIRMED)
    copy = QueueMessage.objects.get(message_id=applied.caused_by.removeprefix("sqs:"))
    assert copy.message_id != settled_id
    assert (copy.status, copy.outcome, copy.attempts) == ("done", "applied", 1)
    assert not PaymentHold.objects.exists()
    assert drain(sqs_queues.client, sqs_queues.url) == []
    assert drain(sqs_queues.client, sqs_queues.dlq_url) == []


def test_an_event_whose_submission_never_comes_moves_three_times_then_is_dead_lettered(
    sqs_queues, fast_retries
):
    # The payment looks as if a submission were on its way, but none is on the queue: the
    # moves are bounded, then the event is retried and dead-lettered as any refused event.
    payment = PaymentFactory(state=PaymentState.PENDING)
    taken_submission(payment)
    first_id, body = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")

    run_worker()

    records = list(
        QueueMessage.objects.filter(group_id=str(payment.id), kind="processor_event").order_by("id")
    )
    assert records[0].message_id == first_id
    assert [(r.outcome, r.attempts) for r in records] == [
        ("moved_behind", 1),
        ("moved_behind", 1),
        ("moved_behind", 1),
        ("dead_lettered", 6),
    ]
    assert all(r.body == body for r in records)
    errors = ProcessingError.objects.filter(payment_id=str(payment.id))
    assert errors.count() == 3 + 6
    assert errors.filter(message__contains="sent to the back of its group").count() == 3
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING
    assert PaymentHold.objects.get(payment_id=str(payment.id)).kind == "triage"
    [dead] = drain(sqs_queues.client, sqs_queues.dlq_url)
    assert json.loads(dead["Body"])["dead_letter"]["attempts"] == 6


@pytest.mark.parametrize("held", [False, True], ids=["never-submitted", "held-for-review"])
def test_a_refused_event_with_no_submission_taken_is_retried_in_place(
    sqs_queues, fast_retries, held
):
    # No call of a submission was made (none came, or it was skipped: the payment is held):
    # nothing of the payment is at the processor, and no submission's answer is to come.
    payment = PaymentFactory(state=PaymentState.PENDING, review_status="held" if held else "")
    if held:
        QueueMessageFactory(
            kind="submit_payment", group_id=str(payment.id), status="done", outcome="skipped"
        )
    message_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")

    run_worker()

    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.attempts) == ("dead_lettered", 6)
    events = QueueMessage.objects.filter(group_id=str(payment.id), kind="processor_event")
    assert events.count() == 1


def test_a_move_sent_twice_leaves_one_copy_on_the_queue(sqs_queues):
    # The worker died after sending the copy and before deleting the message: the message
    # comes back, is moved again, and SQS drops the second copy by its deduplication id.
    payment = PaymentFactory(state=PaymentState.PENDING)
    send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    message = ReceivedMessage.from_sqs(receive_head(sqs_queues.client, sqs_queues.url))
    sqs_queues.client.delete_message(QueueUrl=sqs_queues.url, ReceiptHandle=message.receipt_handle)

    first = message_send_behind(message=message, moves=1)
    again = message_send_behind(message=message, moves=1)

    [copy] = drain(sqs_queues.client, sqs_queues.url)
    assert copy["MessageId"] == first
    assert copy["Attributes"]["MessageDeduplicationId"] == f"{message.message_id}:behind:1"
    assert moves_behind(copy["Attributes"]["MessageDeduplicationId"]) == 1
    assert again == first  # SQS answers a duplicate it drops with the first one's id


def test_a_move_the_queue_refuses_leaves_the_event_retried_in_place_and_nothing_lost(
    sqs_queues, fast_retries, monkeypatch
):
    # SQS refuses the copy: the event is not marked moved, nor deleted; it is retried in place
    # as before the moves existed, and dead-lettered with its whole history.
    send = sqs.send_message_now
    refused = []

    def refuse_moves(**kwargs):
        if ":behind:" in kwargs["deduplication_id"]:
            refused.append(kwargs["deduplication_id"])
            raise sqs.QueueUnavailable("send to SQS failed: connection reset by peer")
        return send(**kwargs)

    monkeypatch.setattr(sqs, "send_message_now", refuse_moves)
    payment = PaymentFactory(state=PaymentState.PENDING)
    taken_submission(payment)
    message_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")

    run_worker()

    assert refused == [f"{message_id}:behind:1"] * 6
    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.attempts) == ("dead_lettered", 6)
    errors = ProcessingError.objects.filter(message_id=message_id)
    assert errors.count() == 6
    assert not errors.filter(message__contains="sent to the back").exists()
    events = QueueMessage.objects.filter(group_id=str(payment.id), kind="processor_event")
    assert events.count() == 1  # no copy was ever sent
    [dead] = drain(sqs_queues.client, sqs_queues.dlq_url)
    assert json.loads(dead["Body"])["dead_letter"]["original_message_id"] == message_id


def test_events_whose_ids_hold_the_moves_mark_are_moved_under_their_own_message_ids(
    sqs_queues, sandbox, fast_retries
):
    # A processor event id may hold ":behind:" (its alphabet has the colon). Taken for a copy,
    # two such events of one payment would have been moved under one deduplication id, the
    # second copy dropped by SQS and its event lost. Each is moved as a first move, under its
    # own message's id, and both are applied.
    payment = PaymentFactory(state=PaymentState.PENDING, source_token="tok_ok_behind2")
    taken_submission(payment)
    sent = [
        send_event(
            sqs_queues.client,
            sqs_queues.url,
            payment,
            "settled",
            processor_event_id=f"evt:behind:{n}",
        )[0]
        for n in (1, 2)
    ]
    submit_message(sqs_queues, payment)

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    for message_id in sent:
        [error] = ProcessingError.objects.filter(message_id=message_id)
        assert "(move 1 of 3)" in error.message
    outcomes = sorted(
        QueueMessage.objects.filter(kind="processor_event").values_list("outcome", flat=True)
    )
    # Both moved, then the first applied and the second a stale repeat of the settlement.
    assert outcomes == ["applied", "moved_behind", "moved_behind", "stale"], outcomes
    assert drain(sqs_queues.client, sqs_queues.dlq_url) == []
