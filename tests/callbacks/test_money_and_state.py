"""End to end on the real stack: a signed callback POSTed to the endpoint, the local SQS server,
the worker, DLQ ingestion. An event that restates a payment's field with another value is held
for a human and never credited; a return for a payment that already failed is recorded, counted
and alerted; an invalid currency is refused at the edge."""

import json
import uuid
from decimal import Decimal

import pytest
from django.test import Client

from callbacks.models import PaymentHold, ProcessingError, QueueMessage
from payments import signing
from payments.models import LedgerEntry, MerchantReturnDay, PaymentReturn, PaymentState
from payments.services import payment_submit
from tests.callbacks.worker_support import run_worker
from tests.factories import PaymentFactory
from triage import ingestion
from triage.models import Alert, DeadLetter

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "test-signing-secret"


def post_event(payment, event_type: str, **fields):
    body = {
        "payment_id": str(payment.id),
        "event_type": event_type,
        "processor_event_id": f"evt_{uuid.uuid4().hex}",
        "amount": f"{payment.amount:.2f}",
        "timestamp": "2026-11-02T12:00:00+00:00",
        **fields,
    }
    raw = json.dumps(body).encode()
    response = Client().post(
        "/callbacks/processor/",
        raw,
        content_type="application/json",
        headers={signing.HEADER: signing.sign(raw, [SECRET])},
    )
    return response, body


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("currency", "EUR", "CurrencyMismatch"),
        ("direction", "credit", "DirectionMismatch"),
        ("processor_id", "pr_another_debit", "ProcessorIdMismatch"),
        ("amount", "10.01", "AmountMismatch"),
    ],
)
def test_a_callback_restating_a_field_otherwise_is_held_for_a_human_never_credited(
    sqs_queues, field, value, error
):
    payment = PaymentFactory(
        state=PaymentState.SUBMITTED,
        amount=Decimal("10.00"),
        currency="USD",
        processor_id="pr_our_debit",
    )
    response, body = post_event(payment, "settled", **{field: value})
    assert response.status_code == 202

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED  # not applied
    assert not LedgerEntry.objects.filter(payment=payment).exists()  # never credited
    message = QueueMessage.objects.get(group_id=str(payment.id))
    assert message.status == "dead_lettered"  # at once: one attempt, no retries
    [failure] = ProcessingError.objects.filter(message_id=message.message_id)
    assert failure.error_class == f"payments.exceptions.{error}" and not failure.retryable
    assert failure.attempt_number == 1
    assert PaymentHold.objects.filter(payment_id=str(payment.id), released_at=None).exists()

    assert ingestion.dead_letters_ingest() == 1
    dead = DeadLetter.objects.get(payment_id=payment.id)
    assert dead.last_error_class == f"payments.exceptions.{error}"
    assert dead.processor_event_id == body["processor_event_id"]
    assert dead.body["event"][field] == value


def test_a_callback_restating_the_payments_own_values_is_applied(sqs_queues):
    payment = PaymentFactory(
        state=PaymentState.SUBMITTED, currency="USD", processor_id="pr_our_debit"
    )
    response, _ = post_event(
        payment, "settled", currency="USD", direction="debit", processor_id="pr_our_debit"
    )
    assert response.status_code == 202

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert LedgerEntry.objects.get(payment=payment).currency == "USD"
    assert not DeadLetter.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("currency", "usd"),
        ("currency", "US"),
        ("currency", "EURO"),
        ("currency", 840),
        ("currency", ""),
        ("direction", "refund"),
        ("processor_id", "pr with spaces"),
        ("processor_id", "p" * 129),
    ],
)
def test_an_invalid_restated_field_is_refused_at_the_edge_naming_it(sqs_queues, field, value):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)

    response, _ = post_event(payment, "settled", **{field: value})

    assert response.status_code == 400
    assert list(response.json()["error"]["errors"]) == [field]
    run_worker()
    assert not QueueMessage.objects.exists()


def test_a_null_currency_is_not_stated(sqs_queues):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    response, _ = post_event(payment, "settled", currency=None)
    assert response.status_code == 202

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED


# --- returns after failure -------------------------------------------------------------------


def _failed_by_rejection(sandbox):
    payment = PaymentFactory(merchant_id="m-rejected", source_token="tok_reject_after_1")
    assert payment_submit(payment_id=payment.id).outcome == "rejected"
    payment.refresh_from_db()
    return payment


def _failed_by_event(sandbox):
    payment = PaymentFactory(state=PaymentState.SUBMITTED, merchant_id="m-failed-event")
    response, _ = post_event(payment, "failed")
    assert response.status_code == 202
    run_worker()
    payment.refresh_from_db()
    return payment


@pytest.mark.parametrize(
    ("failed_by", "code", "unauthorized"),
    [(_failed_by_rejection, "R01", 0), (_failed_by_event, "R10", 1)],
    ids=["R01 after a 4xx rejection", "R10 after a failed event"],
)
def test_a_return_for_a_failed_payment_is_recorded_counted_and_alerted(
    sqs_queues, sandbox, failed_by, code, unauthorized
):
    payment = failed_by(sandbox)
    assert payment.state == PaymentState.FAILED
    response, body = post_event(payment, "returned", reason_code=code)
    assert response.status_code == 202

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.FAILED
    assert not LedgerEntry.objects.filter(payment=payment).exists()
    record = PaymentReturn.objects.get(payment=payment)
    assert (record.reason_code, record.after_failure, record.processor_event_id) == (
        code,
        True,
        body["processor_event_id"],
    )
    message = QueueMessage.objects.get(status="done", outcome="recorded")
    assert message.group_id == str(payment.id)
    day = MerchantReturnDay.objects.get(merchant_id=payment.merchant_id)
    assert (day.debits, day.returns, day.unauthorized_returns) == (1, 1, unauthorized)
    alert = Alert.objects.get(key=f"payment.return_after_failure:{payment.id}")
    assert alert.severity == "medium" and code in alert.summary
    assert not DeadLetter.objects.exists()

    # The processor resends it after SQS's window (a new deduplication id reaches the worker):
    # the same payload is a duplicate; another code under the same id is a conflict.
    for resend in (body, {**body, "reason_code": "R02"}):
        sqs_queues.client.send_message(
            QueueUrl=sqs_queues.url,
            MessageBody=json.dumps({"kind": "processor_event", "event": resend}),
            MessageGroupId=str(payment.id),
            MessageDeduplicationId=uuid.uuid4().hex,
        )
    run_worker()

    assert QueueMessage.objects.filter(group_id=str(payment.id), outcome="duplicate").count() == 1
    conflict = QueueMessage.objects.get(group_id=str(payment.id), status="dead_lettered")
    assert conflict.last_error_class == "payments.exceptions.EventConflict"
    assert PaymentReturn.objects.filter(payment=payment).count() == 1
    day.refresh_from_db()
    assert (day.debits, day.returns, day.unauthorized_returns) == (1, 1, unauthorized)
