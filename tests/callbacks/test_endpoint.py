import io
import json
import socket
import time
import uuid

import pytest
from django.core.handlers.asgi import ASGIRequest
from django.test import Client

from callbacks import sqs
from callbacks.apis import processor_callback
from callbacks.metrics import CALLBACKS_RECEIVED, DEDUP_HITS
from callbacks.schema import (
    event_deduplication_id,
    parse_processor_event,
    processor_event_from_message,
)
from payments import signing

URL = "/callbacks/processor/"
SECRET = "test-signing-secret"


def event_body(**overrides) -> dict:
    body = {
        "payment_id": str(uuid.uuid4()),
        "event_type": "settled",
        "processor_event_id": f"evt_{uuid.uuid4().hex}",
        "amount": "125.00",
        "timestamp": "2026-11-02T12:00:00+00:00",
    }
    body.update(overrides)
    return body


def post(
    raw: bytes,
    *,
    secrets=(SECRET,),
    timestamp: int | None = None,
    signature: str | None = None,
    content_type: str = "application/json",
    **extra,
):
    header = signature if signature is not None else signing.sign(raw, secrets, timestamp=timestamp)
    headers = {signing.HEADER: header} if header else {}
    # CONTENT_TYPE is also passed explicitly: the test client drops it for an empty body.
    return Client().post(
        URL,
        data=raw,
        content_type=content_type,
        headers=headers,
        CONTENT_TYPE=content_type,
        **extra,
    )


def post_json(body: dict, **kwargs):
    return post(json.dumps(body).encode(), **kwargs)


def queued_messages(queues) -> list[dict]:
    """Every message on the main queue (one receive per group at a time, as FIFO allows)."""
    messages = []
    while True:
        got = queues.client.receive_message(
            QueueUrl=queues.url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            AttributeNames=["All"],
        ).get("Messages", [])
        if not got:
            return messages
        messages.extend(got)
        # Deleting releases the group so the next receive can see its later messages.
        queues.client.delete_message_batch(
            QueueUrl=queues.url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
            ],
        )


def outcome_count(outcome: str) -> float:
    return CALLBACKS_RECEIVED.labels(outcome=outcome)._value.get()


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_valid_callback_is_accepted_and_queued_with_payment_group_and_event_dedup_id(sqs_queues):
    body = event_body(reason_code="R00", note="extra field")
    before = outcome_count("accepted")

    response = post_json(body)

    assert response.status_code == 202
    assert response.json() == {
        "status": "accepted",
        "processor_event_id": body["processor_event_id"],
    }
    [message] = queued_messages(sqs_queues)
    assert message["Attributes"]["MessageGroupId"] == body["payment_id"]
    dedup_id = message["Attributes"]["MessageDeduplicationId"]
    assert dedup_id == event_deduplication_id(parse_processor_event(body))
    assert dedup_id.startswith(body["processor_event_id"] + ".")
    queued = json.loads(message["Body"])
    assert set(queued) == {"kind", "event", "received_at"}
    assert queued["kind"] == "processor_event"
    assert queued["event"]["processor_event_id"] == body["processor_event_id"]
    assert queued["event"]["note"] == "extra field"
    assert processor_event_from_message(queued) == parse_processor_event(body)
    assert outcome_count("accepted") == before + 1


def test_content_type_with_charset_is_accepted(sqs_queues):
    response = post_json(event_body(), content_type="application/json; charset=utf-8")
    assert response.status_code == 202


@pytest.mark.django_db
def test_accepting_a_callback_does_not_touch_the_database(sqs_queues, django_assert_num_queries):
    raw = json.dumps(event_body()).encode()
    with django_assert_num_queries(0):
        response = post(raw)
    assert response.status_code == 202


def test_the_same_callback_delivered_20_times_is_queued_once(sqs_queues):
    body = event_body()
    raw = json.dumps(body).encode()
    dedup_before = DEDUP_HITS.labels(layer="sqs")._value.get()
    for i in range(20):
        # Each retry is signed afresh by the processor, as a real retry would be.
        response = post(raw, timestamp=int(time.time()) - i)
        assert response.status_code == 202
    messages = queued_messages(sqs_queues)
    assert len(messages) == 1
    assert (
        json.loads(messages[0]["Body"])["event"]["processor_event_id"] == body["processor_event_id"]
    )
    # SQS answered each repeat with the first message's id: counted as queue-level dedup hits.
    assert DEDUP_HITS.labels(layer="sqs")._value.get() == dedup_before + 19


def test_events_of_one_payment_are_queued_in_arrival_order(sqs_queues):
    payment_id = str(uuid.uuid4())
    ids = [f"evt_{n}" for n in range(3)]
    for event_id in ids:
        response = post_json(event_body(payment_id=payment_id, processor_event_id=event_id))
        assert response.status_code == 202
    assert [
        json.loads(m["Body"])["event"]["processor_event_id"] for m in queued_messages(sqs_queues)
    ] == ids


