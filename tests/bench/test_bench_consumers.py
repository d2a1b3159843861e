"""The worker baselines: the plain-SQL path must leave the database exactly as the product's
path does (or the comparison is meaningless), and both consumers must drain a real queue."""

import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import psycopg
import pytest
from django.db import connection

from bench import consumers, events
from callbacks.schema import (
    parse_processor_event,
    processor_event_from_message,
    processor_event_message,
)
from payments.models import LedgerEntry, Payment, PaymentEvent, ProcessedEvent
from payments.services import payment_apply_event
from tests.factories import PaymentFactory


def _database_url() -> str:
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


def _message_body(payment: Payment, event_id: str, **overrides) -> dict:
    body = {
        "payment_id": str(payment.id),
        "event_type": "settled",
        "processor_event_id": event_id,
        "amount": f"{payment.amount:.2f}",
        "timestamp": "2026-11-02T07:00:00-05:00",
        **overrides,
    }
    event = parse_processor_event(body)
    received = datetime(2026, 11, 2, 12, 0, 1, tzinfo=UTC)
    return json.loads(json.dumps(processor_event_message(event, received_at=received)))


def _end_state(payment: Payment) -> dict:
    """Everything the apply wrote for ``payment``, without ids, timestamps and own ids."""
    payment.refresh_from_db()
    pid = str(payment.id)
    ledger = list(LedgerEntry.objects.filter(payment=payment).values_list(
        "merchant_id", "kind", "amount", "currency"))  # fmt: skip
    processed = list(ProcessedEvent.objects.filter(payment=payment).values_list(
        "event_type", "payload_hash", "outcome"))  # fmt: skip
    logged = []
    for e in PaymentEvent.objects.filter(payment=payment).order_by("id"):
        payload = {k: v for k, v in e.payload.items()}
        assert payload.pop("payment_id") == pid
        assert payload.pop("processor_event_id") == e.processor_event_id
        logged.append(
            (e.kind, e.outcome, e.event_type, e.from_state, e.to_state, e.caused_by, payload)
        )
    return {"state": payment.state, "ledger": ledger, "processed": processed, "events": logged}


@pytest.mark.django_db(transaction=True)
def test_plain_sql_path_leaves_the_same_end_state_as_payment_apply_event():
    pairs = []
    for n, amount in enumerate((Decimal("125.00"), Decimal("0.01"), Decimal("99999.99"))):
        merchant = f"merchant-{n}"
        pairs.append(
            (
                PaymentFactory(state="submitted", amount=amount, merchant_id=merchant),
                PaymentFactory(state="submitted", amount=amount, merchant_id=merchant),
            )
        )
    with psycopg.connect(_database_url(), autocommit=True) as conn:
        for n, (product, plain) in enumerate(pairs):
            extra = {"reason_code": "R01"} if n == 1 else {}
            product_body = _message_body(product, f"evt_product_{n}", **extra)
            plain_body = _message_body(plain, f"evt_plain_{n}", **extra)
            payment_apply_event(event=processor_event_from_message(product_body), caused_by="sqs:m")
            consumers.apply_settled(conn, plain_body, "m")

    for product, plain in pairs:
        product_state, plain_state = _end_state(product), _end_state(plain)
        assert product_state["state"] == "confirmed"
        assert len(product_state["ledger"]) == 1 and len(product_state["events"]) == 1
        # The fingerprint covers the payment id, so it differs; compare it separately.
        product_hash = product_state["processed"][0][1]
        plain_hash = plain_state["processed"][0][1]
        assert plain_hash != product_hash
        for state in (product_state, plain_state):
            state["processed"] = [(t, "<hash>", o) for t, _, o in state["processed"]]
        assert plain_state == product_state


def test_plain_sql_fingerprint_is_the_products_fingerprint():
    body = {
        "payment_id": str(uuid.uuid4()),
        "event_type": "returned",
        "processor_event_id": "evt_1",
        "amount": "10.50",
        "timestamp": "2026-11-02T07:00:00.250000-05:00",
        "reason_code": "R01",
        "message": "reworded freely",
    }
    assert consumers.fingerprint(body) == parse_processor_event(body).fingerprint


@pytest.mark.django_db(transaction=True)
def test_plain_sql_path_refuses_a_payment_that_is_not_submitted_and_writes_nothing():
    payment = PaymentFactory(state="confirmed")
    with psycopg.connect(_database_url(), autocommit=True) as conn:
        with pytest.raises(consumers.PlainSqlError, match="is confirmed"):
            consumers.apply_settled(conn, _message_body(payment, "evt_x"), "m")
    assert not ProcessedEvent.objects.exists()
    assert not PaymentEvent.objects.exists()
    assert not LedgerEntry.objects.exists()


def _send(queues, payment_ids: list[str]) -> None:
    for callback in events.callbacks_for(payment_ids, uuid.uuid4().hex[:6]):
        body = processor_event_message(parse_processor_event(json.loads(callback.body)))
        queues.client.send_message(
            QueueUrl=queues.url,
            MessageBody=json.dumps(body),
            MessageGroupId=callback.payment_id,
            MessageDeduplicationId=callback.processor_event_id,
        )


def _depth(queues) -> int:
    attributes = queues.client.get_queue_attributes(
        QueueUrl=queues.url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return sum(int(v) for v in attributes.values())


def test_noop_consumer_deletes_every_message_and_reports_its_window(sqs_queues, local_sqs):
    _send(sqs_queues, [str(uuid.uuid4()) for _ in range(12)])
    report = consumers.consume(
        "noop", endpoint_url=local_sqs.endpoint_url, queue_url=sqs_queues.url, database_url=None
    )
    assert report["count"] == 12
    assert report["first_done"] <= report["last_done"]
    assert _depth(sqs_queues) == 0


@pytest.mark.django_db(transaction=True)
def test_plain_sql_consumer_applies_every_queued_event(sqs_queues, local_sqs):
    payments = [PaymentFactory(state="submitted") for _ in range(4)]
    _send(sqs_queues, [str(p.id) for p in payments])
    report = consumers.consume(
        "plainsql",
        endpoint_url=local_sqs.endpoint_url,
        queue_url=sqs_queues.url,
        database_url=_database_url(),
    )
    assert report["count"] == 4
    assert set(Payment.objects.values_list("state", flat=True)) == {"confirmed"}
    assert LedgerEntry.objects.count() == 4
    assert _depth(sqs_queues) == 0
