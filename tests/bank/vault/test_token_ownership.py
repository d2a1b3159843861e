"""On the bank backend, a payment on a vault token is refused at create time unless the vault
holds the token for the payment's merchant: a missing token and another merchant's answer the
same "unknown token", so the answer never tells whose a token is. A processor's token is left
to it, and the reference backend leaves every token to its processor (the backend's hook,
``source_token_refused``)."""

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from bank.vault.services import vault_account_store
from payments.models import ApiIdempotencyKey, OutboxMessage, Payment
from payments.services import payment_create
from tests.bank.vault.conftest import ACCOUNT
from tests.factories import grant

pytestmark = pytest.mark.django_db
URL = "/api/payments/"


@pytest.fixture
def tokens(vault_keys):
    """The vault token of m-1's account, and of m-2's, with the bank backend in use."""
    vault_keys.PROCESSOR_BACKEND = "bank.nacha.backend.NachaBankBackend"
    return {
        merchant: vault_account_store(**(ACCOUNT | {"merchant_id": merchant})).token
        for merchant in ("m-1", "m-2")
    }


@pytest.mark.parametrize("whose", ["m-2", "missing"])
def test_payment_create_refuses_a_vault_token_not_stored_for_its_merchant(tokens, whose):
    token = tokens["m-2"] if whose == "m-2" else "vtok_no_such_token_anywhere"
    with pytest.raises(ValidationError) as refused:
        payment_create(merchant_id="m-1", amount=Decimal("5.00"), source_token=token)
    assert refused.value.message_dict == {"source_token": ["unknown token"]}
    assert Payment.objects.count() == 0
    assert OutboxMessage.objects.count() == 0


def test_payment_create_takes_the_merchants_own_vault_token(tokens):
    payment = payment_create(merchant_id="m-2", amount=Decimal("5.00"), source_token=tokens["m-2"])
    assert payment.source_token == tokens["m-2"]


def test_the_reference_backend_leaves_a_vault_looking_token_to_its_processor(vault_keys):
    payment = payment_create(
        merchant_id="m-1", amount=Decimal("5.00"), source_token="vtok_no_such_token_anywhere"
    )
    assert Payment.objects.filter(pk=payment.pk).exists()


def test_a_processors_token_is_not_judged_by_the_vault(tokens):
    payment = payment_create(
        merchant_id="m-1", amount=Decimal("5.00"), source_token="tok_the_processors_own"
    )
    assert Payment.objects.filter(pk=payment.pk).exists()


def _create(api_client, token, key=None):
    body = {"merchant_id": "m-1", "amount": "5.00", "currency": "USD", "source_token": token}
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return api_client.post(URL, body, format="json", **headers)


def test_the_api_answers_another_merchants_token_as_it_answers_a_missing_one(
    api_client, user, tokens
):
    # Granted both merchants: the token is still m-2's, not m-1's.
    grant(user, "m-1", "m-2")
    others = _create(api_client, tokens["m-2"])
    missing = _create(api_client, "vtok_no_such_token_anywhere")

    for response in (others, missing):
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "source_token"
        assert error["message"] == "source_token: unknown token"
        assert error["errors"] == {"source_token": ["unknown token"]}
        assert "m-2" not in response.content.decode()
    strip = lambda r: {k: v for k, v in r.json()["error"].items() if k != "request_id"}  # noqa: E731
    assert strip(others) == strip(missing)
    assert Payment.objects.count() == 0


def test_a_refused_token_is_not_stored_under_the_key(api_client, user, tokens):
    grant(user, "m-1")
    assert _create(api_client, tokens["m-2"], key="t1").status_code == 400
    assert not ApiIdempotencyKey.objects.filter(key="t1").exists()
    # The corrected request (the merchant's own token) executes under the same key.
    assert _create(api_client, tokens["m-1"], key="t1").status_code == 201
    assert Payment.objects.count() == 1