@pytest.mark.parametrize(
    "field, value",
    [
        ("payment_id", "not-a-uuid"),
        ("event_type", "refunded"),
        ("processor_event_id", "evt with spaces"),
        ("amount", "125.5"),
        ("amount", "0.00"),
        ("timestamp", "2026-11-02T12:00:00"),
        ("reason_code", "R" * 65),
        ("message", "m" * 1001),
    ],
)
def test_bad_field_is_rejected_with_400_naming_it(sqs_queues, field, value):
    before = outcome_count("bad_body")
    response = post_json(event_body(**{field: value}))
    assert response.status_code == 400
    assert list(response.json()["error"]["errors"]) == [field]
    assert queued_messages(sqs_queues) == []
    assert outcome_count("bad_body") == before + 1


def test_missing_fields_are_all_named_in_400(sqs_queues):
    response = post_json({"event_type": "settled"})
    assert response.status_code == 400
    assert set(response.json()["error"]["errors"]) == {
        "payment_id",
        "processor_event_id",
        "amount",
        "timestamp",
    }


@pytest.mark.parametrize(
    "raw", [b"{not json", b"", b"\xff\xfe\x00garbage", b"[" * 5000, b'"a string"']
)
def test_body_that_is_not_a_json_object_is_rejected_with_400(sqs_queues, raw):
    response = post(raw)
    assert response.status_code == 400
    assert "non_field_errors" in response.json()["error"]["errors"]
    assert queued_messages(sqs_queues) == []


def test_missing_signature_is_rejected_with_401(sqs_queues):
    before = outcome_count("bad_signature")
    response = post_json(event_body(), signature="")
    assert response.status_code == 401
    assert "missing" in response.json()["error"]["message"]
    assert queued_messages(sqs_queues) == []
    assert outcome_count("bad_signature") == before + 1


def test_401_names_the_reference_backends_scheme(sqs_queues):
    response = post_json(event_body(), signature="")
    assert response["WWW-Authenticate"] == 'HMAC-SHA256 header="X-Processor-Signature"'


def test_malformed_signature_header_is_rejected_with_401(sqs_queues):
    response = post_json(event_body(), signature="sha256=deadbeef")
    assert response.status_code == 401
    assert queued_messages(sqs_queues) == []


def test_signature_of_another_body_is_rejected_with_401(sqs_queues):
    body = event_body()
    header = signing.sign(json.dumps(body).encode(), [SECRET])
    tampered = json.dumps({**body, "amount": "999.00"}).encode()
    response = post(tampered, signature=header)
    assert response.status_code == 401
    assert queued_messages(sqs_queues) == []


def test_signature_over_reformatted_json_is_rejected_because_raw_bytes_are_signed(sqs_queues):
    body = event_body()
    header = signing.sign(json.dumps(body, indent=2).encode(), [SECRET])
    response = post(json.dumps(body).encode(), signature=header)
    assert response.status_code == 401
    assert queued_messages(sqs_queues) == []


def test_stale_signature_is_rejected_with_401(sqs_queues):
    response = post_json(event_body(), timestamp=int(time.time()) - 301)
    assert response.status_code == 401
    assert "replayed" in response.json()["error"]["message"]
    assert queued_messages(sqs_queues) == []


def test_replayed_old_callback_is_rejected_with_401(sqs_queues):
    raw = json.dumps(event_body()).encode()
    captured = signing.sign(raw, [SECRET], timestamp=int(time.time()) - 600)
    response = post(raw, signature=captured)
    assert response.status_code == 401
    assert queued_messages(sqs_queues) == []


def test_signature_from_the_future_beyond_tolerance_is_rejected_with_401(sqs_queues):
    # Well past the 300 s: int() rounds the signing time down, so "+ 301" came within the
    # tolerance again whenever the request crossed a second boundary before it was checked.
    response = post_json(event_body(), timestamp=int(time.time()) + 330)
    assert response.status_code == 401
    assert queued_messages(sqs_queues) == []


def test_signature_made_with_an_unknown_secret_is_rejected_with_401(sqs_queues):
    response = post_json(event_body(), secrets=["not-our-secret"])
    assert response.status_code == 401
    assert "does not match" in response.json()["error"]["message"]
    assert queued_messages(sqs_queues) == []


def test_signature_with_old_and_new_secret_values_is_accepted_during_rotation(sqs_queues):
    # The processor signs with both secrets while it rotates; only the new one is ours.
    response = post_json(event_body(), secrets=["retired-secret", SECRET])
    assert response.status_code == 202


def test_signature_with_the_old_secret_is_accepted_while_both_are_configured(
    sqs_queues, module_settings
):
    module_settings.CALLBACK_SIGNING_SECRETS = ["new-secret", SECRET]
    assert post_json(event_body(), secrets=[SECRET]).status_code == 202
    assert post_json(event_body(), secrets=["new-secret"]).status_code == 202
    assert post_json(event_body(), secrets=["other"]).status_code == 401
    assert len(queued_messages(sqs_queues)) == 2  # the two accepted, not the refused one


