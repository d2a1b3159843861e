"""Raw bank numbers go into the vault's entry point and nowhere else: never into a log line,
the admin, an API answer, an error or a queue message; every other entry still refuses them."""

import json
import logging

import pytest

from bank.nacha.services import nacha_entry_add, nacha_file_cut
from bank.nacha.windows import EASTERN
from bank.vault.models import VaultAccount
from bank.vault.services import vault_account_reveal, vault_account_store
from payments.models import OutboxMessage, Payment
from tests.bank.nacha.conftest import ORIGINATOR_SETTING
from tests.bank.vault.conftest import ACCOUNT, RAW_NUMBERS
from tests.factories import grant

pytestmark = pytest.mark.django_db
URL = "/api/vault/accounts/"


@pytest.fixture(autouse=True)
def _grants(user, vault_keys):
    grant(user, "m-1")


@pytest.fixture
def every_log(caplog):
    caplog.set_level(logging.DEBUG)
    return caplog


def _assert_no_number(text: str) -> None:
    for number in RAW_NUMBERS:
        assert number not in text


def _logged(caplog) -> str:
    return "\n".join(f"{r.getMessage()} {r.__dict__} {r.exc_text or ''}" for r in caplog.records)


def test_the_api_stores_an_account_and_answers_its_token_and_last_4_only(api_client, every_log):
    response = api_client.post(URL, ACCOUNT, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["token"].startswith("vtok_") and body["account_last4"] == "9012"
    assert set(body) == {
        "token",
        "merchant_id",
        "account_type",
        "sec_code",
        "account_last4",
        "key_version",
        "created_at",
    }
    _assert_no_number(response.content.decode())
    _assert_no_number(_logged(every_log))
    assert vault_account_reveal(body["token"]).account_number == "123456789012"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"routing_number": "011000016"}, "routing_number"),
        ({"account_number": "123456789012-99"}, "account_number"),
        ({"account_number": 123456789012}, "account_number"),
        ({"holder_name": "Jane 123456789012"}, "holder_name"),
        ({"merchant_id": "123456789012"}, "merchant_id"),
        ({"memo": "123456789012"}, "memo"),
    ],
    ids=["check-digit", "form", "json-number", "name", "merchant", "unknown-field"],
)
def test_a_refused_store_names_the_field_and_never_echoes_a_number(
    api_client, every_log, change, field
):
    response = api_client.post(URL, ACCOUNT | change, format="json")
    assert response.status_code == 400
    body = response.json()
    assert field in json.dumps(body)
    for value in change.values():
        assert str(value) not in response.content.decode()
    _assert_no_number(response.content.decode())
    _assert_no_number(_logged(every_log))
    assert VaultAccount.objects.count() == 0


def test_storing_for_a_merchant_not_granted_is_forbidden(api_client):
    response = api_client.post(URL, ACCOUNT | {"merchant_id": "m-other"}, format="json")
    assert response.status_code == 403
    assert VaultAccount.objects.count() == 0


def test_without_credentials_the_vault_answers_401(client):
    response = client.post(URL, ACCOUNT, content_type="application/json")
    assert response.status_code == 401
    _assert_no_number(response.content.decode())


def test_payments_still_refuse_a_raw_number_and_take_the_vault_token(api_client, every_log):
    token = api_client.post(URL, ACCOUNT, format="json").json()["token"]
    raw = {"merchant_id": "m-1", "amount": "25.00", "currency": "USD"}
    refused = api_client.post(
        "/api/payments/", raw | {"source_token": "123456789012"}, format="json"
    )
    assert refused.status_code == 400
    assert "raw bank" in refused.content.decode()
    created = api_client.post("/api/payments/", raw | {"source_token": token}, format="json")
    assert created.status_code == 201, created.content
    payment = Payment.objects.get(pk=created.json()["id"])
    assert payment.source_token == token
    # The queue message the outbox publishes names the payment; no number travels with it.
    message = OutboxMessage.objects.get(group_id=str(payment.pk))
    _assert_no_number(json.dumps(message.body))
    _assert_no_number(created.content.decode())
    _assert_no_number(_logged(every_log))


def test_the_admin_shows_the_last_4_digits_only(admin_client, vault_keys):
    account = vault_account_store(**ACCOUNT)
    listing = admin_client.get("/admin/bank/vaultaccount/")
    page = admin_client.get(f"/admin/bank/vaultaccount/{account.pk}/change/")
    for response in (listing, page):
        assert response.status_code == 200
        text = response.content.decode()
        assert "****9012" in text and account.token in text
        _assert_no_number(text)
    assert admin_client.get("/admin/bank/vaultaccount/add/").status_code == 403


def test_cutting_a_file_from_vaulted_accounts_logs_no_number(
    vault_keys, every_log, module_settings
):
    from datetime import datetime

    from tests.factories import PaymentFactory

    module_settings.NACHA_ORIGINATOR = dict(ORIGINATOR_SETTING)
    token = vault_account_store(**ACCOUNT).token
    closed = PaymentFactory(source_token="vtok_gone_for_good")
    for payment in (PaymentFactory(source_token=token, merchant_id="m-1"), closed):
        nacha_entry_add(payment_id=payment.pk)
    cut = nacha_file_cut(
        now=datetime(2026, 12, 1, 20, 0, tzinfo=EASTERN), resolve_account=vault_account_reveal
    )
    assert (
        "123456789012" in cut.file.content_bytes().decode()
    )  # the file itself carries it, for the bank
    assert [e.payment_id for e in cut.refused] == [closed.pk]
    assert cut.refused[0].refused_reason == "the vault holds no account for this token"
    _assert_no_number(_logged(every_log))
    _assert_no_number(str(cut))


def test_a_vault_without_keys_answers_503_naming_the_setting_and_stores_nothing(
    api_client, module_settings
):
    module_settings.VAULT_KEYS = {}
    module_settings.VAULT_ACTIVE_KEY = ""
    response = api_client.post(URL, ACCOUNT, format="json")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "vault_unconfigured"
    assert "VAULT_ACTIVE_KEY" in response.json()["error"]["message"]
    _assert_no_number(response.content.decode())
    assert VaultAccount.objects.count() == 0
