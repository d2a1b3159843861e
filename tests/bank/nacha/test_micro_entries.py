"""Micro-entries on the bank backend, end to end on the real stack: the two credits and their
offsetting debit are queued in the validation's start, so the next cut writes all three in one
file, in an ``ACCTVERIFY`` batch under the merchant's company name (read back by our parser and
the other implementations); they settle together, through the queue like any entry; a return
(R03, written by the sandbox bank and collected through the inbound path) fails the validation
and each held debit once."""

import json
import subprocess
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import achkit
import pytest
from ach.parser import Parser as CartaParser
from django.utils import timezone

from bank.collect import nacha_files_collect
from bank.nacha.models import NachaEntry
from bank.nacha.parser import parse_nacha
from bank.nacha.services import nacha_entries_settle, nacha_file_cut, nacha_file_deliver
from bank.vault.services import vault_account_reveal, vault_account_store
from payments.exceptions import ValidationRefused
from payments.models import (
    HOUSE_ACCOUNT,
    AccountValidation,
    LedgerEntry,
    Payment,
    PaymentEvent,
    PaymentState,
    ReviewStatus,
    ValidationState,
)
from payments.services import payment_create
from payments.services.originators import originator_profile_save
from payments.services.validation import account_validation_start, micro_entries_verify
from sandbox.bank import bank_answer_files
from tests.bank.vault.conftest import ACCOUNT
from tests.callbacks.worker_support import run_worker

pytestmark = pytest.mark.django_db(transaction=True)

MERCHANT = "m-1"
INTEROP = Path(__file__).resolve().parents[3] / "achinterop"


@pytest.fixture
def profile():
    originator_profile_save(
        merchant_id=MERCHANT,
        values={
            "company_name": "ACME WIDGETS",
            "company_identification": "1999999999",
            "allowed_sec_codes": ["PPD", "CCD", "WEB"],
            "default_entry_description": "WIDGETS",
        },
    )


@pytest.fixture
def hold(module_settings):
    module_settings.UNVALIDATED_WEB_DEBITS = "hold"


def _account(holder: str = "Jane Q Customer", **fields) -> str:
    return vault_account_store(
        **(ACCOUNT | {"holder_name": holder, "sec_code": "WEB"} | fields)
    ).token


def _start(token: str) -> AccountValidation:
    return account_validation_start(
        account_token=token, merchant_id=MERCHANT, method="micro_entries"
    )


def _entries(validation: AccountValidation) -> list[Payment]:
    ids = validation.evidence["micro_entries"]["payments"]
    return sorted(Payment.objects.filter(pk__in=ids), key=lambda p: ids.index(str(p.pk)))


def _cut_and_deliver(bank, now=None):
    cut = nacha_file_cut(now=now or timezone.now(), resolve_account=vault_account_reveal)
    assert cut.file is not None
    return nacha_file_deliver(file_id=cut.file.pk, transport=bank)


def _web(token: str):
    return payment_create(
        merchant_id=MERCHANT, amount=Decimal("25.00"), source_token=token, sec_code="WEB"
    )


def test_the_round_is_one_acctverify_batch_under_the_merchants_name_in_one_file(bank, profile):
    token = _account()
    validation = _start(token)
    # The round's entries are queued with the start: no submission needed for the cut.
    assert NachaEntry.objects.filter(payment__account_validation=validation).count() == 3
    run_worker(relay=True)  # their submissions find them queued, and queue nothing more

    delivered = _cut_and_deliver(bank)

    (batch,) = parse_nacha((Path(bank.outbound) / delivered.name).read_bytes()).batches
    assert batch.header.text("company_name") == "ACME WIDGETS"
    assert batch.header.text("company_identification") == "1999999999"
    assert batch.header.text("company_entry_description") == "ACCTVERIFY"
    assert batch.header.text("standard_entry_class_code") == "PPD"
    assert batch.header.text("service_class_code") == "200"  # credits and a debit
    lines = sorted((e.transaction_code, e.amount_cents) for e in batch.entries)
    credits = [cents for code, cents in lines if code == 22]
    debits = [cents for code, cents in lines if code == 27]
    assert len(credits) == 2 and all(1 <= c <= 99 for c in credits)
    assert debits == [sum(credits)]
    assert delivered.entry_count == 3 and delivered.total_debit_cents == sum(credits)
    assert {e.file_id for e in NachaEntry.objects.all()} == {delivered.pk}
    assert nacha_file_cut(now=timezone.now(), resolve_account=vault_account_reveal).file is None


