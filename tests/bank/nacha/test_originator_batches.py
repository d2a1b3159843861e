"""The bank path's files name each merchant's company and describe each entry as the rules
require: one batch per company, SEC code and description, read back from the written file by
our parser and by achkit."""

from datetime import timedelta
from decimal import Decimal

import achkit
import pytest
from django.utils import timezone

from bank.nacha.parser import parse_nacha
from bank.nacha.services import nacha_entry_add, nacha_file_cut
from bank.vault.services import vault_account_reveal, vault_account_store
from payments.models import Payment
from payments.services import payment_create
from payments.services.originators import originator_profile_save
from tests.bank.vault.conftest import ACCOUNT
from tests.factories import account_validated

pytestmark = pytest.mark.django_db


@pytest.fixture
def bank_backend(nacha_settings, module_settings):
    from tests.bank.vault.conftest import KEY_1

    module_settings.PROCESSOR_BACKEND = "bank.nacha.backend.NachaBankBackend"
    module_settings.VAULT_KEYS = {"k1": KEY_1}
    module_settings.VAULT_ACTIVE_KEY = "k1"
    return module_settings


def _token(merchant_id: str, sec_code: str, account_number: str) -> str:
    account = ACCOUNT | {
        "merchant_id": merchant_id,
        "sec_code": sec_code,
        "account_number": account_number,
    }
    token = vault_account_store(**account).token
    # Validated, as NACHA's rule wants before a WEB debit (tests of the batches, not of it).
    account_validated(token, merchant_id)
    return token


def _profile(merchant_id: str, name: str, identification: str, codes, description=""):
    originator_profile_save(
        merchant_id=merchant_id,
        values={
            "company_name": name,
            "company_identification": identification,
            "allowed_sec_codes": list(codes),
            "default_entry_description": description,
        },
    )


def _create(merchant_id: str, token: str, amount: str, **fields) -> Payment:
    payment = payment_create(
        merchant_id=merchant_id, amount=Decimal(amount), source_token=token, **fields
    )
    nacha_entry_add(payment_id=payment.pk)
    return payment


def _batches(content: bytes) -> dict[tuple[str, str, str, str], set[str]]:
    """(company name, company id, SEC code, description) -> the batch's trace numbers."""
    batches = {}
    for batch in parse_nacha(content).batches:
        header = batch.header
        key = (
            header.text("company_name"),
            header.text("company_identification"),
            header.text("standard_entry_class_code"),
            header.text("company_entry_description"),
        )
        assert key not in batches, f"two batches for {key}"
        assert batch.control.text("company_identification") == key[1]
        batches[key] = {entry.trace_number for entry in batch.entries}
    return batches


def test_each_merchant_gets_its_own_batches_with_its_company_and_each_entry_its_description(
    bank_backend,
):
    _profile("m-acme", "ACME WIDGETS", "1111111111", ["WEB", "PPD"], description="ACME SUB")
    _profile("m-beta", "BETA STORE", "2222222222", ["PPD"])
    acme_web = _token("m-acme", "WEB", "100000001")
    acme_ppd = _token("m-acme", "PPD", "100000002")
    beta = _token("m-beta", "PPD", "200000001")
    gamma = _token("m-gamma", "CCD", "300000001")  # no profile: the global originator

    purchase = _create("m-acme", acme_web, "10.00", entry_description="PURCHASE")
    subscription = _create("m-acme", acme_web, "11.00")  # the profile's default description
    rent = _create("m-acme", acme_ppd, "12.00", entry_description="RENT")
    beta_debit = _create("m-beta", beta, "13.00")
    gamma_debit = _create("m-gamma", gamma, "14.00")
    retry = _create("m-acme", acme_web, "10.00", reinitiation_of=purchase, reinitiation_number=1)

    # The vault account's class is the payment's default: nothing named it.
    assert (subscription.sec_code, beta_debit.sec_code, gamma_debit.sec_code) == (
        "WEB",
        "PPD",
        "CCD",
    )
    assert (retry.sec_code, retry.entry_description) == ("WEB", "RETRY PYMT")

    cut = nacha_file_cut(
        now=timezone.now() + timedelta(days=7), resolve_account=vault_account_reveal
    )
    content = cut.file.content_bytes()

    def trace(payment):
        return payment.nacha_entry.trace_number

    assert _batches(content) == {
        ("ACME WIDGETS", "1111111111", "WEB", "PURCHASE"): {trace(purchase)},
        ("ACME WIDGETS", "1111111111", "WEB", "ACME SUB"): {trace(subscription)},
        ("ACME WIDGETS", "1111111111", "WEB", "RETRY PYMT"): {trace(retry)},
        ("ACME WIDGETS", "1111111111", "PPD", "RENT"): {trace(rent)},
        ("BETA STORE", "2222222222", "PPD", "PAYMENT"): {trace(beta_debit)},
        # A merchant without a profile: the global NACHA_ORIGINATOR, as before.
        ("EXAMPLE MERCHANT", "1234567890", "CCD", "PAYMENT"): {trace(gamma_debit)},
    }
    # Another implementation validates the file and reads the same batch headers.
    text = content.decode()
    assert achkit.validate(text) == {"ok": True, "errors": []}
    assert len(achkit.parse(text)["batches"]) == 6


def test_a_payment_naming_a_class_is_written_in_it_whatever_the_accounts_class(bank_backend):
    token = _token("m-acme", "PPD", "100000009")
    payment = _create("m-acme", token, "5.00", sec_code="WEB", entry_description="PURCHASE")

    cut = nacha_file_cut(
        now=timezone.now() + timedelta(days=7), resolve_account=vault_account_reveal
    )

    [(key, traces)] = _batches(cut.file.content_bytes()).items()
    assert key[2:] == ("WEB", "PURCHASE") and traces == {payment.nacha_entry.trace_number}
    payment.nacha_entry.refresh_from_db()
    assert payment.nacha_entry.sec_code == "WEB"


def test_the_bank_backend_refuses_another_merchants_vault_token_as_before(bank_backend):
    from django.core.exceptions import ValidationError

    token = _token("m-acme", "WEB", "100000003")
    with pytest.raises(ValidationError) as raised:
        payment_create(merchant_id="m-beta", amount=Decimal("1.00"), source_token=token)
    assert raised.value.message_dict == {"source_token": ["unknown token"]}
    assert not Payment.objects.exists()


def test_check_names_the_bank_merchants_without_an_originator_profile(bank_backend):
    from django.core import checks

    _token("m-acme", "WEB", "100000004")
    _token("m-beta", "PPD", "200000004")
    _profile("m-beta", "BETA STORE", "2222222222", ["PPD"])

    found = [w for w in checks.run_checks(databases=["default"]) if w.id == "bank.W004"]

    assert len(found) == 1
    assert "1 merchant(s)" in found[0].msg and "m-acme" in found[0].msg
    assert "m-beta" not in found[0].msg
    # Without the database (a plain ``manage.py check``) it reads nothing and says nothing.
    assert not [w for w in checks.run_checks() if w.id == "bank.W004"]
    _profile("m-acme", "ACME WIDGETS", "1111111111", ["WEB"])
    assert not [w for w in checks.run_checks(databases=["default"]) if w.id == "bank.W004"]


def test_check_says_nothing_off_the_bank_backend(bank_backend):
    from bank.checks import merchants_without_originator_profile_check

    _token("m-acme", "WEB", "100000005")
    assert merchants_without_originator_profile_check(databases=["default"])
    bank_backend.PROCESSOR_BACKEND = "payments.processor.backends.http.ProcessorClient"
    assert merchants_without_originator_profile_check(databases=["default"]) == []
