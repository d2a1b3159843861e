"""A team plugs in its own processor by writing one class: ``PROCESSOR_BACKEND`` names it, and
the module submits, looks up, verifies and applies through it, over real HTTP, without a line
of the module changed. The backend and its processor's double: ``other_processor.py``."""

import json
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.test import Client

from callbacks.retry import classify
from payments import signing
from payments.checks import payments_processor_backend_check
from payments.exceptions import ProcessorUnavailable
from payments.models import AttemptOutcome, PaymentState, ProcessorAttempt
from payments.processor.backend import get_backend, reset_backend
from payments.processor.backends.example import (
    SIGNATURE,
    TIMESTAMP,
    OtherProcessorBackend,
    other_signature,
)
from payments.processor.backends.http import ProcessorClient
from payments.services import (
    SubmitOutcome,
    payment_create,
    payment_status_check,
    payment_submit,
)
from tests.callbacks.worker_support import (
    applied_events,
    run_worker_until,
    send_body,
)
from tests.factories import PaymentFactory
from tests.payments.other_processor import OtherProcessorServer

BACKEND = "payments.processor.backends.example.OtherProcessorBackend"
SECRET = "test-signing-secret"
URL = "/callbacks/processor/"


@pytest.fixture
def other(settings, module_settings):
    server = OtherProcessorServer(token="other-token").start()
    module_settings.PROCESSOR_BACKEND = BACKEND
    settings.OTHER_PROCESSOR_URL = server.base_url
    settings.OTHER_PROCESSOR_TOKEN = "other-token"
    yield server
    server.stop()
    reset_backend()


def other_callback(payment, kind="transfer.paid", *, secret=SECRET, **headers):
    body = {
        "id": f"ev-{uuid.uuid4().hex}",
        "kind": kind,
        "occurred_at": datetime.now(UTC).isoformat(),
        "transfer": {
            "id": payment.processor_id,
            "order": str(payment.id),
            "amount_cents": int(payment.amount * 100),
            "currency": payment.currency,
        },
    }
    raw = json.dumps(body).encode()
    timestamp = int(time.time())
    signed = {TIMESTAMP: str(timestamp), SIGNATURE: other_signature(secret, timestamp, raw)}
    return Client().post(
        URL, data=raw, content_type="application/json", headers={**signed, **headers}
    )


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("tests.payments.nowhere.Backend", "cannot be imported"),
        ("payments.processor.contract.ProcessorEventSerializer", "is not a subclass"),
        (
            "payments.processor.backend.ProcessorBackend",
            "does not implement callback_parse, callback_verify",
        ),
    ],
)
def test_the_check_refuses_a_backend_that_does_not_import_or_is_not_one(
    module_settings, path, problem
):
    module_settings.PROCESSOR_BACKEND = path

    [error] = payments_processor_backend_check()

    assert error.id == "payments.E005"
    assert problem in error.msg


def test_the_check_accepts_a_backend_outside_the_module(module_settings):
    module_settings.PROCESSOR_BACKEND = BACKEND

    assert payments_processor_backend_check() == []


def test_the_backend_is_built_once_and_again_when_the_setting_names_another(module_settings):
    reset_backend()
    reference = get_backend()
    assert isinstance(reference, ProcessorClient)
    assert get_backend() is reference

    module_settings.PROCESSOR_BACKEND = BACKEND

    assert isinstance(get_backend(), OtherProcessorBackend)
    assert get_backend() is get_backend()
    reset_backend()


