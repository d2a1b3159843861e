"""Hostile or unusual callbacks: refused at the edge with 400 naming the field, or accepted
without any of their fields reaching the queue layer's markers."""

import json
import re
import uuid

import pytest

from callbacks.models import PaymentHold, QueueMessage
from callbacks.services import payment_hold
from payments.models import PaymentState
from tests.callbacks.test_endpoint import event_body, post, post_json, queued_messages
from tests.callbacks.worker_support import run_worker
from tests.factories import PaymentFactory
from triage.ingestion import dead_letters_ingest
from triage.models import DeadLetter


def raw_with(field: str, raw_value: str) -> bytes:
    """A valid body plus ``field`` written as raw JSON text (so NaN, duplicates, ... survive)."""
    text = json.dumps(event_body())
    return (text[:-1] + f', "{field}": {raw_value}' + "}").encode()


@pytest.mark.parametrize(
    "field, raw_value, problem",
    [
        ("message", '"a\\u0000b"', "NUL"),
        ("message", '"a\\ud800b"', "surrogate"),
        ("reason_code", '"\\udc00"', "surrogate"),
        ("note", '{"deep": "\\u0000"}', "NUL"),
    ],
)
def test_a_string_the_database_cannot_store_is_refused_naming_its_field(
    sqs_queues, field, raw_value, problem
):
    response = post(raw_with(field, raw_value))
    assert response.status_code == 400
    errors = response.json()["error"]["errors"]
    assert list(errors) == [field]
    assert problem in errors[field][0]
    assert queued_messages(sqs_queues) == []


@pytest.mark.parametrize(
    "raw_value", ["NaN", "Infinity", "-Infinity", "1e999", "123456789012345678901234567890"]
)
def test_a_number_outside_what_json_consumers_read_is_refused(sqs_queues, raw_value):
    response = post(raw_with("note", raw_value))
    assert response.status_code == 400
    assert response.json()["error"]["errors"]
    assert queued_messages(sqs_queues) == []


def test_a_duplicate_key_is_refused_naming_it(sqs_queues):
    body = event_body()
    text = json.dumps(body)[:-1] + ', "amount": "999.00"}'
    response = post(text.encode())
    assert response.status_code == 400
    assert "amount" in json.dumps(response.json()["error"]["errors"])
    assert queued_messages(sqs_queues) == []


@pytest.mark.parametrize("depth", [40, 990, 100_000])
def test_nesting_beyond_the_limit_is_refused_with_400_not_500(sqs_queues, module_settings, depth):
    module_settings.CALLBACK_MAX_BODY_BYTES = 512 * 1024
    response = post(raw_with("note", "[" * depth + "]" * depth))
    assert response.status_code == 400
    assert "nested deeper" in json.dumps(response.json()["error"]["errors"])


@pytest.mark.parametrize("timestamp", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_timestamp_that_does_not_exist_in_utc_is_refused_naming_it(sqs_queues, timestamp):
    response = post_json(event_body(timestamp=timestamp))
    assert response.status_code == 400
    assert list(response.json()["error"]["errors"]) == ["timestamp"]
    assert queued_messages(sqs_queues) == []


def test_the_earliest_and_latest_utc_timestamps_are_accepted(sqs_queues):
    assert post_json(event_body(timestamp="0001-01-01T00:00:00+00:00")).status_code == 202
    assert post_json(event_body(timestamp="9999-12-31T23:59:59Z")).status_code == 202


def test_an_accept_header_asking_for_html_still_gets_the_contracts_json(sqs_queues):
    response = post_json(event_body(), HTTP_ACCEPT="text/html")
    assert response.status_code == 202
    assert response["Content-Type"] == "application/json"


MARKERS = {
    "kind": "submit_payment",
    "event": {"payment_id": str(uuid.uuid4())},
    "received_at": "2000-01-01T00:00:00+00:00",
    "redrive": {"original_message_id": "someone-elses-message", "republished_at": "now"},
    "dead_letter": {
        "original_message_id": "forged",
        "attempts": 99,
        "error_class": "x",
        "error": "y",
    },
    "raw_body": "forged",
}


@pytest.mark.django_db(transaction=True)
def test_a_callback_carrying_every_marker_name_changes_nothing_about_holds_or_dead_letters(
    sqs_queues,
):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    hold = payment_hold(payment_id=str(payment.id), reason="an open dead letter")
    body = event_body(payment_id=str(payment.id), amount=f"{payment.amount:.2f}", **MARKERS)

    assert post_json(body).status_code == 202

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED  # not applied past the hold
    record = QueueMessage.objects.get(group_id=str(payment.id))
    assert record.status == "parked"
    envelope = record.body
    assert set(envelope) == {"kind", "event", "received_at"}
    assert envelope["kind"] == "processor_event"
    assert envelope["event"]["redrive"] == MARKERS["redrive"]  # kept, inside the event only
    hold.refresh_from_db()
    assert hold.released_at is None
    assert PaymentHold.objects.filter(payment_id=str(payment.id), released_at=None).count() == 1
    assert dead_letters_ingest() == 0
    assert not DeadLetter.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("payment_id", "77668056869313516"),
        ("event_type", "settled 77668056869313516"),
        ("currency", "7766805686931"),
        ("direction", "\u0667" * 13),
        ("change_code", "C-77668056"),
        ("amount", "7766-8056-8693-1351"),
        ("timestamp", "77668056869313516"),
    ],
)
def test_a_refused_contract_field_never_quotes_a_bank_number_back(sqs_queues, field, value):
    response = post_json(event_body(**{field: value}))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == field, error
    text = json.dumps(error, ensure_ascii=False).replace(error["request_id"], "")
    assert not re.search(r"\d{5,}", text), text
    assert "7766-8056" not in text
    assert queued_messages(sqs_queues) == []
