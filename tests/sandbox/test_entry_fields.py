"""The reference backend sends a debit's or credit's SEC code and company entry description,
and the sandbox processor takes them: stored, echoed, part of what its idempotency key holds,
refused by name when malformed."""

import uuid
from decimal import Decimal

import pytest
import requests

from payments.exceptions import ProcessorRejected
from payments.processor.backend import ProcessorBackend
from payments.processor.backends.example import OtherProcessorBackend
from payments.processor.backends.http import ProcessorClient
from sandbox import SandboxProcessor


@pytest.fixture
def server():
    sandbox = SandboxProcessor().start()
    yield sandbox
    sandbox.stop()


def _client(server) -> ProcessorClient:
    return ProcessorClient(base_url=server.base_url, api_key=server.api_key)


def _debit(client, key, **entry):
    return client.debit_create(
        idempotency_key=key,
        payment_id=uuid.uuid4() if "payment_id" not in entry else entry.pop("payment_id"),
        amount=Decimal("12.00"),
        currency="USD",
        source_token="tok_entry_fields_1",
        **entry,
    )


def test_the_client_sends_the_entry_fields_and_the_sandbox_keeps_and_echoes_them(server):
    client = _client(server)
    key = uuid.uuid4()
    accepted = _debit(client, key, sec_code="WEB", company_entry_description="RETRY PYMT")

    stored = server.debit(str(key))
    assert (stored.sec_code, stored.company_entry_description) == ("WEB", "RETRY PYMT")
    assert accepted.created
    credit_key = uuid.uuid4()
    client.credit_create(
        idempotency_key=credit_key,
        payment_id=uuid.uuid4(),
        amount=Decimal("3.00"),
        currency="USD",
        destination_token="tok_entry_fields_2",
        sec_code="PPD",
        company_entry_description="PAYROLL",
    )
    answer = requests.get(
        f"{server.base_url}/v1/ach/credits/{credit_key}",
        headers={"Authorization": f"Bearer {server.api_key}"},
        timeout=5,
    ).json()
    assert (answer["sec_code"], answer["company_entry_description"]) == ("PPD", "PAYROLL")


def test_a_payment_without_them_sends_the_body_it_always_sent(server):
    key = uuid.uuid4()
    _debit(_client(server), key)
    stored = server.debit(str(key))
    assert (stored.sec_code, stored.company_entry_description) == ("", "")


def test_the_same_key_with_another_description_is_not_the_same_request(server):
    client = _client(server)
    key, payment_id = uuid.uuid4(), uuid.uuid4()
    _debit(client, key, payment_id=payment_id, company_entry_description="PURCHASE")
    with pytest.raises(ProcessorRejected) as raised:
        _debit(client, key, payment_id=payment_id, company_entry_description="RETRY PYMT")
    assert raised.value.status == 422


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sec_code", "web"),
        ("sec_code", "TEL"),
        ("company_entry_description", "ELEVEN CHAR"),
        ("company_entry_description", "purchase"),
        ("company_entry_description", "NUL\x00"),
        ("company_entry_description", ""),
    ],
)
def test_the_sandbox_refuses_a_malformed_entry_field_by_name(server, field, value):
    key = str(uuid.uuid4())
    response = requests.post(
        f"{server.base_url}/v1/ach/debits",
        json={
            "payment_id": str(uuid.uuid4()),
            "amount": "1.00",
            "currency": "USD",
            "source_token": "tok_entry_fields_3",
            field: value,
        },
        headers={"Authorization": f"Bearer {server.api_key}", "Idempotency-Key": key},
        timeout=5,
    )
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert server.debit(key) is None


def test_a_backend_written_before_the_entry_fields_is_called_without_them():
    assert ProcessorClient().describes_entries
    assert not OtherProcessorBackend().describes_entries

    class KeywordsBackend(ProcessorBackend):
        def debit_create(self, **kwargs):
            return kwargs

        def debit_get(self, **kwargs):
            return kwargs

        def callback_verify(self, request):
            return None

        def callback_parse(self, data, request):
            return data

    assert KeywordsBackend().describes_entries
