"""End to end through the sandbox processor over HTTP: the entry's class and description travel
with the submission, and a reinitiation goes out as ``RETRY PYMT`` whatever its original said."""

import pytest

from payments.models import Payment
from tests.callbacks.sandbox_support import sandbox_posting_callbacks
from tests.callbacks.test_returns_end_to_end import _work_until
from tests.factories import account_validated, grant

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sandbox_with_callbacks(module_settings, live_server):
    with sandbox_posting_callbacks(
        module_settings, live_server, return_after_seconds=0.3
    ) as server:
        yield server


def test_a_reinitiated_web_purchase_reaches_the_processor_as_retry_pymt_and_settles(
    sqs_queues, sandbox_with_callbacks, api_client, user
):
    grant(user, "m-retry")
    # Validated, as NACHA's rule wants before the account's first WEB debit.
    account_validated("tok_nsfonce_retry_1", "m-retry")
    created = api_client.post(
        "/api/payments/",
        {
            "merchant_id": "m-retry",
            "amount": "30.00",
            "source_token": "tok_nsfonce_retry_1",
            "sec_code": "WEB",
            "entry_description": "PURCHASE",
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    original_id = created.json()["id"]
    assert _work_until(lambda: Payment.objects.get(pk=original_id).state == "returned")

    response = api_client.post(f"/api/payments/{original_id}/reinitiate/", {}, format="json")
    assert response.status_code == 201, response.json()
    retry = response.json()
    assert (retry["sec_code"], retry["entry_description"]) == ("WEB", "RETRY PYMT")
    assert _work_until(lambda: Payment.objects.get(pk=retry["id"]).state == "confirmed")

    # What the processor received with each debit, by its idempotency key.
    original = Payment.objects.get(pk=original_id)
    first = sandbox_with_callbacks.debit(str(original.idempotency_key))
    again = sandbox_with_callbacks.debit(retry["idempotency_key"])
    assert (first.sec_code, first.company_entry_description) == ("WEB", "PURCHASE")
    assert (again.sec_code, again.company_entry_description) == ("WEB", "RETRY PYMT")
    assert sandbox_with_callbacks.stats()["charges_by_payment"] == {
        original_id: 1,
        retry["id"]: 1,
    }