@pytest.mark.django_db(transaction=True)
def test_a_payment_is_submitted_looked_up_and_settled_through_another_backend(other, sqs_queues):
    payment = payment_create(
        merchant_id="merchant-other", amount=Decimal("7.50"), source_token="tok_other_ok_1abc"
    )

    result = payment_submit(payment_id=payment.id)

    assert result.outcome == SubmitOutcome.SUBMITTED
    [request] = other.requests
    assert (request["method"], request["url"]) == ("POST", "/ach/v2/transfers")
    assert request["headers"]["X-Request-Key"] == str(payment.idempotency_key)
    assert json.loads(request["body"])["amount_cents"] == 750
    payment.refresh_from_db()
    assert payment.processor_id == other.transfers[str(payment.idempotency_key)]["id"]
    status = payment_status_check(payment_id=payment.id)
    assert (status.found, status.processor_status) == (True, "accepted")
    assert status.processor_id == payment.processor_id

    response = other_callback(payment)

    assert response.status_code == 202, response.content
    run_worker_until(lambda: applied_events(payment) == ["settled"])
    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED


@pytest.mark.django_db(transaction=True)
def test_the_worker_submits_through_it_and_retries_its_5xx_with_the_same_key(
    other, sqs_queues, module_settings
):
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0  # the retry at once
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0
    payment = PaymentFactory(state=PaymentState.PENDING, source_token="tok_other_down_1abc")
    send_body(
        sqs_queues.client,
        sqs_queues.url,
        payment.id,
        {"kind": "submit_payment", "payment_id": str(payment.id)},
    )

    run_worker_until(lambda: ProcessorAttempt.objects.filter(outcome="accepted").exists())

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    attempts = ProcessorAttempt.objects.filter(payment=payment).order_by("attempt_number")
    assert [(a.outcome, a.http_status) for a in attempts] == [
        (AttemptOutcome.RETRYABLE, 503),
        (AttemptOutcome.ACCEPTED, 201),
    ]
    assert {r["headers"]["X-Request-Key"] for r in other.requests} == {str(payment.idempotency_key)}
    assert len(other.transfers) == 1


@pytest.mark.django_db
def test_a_5xx_from_it_is_the_modules_retryable_error(other):
    payment = PaymentFactory(state=PaymentState.PENDING, source_token="tok_other_down_2abc")

    with pytest.raises(ProcessorUnavailable) as excinfo:
        payment_submit(payment_id=payment.id)

    assert classify(excinfo.value) == (True, None)
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING


@pytest.mark.django_db
def test_a_4xx_from_it_fails_the_payment_at_once(other):
    payment = PaymentFactory(state=PaymentState.PENDING, source_token="tok_other_reject_1abc")

    result = payment_submit(payment_id=payment.id)

    assert result.outcome == SubmitOutcome.REJECTED
    payment.refresh_from_db()
    assert payment.state == PaymentState.FAILED
    assert len(other.requests) == 1
    [attempt] = ProcessorAttempt.objects.filter(payment=payment)
    assert (attempt.outcome, attempt.http_status) == (AttemptOutcome.REJECTED, 422)


@pytest.mark.django_db
def test_a_callback_with_a_bad_signature_is_refused_401_naming_its_scheme(other):
    payment = PaymentFactory(state=PaymentState.SUBMITTED, processor_id="tr_1")

    forged = other_callback(payment, secret="not-the-secret")
    reference_signed = Client().post(
        URL,
        data=b"{}",
        content_type="application/json",
        headers={signing.HEADER: signing.sign(b"{}", [SECRET])},
    )

    for response in (forged, reference_signed):
        assert response.status_code == 401
        assert response["WWW-Authenticate"] == f'HMAC-SHA512 header="{SIGNATURE}"'


@pytest.mark.django_db
def test_a_signed_callback_not_of_its_shape_is_400(other):
    raw = json.dumps({"payment_id": str(uuid.uuid4()), "event_type": "settled"}).encode()
    timestamp = int(time.time())
    headers = {TIMESTAMP: str(timestamp), SIGNATURE: other_signature(SECRET, timestamp, raw)}

    response = Client().post(URL, data=raw, content_type="application/json", headers=headers)

    assert response.status_code == 400
    assert "not an Other event" in response.json()["error"]["errors"]["non_field_errors"][0]
