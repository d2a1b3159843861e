"""Messages whose body the database refuses, sent straight to the queues (bypassing the
endpoint, which refuses them): they reach a person with their body as text, never loop unseen
and never stay in the DLQ."""

import json
import uuid

import pytest

from callbacks.models import PaymentHold, ProcessingError, QueueMessage
from payments.models import PaymentState
from tests.callbacks.worker_support import (
    drain,
    run_worker_receives,
    run_worker_until,
    send_body,
)
from tests.factories import PaymentFactory
from triage.ingestion import dead_letters_ingest
from triage.models import DeadLetter

# The retry schedule is not under test here: failed starts come back at once (fast_retries).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast_retries")]


def envelope_text(payment, **event_overrides) -> str:
    """A queue envelope as raw JSON text, so values Python's json would not write survive."""
    event = {
        "payment_id": str(payment.id),
        "event_type": "settled",
        "processor_event_id": f"evt_{uuid.uuid4().hex[:8]}",
        "amount": f"{payment.amount:.2f}",
        "timestamp": "2026-11-02T12:00:00+00:00",
    }
    text = json.dumps({"kind": "processor_event", "event": event})
    for name, raw_value in event_overrides.items():
        text = text[:-2] + f', "{name}": {raw_value}' + "}}"  # inside the nested event
    return text


UNSTORABLE = {
    "nul": '"a\\u0000b"',
    "lone_surrogate": '"a\\ud800b"',
    "nan": "NaN",
    "infinity": "1e999",
}


@pytest.mark.parametrize("value", list(UNSTORABLE.values()), ids=list(UNSTORABLE))
def test_a_body_the_database_refuses_is_dead_lettered_as_text_after_a_few_starts(
    sqs_queues, module_settings, value
):
    module_settings.WORKER_MAX_FAILED_STARTS = 2
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    raw = envelope_text(payment, note=value)
    message_id = send_body(sqs_queues.client, sqs_queues.url, payment.id, raw)

    run_worker_until(lambda: QueueMessage.objects.filter(message_id=message_id).exists())

    record = QueueMessage.objects.get(message_id=message_id)
    assert record.status == "dead_lettered"
    assert record.body is None and record.raw_body
    assert "\x00" not in record.raw_body
    [error] = ProcessingError.objects.filter(message_id=message_id)
    assert error.error_class == "callbacks.worker.UnstorableBody"
    assert not error.retryable and "refused the message body" in error.message
    assert PaymentHold.objects.filter(payment_id=str(payment.id), released_at=None).exists()
    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED  # nothing applied
    assert drain(sqs_queues.client, sqs_queues.url) == []

    assert dead_letters_ingest() == 1
    dead = DeadLetter.objects.get(original_message_id=message_id)
    assert dead.body["raw_body"] == record.raw_body
    assert dead.last_error_class == "callbacks.worker.UnstorableBody"
    assert drain(sqs_queues.client, sqs_queues.dlq_url) == []


def test_a_failed_start_is_retried_not_dead_lettered_before_the_limit(sqs_queues, module_settings):
    module_settings.WORKER_MAX_FAILED_STARTS = 3
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    message_id = send_body(
        sqs_queues.client, sqs_queues.url, payment.id, envelope_text(payment, note="NaN")
    )

    run_worker_receives(2)

    assert not QueueMessage.objects.filter(message_id=message_id).exists()
    # Hidden for its backoff (a few seconds at most), then back on the queue.
    [back] = sqs_queues.client.receive_message(
        QueueUrl=sqs_queues.url, WaitTimeSeconds=10, AttributeNames=["All"]
    )["Messages"]
    assert back["MessageId"] == message_id
    assert int(back["Attributes"]["ApproximateReceiveCount"]) == 3


@pytest.mark.parametrize("value", list(UNSTORABLE.values()), ids=list(UNSTORABLE))
def test_dlq_ingestion_stores_a_body_the_database_refuses_as_text(sqs_queues, value):
    """As if SQS's RedrivePolicy had moved it: nothing may stay in the DLQ for its content."""
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    raw = envelope_text(payment, note=value)
    message_id = send_body(sqs_queues.client, sqs_queues.dlq_url, payment.id, raw)

    assert dead_letters_ingest() == 1

    dead = DeadLetter.objects.get(original_message_id=message_id)
    assert set(dead.body) == {"raw_body"}
    assert "\x00" not in dead.body["raw_body"] and "note" in dead.body["raw_body"]
    assert dead.source == "redrive_policy"
    assert PaymentHold.objects.filter(payment_id=str(payment.id), released_at=None).exists()
    assert drain(sqs_queues.client, sqs_queues.dlq_url) == []


def test_dlq_ingestion_keeps_our_dead_letter_marker_when_the_body_is_stored_as_text(sqs_queues):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    raw = envelope_text(payment, note='"\\u0000"')
    raw = raw[:-1] + (
        ', "dead_letter": {"original_message_id": "orig-1", "attempts": 2, '
        '"error_class": "X", "error": "bad \\u0000 byte"}}'
    )
    send_body(sqs_queues.client, sqs_queues.dlq_url, payment.id, raw)

    assert dead_letters_ingest() == 1

    dead = DeadLetter.objects.get(original_message_id="orig-1")
    assert dead.source == "worker"
    assert dead.attempts == 2
    assert dead.last_error_message == "bad \\x00 byte"


def test_a_start_failing_for_another_database_reason_is_never_dead_lettered(
    sqs_queues, module_settings
):
    """Only a data error blames the body: any other refusal (an outage, here a trigger
    refusing the row) keeps the message on the queue however often it fails to start."""
    from django.db import connection

    module_settings.WORKER_MAX_FAILED_STARTS = 2
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION refuse_queue_message() RETURNS trigger LANGUAGE plpgsql AS $$ "
            # Every row but the record as text (a bulk start stores no body, and no raw body
            # either): were this failure taken for the body's fault, the record as text would
            # go through and the test would see it.
            f"BEGIN IF NEW.group_id = '{payment.id}' AND (NEW.body IS NOT NULL "
            "OR NEW.raw_body = '') "
            "THEN RAISE EXCEPTION 'refused'; END IF; "
            "RETURN NEW; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER refuse_queue_message BEFORE INSERT ON callbacks_queuemessage "
            "FOR EACH ROW EXECUTE FUNCTION refuse_queue_message()"
        )
    try:
        message_id = send_body(
            sqs_queues.client, sqs_queues.url, payment.id, envelope_text(payment)
        )
        run_worker_receives(3)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER refuse_queue_message ON callbacks_queuemessage")
            cursor.execute("DROP FUNCTION refuse_queue_message()")

    assert not QueueMessage.objects.filter(message_id=message_id).exists()
    assert not ProcessingError.objects.filter(message_id=message_id).exists()
    assert not PaymentHold.objects.filter(payment_id=str(payment.id)).exists()
    [back] = sqs_queues.client.receive_message(
        QueueUrl=sqs_queues.url, WaitTimeSeconds=10, AttributeNames=["All"]
    )["Messages"]
    assert back["MessageId"] == message_id
    assert int(back["Attributes"]["ApproximateReceiveCount"]) == 4