def test_the_other_implementations_read_the_acctverify_batch(bank, profile):
    _start(_account())
    path = Path(bank.outbound) / _cut_and_deliver(bank).name
    text = path.read_text()

    assert achkit.validate(text) == {"ok": True, "errors": []}
    (achkits,) = achkit.parse(text)["batches"]
    (cartas,) = CartaParser(text).as_dict()["batches"]
    node = json.loads(
        subprocess.run(
            ["node", str(INTEROP / "interop.js"), "parse", str(path)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    )
    (nodes,) = node["batches"]
    assert sorted(e["txn_code"] for e in achkits["entries"]) == [22, 22, 27]
    assert cartas["batch_header"]["entry_desc"].strip() == "ACCTVERIFY"
    assert cartas["batch_header"]["company_name"].strip() == "ACME WIDGETS"
    assert (nodes["description"], nodes["company_name"]) == ("ACCTVERIFY", "ACME WIDGETS")
    assert sorted(int(e["entry_detail"]["transaction_code"]) for e in cartas["entries"]) == [
        22,
        22,
        27,
    ]
    assert sorted(int(e["transaction_code"]) for e in nodes["entries"]) == [22, 22, 27]


def test_a_retried_start_queues_no_second_round(bank, profile):
    token = _account()
    _start(token)
    with pytest.raises(ValidationRefused) as again:
        _start(token)

    assert again.value.rule == "account_validation_in_progress"
    assert NachaEntry.objects.count() == 3
    assert _cut_and_deliver(bank).entry_count == 3


def test_the_round_settles_together_and_the_amounts_from_the_file_validate(bank, profile, hold):
    token = _account()
    held = _web(token)
    validation = _start(token)
    delivered = _cut_and_deliver(bank)
    run_worker(relay=True)  # the delivery's submissions: each entry submitted once
    (batch,) = parse_nacha((Path(bank.outbound) / delivered.name).read_bytes()).batches
    amounts = [f"{e.amount_cents / 100:.2f}" for e in batch.entries if e.transaction_code == 22]

    settled_at = timezone.now() + timedelta(days=7)
    assert nacha_entries_settle(now=settled_at) == 3
    run_worker(relay=True)
    verified = micro_entries_verify(account_token=token, merchant_id=MERCHANT, amounts=amounts)

    assert verified.state == ValidationState.VALIDATED
    assert {e.state for e in _entries(validation)} == {PaymentState.CONFIRMED}
    assert (
        sum(LedgerEntry.objects.filter(merchant_id=HOUSE_ACCOUNT).values_list("amount", flat=True))
        == 0
    )
    held.refresh_from_db()
    assert held.review_status == ReviewStatus.NONE


def test_a_round_returned_r03_through_the_inbound_path_fails_each_held_debit_once(bank, hold):
    token = _account(holder="NOACCOUNT Customer")
    held = [_web(token), _web(token)]
    validation = _start(token)
    _cut_and_deliver(bank)
    run_worker(relay=True)

    written = bank_answer_files(outbound=bank.outbound, inbound=bank.inbound)
    result = nacha_files_collect(transport=bank, min_age_seconds=0)
    run_worker(relay=True)

    assert len(written) == 1 and result.dead_lettered == 0
    validation.refresh_from_db()
    assert validation.state == ValidationState.FAILED
    assert validation.failure_reason == "micro-entry returned R03"
    for payment in held:
        payment.refresh_from_db()
        assert payment.state == PaymentState.FAILED
        failures = PaymentEvent.objects.filter(
            payment=payment, event_type="account_validation_failed"
        )
        assert [row.payload["reason"] for row in failures] == ["micro-entry returned R03"]
    assert {e.state for e in _entries(validation)} == {PaymentState.FAILED}