def test_body_over_64_kib_is_rejected_with_413(sqs_queues, module_settings):
    assert module_settings.CALLBACK_MAX_BODY_BYTES == 64 * 1024
    body = event_body(message="x")
    raw = json.dumps(body).encode()
    raw = raw[:-1] + b', "padding": "' + b"p" * (64 * 1024) + b'"}'
    before = outcome_count("too_large")
    response = post(raw)
    assert response.status_code == 413
    assert queued_messages(sqs_queues) == []
    assert outcome_count("too_large") == before + 1


def test_body_of_exactly_64_kib_is_not_rejected_for_size(sqs_queues):
    raw = json.dumps(event_body()).encode()
    raw = raw[:-1] + b', "padding": "'
    raw = raw + b"p" * (64 * 1024 - len(raw) - 2) + b'"}'
    assert len(raw) == 64 * 1024
    assert post(raw).status_code == 202


def test_oversized_declared_length_is_rejected_with_413_before_reading(sqs_queues):
    response = post_json(event_body(), CONTENT_LENGTH=str(10 * 1024 * 1024))
    assert response.status_code == 413
    assert queued_messages(sqs_queues) == []


def test_oversized_body_without_declared_length_is_rejected_with_413(settings, sqs_queues):
    # Under ASGI a chunked body has no Content-Length; the size check must count real bytes.
    raw = b'{"padding": "' + b"p" * (70 * 1024) + b'"}'
    scope = {
        "type": "http",
        "method": "POST",
        "path": URL,
        "headers": [
            (b"content-type", b"application/json"),
            (signing.HEADER.lower().encode(), signing.sign(raw, [SECRET]).encode()),
        ],
    }
    request = ASGIRequest(scope, io.BytesIO(raw))
    response = processor_callback(request)
    assert response.status_code == 413
    assert queued_messages(sqs_queues) == []


def test_body_that_is_not_json_media_type_is_rejected_with_415(sqs_queues):
    before = outcome_count("unsupported_media_type")
    response = post_json(event_body(), content_type="text/plain")
    assert response.status_code == 415
    assert queued_messages(sqs_queues) == []
    assert outcome_count("unsupported_media_type") == before + 1


def test_form_encoded_callback_is_rejected_with_415(sqs_queues):
    response = post(b"payment_id=1", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert queued_messages(sqs_queues) == []


def test_size_is_checked_before_media_type(sqs_queues):
    response = post(b"x" * (65 * 1024), content_type="text/plain")
    assert response.status_code == 413
    assert queued_messages(sqs_queues) == []


def test_media_type_is_checked_before_signature(sqs_queues):
    response = post_json(event_body(), content_type="text/plain", signature="")
    assert response.status_code == 415
    assert queued_messages(sqs_queues) == []


def test_signature_is_checked_before_the_body(sqs_queues):
    response = post(b"{not json", signature="t=1,v1=00")
    assert response.status_code == 401
    assert queued_messages(sqs_queues) == []


def test_queue_unavailable_answers_503_with_retry_after(module_settings, closed_port):
    module_settings.SQS_ENDPOINT_URL = f"http://127.0.0.1:{closed_port}"
    sqs.reset()
    before = outcome_count("queue_unavailable")
    try:
        response = post_json(event_body())
    finally:
        sqs.reset()
    assert response.status_code == 503
    assert int(response["Retry-After"]) > 0
    assert "nothing was accepted" in response.json()["error"]["message"]
    assert outcome_count("queue_unavailable") == before + 1


def test_missing_queue_answers_503(sqs_queues, module_settings):
    module_settings.SQS_QUEUE_NAME = "no-such-queue.fifo"
    sqs.reset()
    response = post_json(event_body())
    assert response.status_code == 503
    assert "Retry-After" in response


def test_callback_is_accepted_again_once_the_queue_is_back(
    sqs_queues, module_settings, closed_port
):
    body = event_body()
    endpoint = module_settings.SQS_ENDPOINT_URL
    module_settings.SQS_ENDPOINT_URL = f"http://127.0.0.1:{closed_port}"
    sqs.reset()
    assert post_json(body).status_code == 503
    module_settings.SQS_ENDPOINT_URL = endpoint
    sqs.reset()
    assert post_json(body).status_code == 202
    assert len(queued_messages(sqs_queues)) == 1


def test_get_is_not_allowed(sqs_queues):
    response = Client().get(URL)
    assert response.status_code == 405


def test_a_resend_with_another_payload_is_not_dropped_by_the_queue(sqs_queues):
    """Same processor_event_id, another amount, inside SQS's window: it must reach a human."""
    body = event_body()
    assert post_json(body).status_code == 202
    assert post_json({**body, "amount": "99.99"}).status_code == 202

    messages = queued_messages(sqs_queues)
    assert sorted(json.loads(m["Body"])["event"]["amount"] for m in messages) == ["125.00", "99.99"]
