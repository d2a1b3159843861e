"""Money out through the bank backend, on the real stack: a refund and a payout are queued for
the next file as a debit is, cut into credit batches of their own (22/32, service class 220,
described REFUND or PAYOUT) beside the debits, submitted once when the file is at the bank,
settled as credits, and a credit the receiving bank cannot place comes back R03."""

import json
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from bank.collect import nacha_files_collect
from bank.nacha.backend import NachaBankBackend
from bank.nacha.models import NachaEntry, NachaInboundEvent
from bank.nacha.parser import parse_nacha
from bank.nacha.services import nacha_entries_settle, nacha_file_cut, nacha_file_deliver
from bank.nacha.windows import EASTERN
from bank.vault.services import vault_account_reveal, vault_account_store
from payments.messages import MessageKind, event_fields
from payments.models import OutboxMessage, PaymentDirection, PaymentPurpose, PaymentState
from payments.services import payment_submit
from payments.services.submission import SubmitOutcome
from sandbox.bank import bank_answer_files
from tests.bank.nacha.test_bank_backend import _payment
from tests.bank.vault.conftest import ACCOUNT
from tests.callbacks.worker_support import run_worker
from tests.factories import PaymentFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _account(**fields) -> str:
    return vault_account_store(**(ACCOUNT | fields)).token


def _refund(debit, amount: str = "10.00"):
    return PaymentFactory(
        merchant_id=debit.merchant_id,
        amount=Decimal(amount),
        direction=PaymentDirection.CREDIT,
        purpose=PaymentPurpose.REFUND,
        refund_of=debit,
        source_token=debit.source_token,
    )


def _payout(token: str, amount: str = "250.00"):
    return PaymentFactory(
        merchant_id="m-1",
        amount=Decimal(amount),
        direction=PaymentDirection.CREDIT,
        purpose=PaymentPurpose.PAYOUT,
        source_token=token,
    )


def _confirmed_debit(token: str):
    return PaymentFactory(
        merchant_id="m-1",
        amount=Decimal("42.00"),
        state=PaymentState.CONFIRMED,
        source_token=token,
    )


def _cut():
    return nacha_file_cut(
        now=timezone.now() + timedelta(days=7), resolve_account=vault_account_reveal
    ).file


def test_a_refund_and_a_payout_are_cut_as_credit_batches_beside_the_debits(bank):
    debit = _payment(amount="42.00")
    refund = _refund(_confirmed_debit(debit.source_token), amount="10.00")
    payout = _payout(_account(account_type="savings", sec_code="CCD", holder_name="M One LLC"))
    for payment in (debit, refund, payout):
        assert payment_submit(payment_id=payment.pk).outcome == SubmitOutcome.QUEUED

    cut = _cut()

    parsed = parse_nacha(cut.content_bytes())
    assert [
        (
            b.header.text("standard_entry_class_code"),
            b.header.text("company_entry_description"),
            b.header["service_class_code"],
            [(e.transaction_code, e.amount_cents) for e in b.entries],
        )
        for b in parsed.batches
    ] == [
        ("PPD", "PAYMENT", "225", [(27, 4200)]),
        ("PPD", "REFUND", "220", [(22, 1000)]),
        ("CCD", "PAYOUT", "220", [(32, 25000)]),
    ]
    assert parsed.control.integer("total_debit_amount") == 4200
    assert parsed.control.integer("total_credit_amount") == 26000
    assert (cut.entry_count, cut.total_debit_cents) == (3, 4200)


def test_a_credit_is_submitted_once_its_file_is_delivered_and_found_as_a_credit(bank):
    refund = _refund(_confirmed_debit(_account()))
    backend = NachaBankBackend()
    assert payment_submit(payment_id=refund.pk).outcome == SubmitOutcome.QUEUED
    assert not backend.credit_get(idempotency_key=refund.idempotency_key).found

    cut = _cut()
    nacha_file_deliver(file_id=cut.pk, transport=bank)
    run_worker(relay=True)

    refund.refresh_from_db()
    assert refund.state == PaymentState.SUBMITTED
    trace = NachaEntry.objects.get(payment=refund).trace_number
    assert refund.processor_id == trace
    status = backend.credit_get(idempotency_key=refund.idempotency_key)
    assert (status.found, status.status, status.processor_id) == (True, "submitted", trace)
    # A credit's key is no debit's.
    assert not backend.debit_get(idempotency_key=refund.idempotency_key).found
    assert backend.supports_credits


def test_a_consumers_refund_of_a_web_debit_is_written_as_ppd(bank):
    token = _account(sec_code="WEB")
    refund = _refund(_confirmed_debit(token))
    payment_submit(payment_id=refund.pk)

    [batch] = parse_nacha(_cut().content_bytes()).batches

    assert (
        batch.header.text("standard_entry_class_code"),
        batch.header.text("company_entry_description"),
    ) == ("PPD", "REFUND")


def test_a_delivered_credits_settled_event_states_its_direction(bank):
    payout = _payout(_account())
    payment_submit(payment_id=payout.pk)
    cut = _cut()
    nacha_file_deliver(file_id=cut.pk, transport=bank)
    after = datetime.combine(cut.effective_entry_date, datetime.min.time(), tzinfo=EASTERN)

    assert nacha_entries_settle(now=after.replace(hour=17)) == 1

    [message] = OutboxMessage.objects.filter(
        kind=MessageKind.PROCESSOR_EVENT, group_id=str(payout.pk)
    )
    event = event_fields(message.body)
    assert (event["event_type"], event["direction"]) == ("settled", "credit")


def test_the_sandbox_bank_returns_a_credit_it_cannot_place_r03_stated_as_a_credit(bank):
    payout = _payout(_account(holder_name="NOACCOUNT Merchant"))
    payment_submit(payment_id=payout.pk)
    cut = _cut()
    nacha_file_deliver(file_id=cut.pk, transport=bank)

    written = bank_answer_files(outbound=bank.outbound, inbound=bank.inbound)
    nacha_files_collect(transport=bank, min_age_seconds=0)

    assert len(written) == 1
    [row] = NachaInboundEvent.objects.all()
    assert (row.payment_id, row.code, row.event_type) == (payout.pk, "R03", "returned")
    assert row.event["direction"] == "credit"
    assert row.event["amount"] == "250.00"


def test_a_payouts_destination_shows_its_vault_token_and_last_four_digits_only(
    bank, api_client, user
):
    from tests.factories import grant

    grant(user, "m-1")
    payout = _payout(_account())
    other = vault_account_store(**(ACCOUNT | {"merchant_id": "m-2"})).token
    # A token the vault holds for another merchant shows no digits.
    foreign = _payout(other)

    read = api_client.get(f"/api/payouts/{payout.id}/").json()
    listed = api_client.get("/api/payouts/").json()["results"]

    assert read["destination"] == {"token": payout.source_token, "last4": "9012"}
    assert {p["id"]: p["destination"]["last4"] for p in listed} == {
        str(payout.id): "9012",
        str(foreign.id): None,
    }
    assert ACCOUNT["account_number"] not in json.dumps([read, listed])
