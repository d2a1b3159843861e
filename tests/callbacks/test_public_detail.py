"""A submission the processor keeps refusing with 503, through the worker: the tenant's payment
detail names codes, never the processor's address, while the admin keeps the full errors."""

import re

import pytest
from django.utils.html import escape

from callbacks.models import PaymentHold, ProcessingError
from payments.models import PaymentState
from tests.callbacks.worker_support import run_worker, send_body
from tests.factories import PaymentFactory, grant

pytestmark = pytest.mark.django_db(transaction=True)

INTERNALS = re.compile(r"https?://|127\.0\.0\.1|localhost|/v1/")


def test_the_detail_of_a_dead_lettered_submission_carries_no_processor_internals(
    sqs_queues, sandbox, fast_retries, module_settings, api_client, user, admin_client
):
    module_settings.PROCESSOR_BREAKER_FAILURES = (
        100  # its own attempt budget decides, not the breaker
    )
    payment = PaymentFactory(state=PaymentState.PENDING, source_token="tok_fail5xx_9abc")
    grant(user, payment.merchant_id)
    body = {"kind": "submit_payment", "payment_id": str(payment.id)}
    send_body(sqs_queues.client, sqs_queues.url, payment.id, body)

    run_worker()

    # What the worker stored quotes the processor's URL: the example of the class.
    stored = ProcessingError.objects.filter(payment_id=str(payment.id)).first()
    assert stored is not None and INTERNALS.search(stored.message)
    hold = PaymentHold.objects.get(payment_id=str(payment.id), released_at=None)
    port = sandbox.base_url.rsplit(":", 1)[1].strip("/")

    response = api_client.get(f"/api/payments/{payment.id}/")

    assert response.status_code == 200
    text = response.content.decode()
    assert not INTERNALS.search(text), text
    assert f":{port}" not in text
    data = response.json()
    assert {e["source"] for e in data["errors"]} == {"processor", "worker"}
    assert {e["code"] for e in data["errors"]} == {"processor_unavailable"}
    assert all(set(e) >= {"code", "message", "attempt", "at"} for e in data["errors"])
    assert data["hold"]["reason"] == "Waiting for a person"
    # The admin still shows what happened, in full.
    admin_page = admin_client.get(f"/admin/callbacks/paymenthold/{hold.pk}/change/")
    assert escape(hold.reason) in admin_page.content.decode()
