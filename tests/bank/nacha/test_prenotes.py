"""Prenotes on the bank backend, end to end on the real stack: the zero-dollar entry goes in the
next file cut, in the merchant's batch, read back by our parser and the other implementations;
the delivery starts its wait; no answer by the third banking day after its settlement validates
the account and sends each held debit once; a return (R03, written by the sandbox bank and
collected through the inbound path) fails the validation and each held debit once; a NOC
changing the account number makes the account new."""

import json
import subprocess
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import achkit
import pytest
from ach.parser import Parser as CartaParser
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from bank.collect import nacha_files_collect
from bank.nacha.models import NachaEntry, NachaInboundEvent, NachaPrenote
from bank.nacha.parser import parse_nacha
from bank.nacha.services import nacha_file_cut, nacha_file_deliver
from bank.vault.services import vault_account_reveal, vault_account_store
from payments.exceptions import NocPastDeadline
from payments.models import (
    AccountValidation,
    NocStatus,
    NotificationOfChange,
    OutboxMessage,
    PaymentEvent,
    PaymentState,
    ReviewStatus,
    ValidationState,
)
from payments.services import payment_create
from payments.services.nocs import noc_deadline, noc_mark_applied, noc_record
from payments.services.originators import originator_profile_save
from payments.services.validation import account_validation_start, prenotes_mature
from payments.validation_methods import prenote_live_from
from payments.webhooks.delivery import events_dispatch
from payments.webhooks.models import Event
from sandbox.bank import bank_answer_files
from tests.bank.vault.conftest import ACCOUNT
from tests.callbacks.worker_support import run_worker
from tests.factories import PaymentFactory, processor_event

pytestmark = pytest.mark.django_db(transaction=True)

MERCHANT = "m-1"
INTEROP = Path(__file__).resolve().parents[3] / "achinterop"


@pytest.fixture
def hold(module_settings):
    module_settings.UNVALIDATED_WEB_DEBITS = "hold"


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


def _account(holder: str = "Jane Q Customer", **fields) -> str:
    return vault_account_store(
        **(ACCOUNT | {"holder_name": holder, "sec_code": "WEB"} | fields)
    ).token


def _web(token: str, amount: str = "25.00"):
    return payment_create(
        merchant_id=MERCHANT, amount=Decimal(amount), source_token=token, sec_code="WEB"
    )


def _prenote(token: str) -> AccountValidation:
    return account_validation_start(account_token=token, merchant_id=MERCHANT, method="prenote")


def _cut_and_deliver(bank, now=None):
    cut = nacha_file_cut(now=now or timezone.now(), resolve_account=vault_account_reveal)
    assert cut.file is not None
    return nacha_file_deliver(file_id=cut.file.pk, transport=bank)


def _submit_commands(payment) -> int:
    return OutboxMessage.objects.filter(group_id=str(payment.id), kind="submit_payment").count()


def _failures(payment) -> list[str]:
    rows = PaymentEvent.objects.filter(payment=payment, event_type="account_validation_failed")
    return [row.payload["reason"] for row in rows]


# --- the entry in the file ----------------------------------------------------------------------


def test_a_prenote_is_a_zero_dollar_entry_in_the_merchants_batch_of_the_next_file(bank, profile):
    checking = _account()
    savings = _account(account_number="555566667777", account_type="savings")
    _prenote(checking)
    _prenote(savings)
    traces = dict(NachaPrenote.objects.values_list("account_token", "trace_number"))

    delivered = _cut_and_deliver(bank)

    parsed = parse_nacha((Path(bank.outbound) / delivered.name).read_bytes())
    (batch,) = parsed.batches
    assert batch.header.text("company_name") == "ACME WIDGETS"
    assert batch.header.text("company_identification") == "1999999999"
    assert batch.header.text("standard_entry_class_code") == "WEB"
    assert batch.header.text("company_entry_description") == "WIDGETS"
    assert batch.header.text("service_class_code") == "225"
    lines = {e.trace_number: (e.transaction_code, e.amount_cents) for e in batch.entries}
    assert lines == {traces[checking]: (28, 0), traces[savings]: (38, 0)}
    assert delivered.entry_count == 2 and delivered.total_debit_cents == 0
    assert set(NachaPrenote.objects.values_list("file", flat=True)) == {delivered.pk}
    # A second cut finds nothing waiting: each prenote is in one file.
    assert nacha_file_cut(now=timezone.now(), resolve_account=vault_account_reveal).file is None


def test_the_other_implementations_read_the_prenotes_as_zero_dollar_prenote_codes(bank, profile):
    _prenote(_account())
    _prenote(_account(account_number="555566667777", account_type="savings"))
    path = Path(bank.outbound) / _cut_and_deliver(bank).name
    text = path.read_text()

    assert achkit.validate(text) == {"ok": True, "errors": []}
    achkits = [
        (e["txn_code"], e["amount_cents"])
        for b in achkit.parse(text)["batches"]
        for e in b["entries"]
    ]
    cartas = [
        (int(e["entry_detail"]["transaction_code"]), int(e["entry_detail"]["amount"]))
        for b in CartaParser(text).as_dict()["batches"]
        for e in b["entries"]
    ]
    node = json.loads(
        subprocess.run(
            ["node", str(INTEROP / "interop.js"), "parse", str(path)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    )
    nodes = [
        (int(e["transaction_code"]), e["amount_cents"])
        for b in node["batches"]
        for e in b["entries"]
    ]
    assert sorted(achkits) == sorted(cartas) == sorted(nodes) == [(28, 0), (38, 0)]


def test_a_prenote_goes_in_the_batch_of_the_merchants_live_web_debits(bank, profile, hold):
    from tests.factories import account_validated

    validated = _account(holder="Paying Customer", account_number="222233334444")
    account_validated(validated, MERCHANT)
    live = _web(validated)
    run_worker(relay=True)  # the live debit's submission queues its entry
    _prenote(_account())

    delivered = _cut_and_deliver(bank)

    (batch,) = parse_nacha((Path(bank.outbound) / delivered.name).read_bytes()).batches
    codes = sorted((e.transaction_code, e.amount_cents) for e in batch.entries)
    assert codes == [(27, 2500), (28, 0)]
    assert NachaEntry.objects.get(payment=live).file_id == delivered.pk


# --- no answer: the account is validated, the held debit goes once ---------------------------


def test_no_return_by_live_from_validates_and_the_held_debit_goes_out_exactly_once(bank, hold):
    token = _account()
    held = _web(token)
    _prenote(token)
    validation = AccountValidation.objects.get(account_token=token)
    assert validation.live_from is None  # not at the bank yet: nothing can mature
    assert prenotes_mature(now=timezone.now() + timedelta(days=30)) == 0

    delivered = _cut_and_deliver(bank)
    validation.refresh_from_db()
    assert validation.live_from == prenote_live_from(delivered.effective_entry_date)
    assert validation.evidence["prenote"]["file"] == delivered.name
    assert validation.evidence["prenote"]["settlement_date"] == (
        delivered.effective_entry_date.isoformat()
    )
    # The bank has nothing to say about an account it found.
    assert bank_answer_files(outbound=bank.outbound, inbound=bank.inbound) == []

    assert prenotes_mature(now=validation.live_from - timedelta(seconds=1)) == 0
    held.refresh_from_db()
    assert held.review_status == ReviewStatus.VALIDATION and _submit_commands(held) == 0
    assert prenotes_mature(now=validation.live_from) == 1
    assert prenotes_mature(now=validation.live_from + timedelta(days=1)) == 0

    validation.refresh_from_db()
    assert validation.state == ValidationState.VALIDATED
    held.refresh_from_db()
    assert held.review_status == ReviewStatus.NONE and _submit_commands(held) == 1
    run_worker(relay=True)  # its submission queues its entry for the next file
    later = validation.live_from + timedelta(hours=1)
    second = nacha_file_cut(now=later, resolve_account=vault_account_reveal).file
    assert nacha_file_cut(now=later, resolve_account=vault_account_reveal).file is None
    (entry,) = NachaEntry.objects.filter(payment=held)
    assert entry.file_id == second.pk and second.entry_count == 1


# --- a return: the validation fails, each held debit once ------------------------------------


def test_a_prenote_returned_r03_through_the_inbound_path_fails_each_held_debit_once(bank, hold):
    token = _account(holder="NOACCOUNT Customer")
    held = [_web(token, amount) for amount in ("10.00", "11.00")]
    _prenote(token)
    trace = NachaPrenote.objects.get(account_token=token).trace_number
    delivered = _cut_and_deliver(bank)

    written = bank_answer_files(outbound=bank.outbound, inbound=bank.inbound)
    answer = (Path(bank.inbound) / written[0]).read_bytes()
    result = nacha_files_collect(transport=bank, min_age_seconds=0)

    assert len(written) == 1 and len(result.imported) == 1
    assert (result.published, result.dead_lettered) == (0, 0)
    validation = AccountValidation.objects.get(account_token=token)
    assert validation.state == ValidationState.FAILED
    assert validation.failure_reason == "prenote returned R03"
    assert validation.evidence["return"]["code"] == "R03"
    for payment in held:
        payment.refresh_from_db()
        assert payment.state == PaymentState.FAILED
        assert _failures(payment) == ["prenote returned R03"]
        assert _submit_commands(payment) == 0
    (row,) = NachaInboundEvent.objects.all()
    assert (row.prenote.trace_number, row.code, row.payment) == (trace, "R03", None)
    assert row.published_at is not None

    # The same return again, in a file of another name: applied once.
    (Path(bank.inbound) / "resent-answers.ach").write_bytes(answer)
    again = nacha_files_collect(transport=bank, min_age_seconds=0)
    assert again.imported == [] and len(again.seen_before) == 1
    # Nor does the wait validate it afterwards.
    assert prenotes_mature(now=prenote_live_from(delivered.effective_entry_date)) == 0
    for payment in held:
        payment.refresh_from_db()
        assert payment.state == PaymentState.FAILED and _failures(payment) == [
            "prenote returned R03"
        ]


def test_the_same_return_in_a_different_file_is_applied_once(bank, hold):
    token = _account(holder="NOACCOUNT Customer")
    held = _web(token)
    _prenote(token)
    _cut_and_deliver(bank)
    written = bank_answer_files(outbound=bank.outbound, inbound=bank.inbound)
    content = (Path(bank.inbound) / written[0]).read_bytes()
    # Another file of the bank's holding the same return (another creation time).
    header = content[:94]
    changed = header[:29] + b"2359" + header[33:]
    (Path(bank.inbound) / "second.ach").write_bytes(changed + content[94:])

    result = nacha_files_collect(transport=bank, min_age_seconds=0)

    assert len(result.imported) == 2
    assert NachaInboundEvent.objects.count() == 1
    held.refresh_from_db()
    assert held.state == PaymentState.FAILED and _failures(held) == ["prenote returned R03"]


def test_a_return_of_an_earlier_prenote_does_not_fail_the_validation_started_again(bank, hold):
    token = _account(holder="NOACCOUNT Customer")
    _prenote(token)
    first = NachaPrenote.objects.get(account_token=token).trace_number
    _cut_and_deliver(bank)
    # The first prenote refused at the bank side's leisure; meanwhile its validation failed by
    # the return of another route and was started again (simulated: failed, then restarted).
    from payments.services.validation import prenote_refused

    assert prenote_refused(account_token=token, trace_number=first, reason="test") is True
    _prenote(token)
    bank_answer_files(outbound=bank.outbound, inbound=bank.inbound)

    nacha_files_collect(transport=bank, min_age_seconds=0)

    validation = AccountValidation.objects.get(account_token=token)
    assert validation.state == ValidationState.PENDING
    assert validation.evidence["prenote"]["trace_number"] != first


# --- a NOC -------------------------------------------------------------------------------------


def _noc_of_prenote(bank, holder: str = "NOC Customer"):
    """A vaulted account, a WEB debit held for it, its prenote delivered and answered with a
    NOC by the sandbox bank; (token, held debit, the answer file's bytes)."""
    token = _account(holder=holder)
    held = _web(token)
    _prenote(token)
    _cut_and_deliver(bank)
    written = bank_answer_files(outbound=bank.outbound, inbound=bank.inbound)
    return token, held, (Path(bank.inbound) / written[0]).read_bytes()


def test_a_noc_c01_of_a_prenote_makes_the_account_new_and_keeps_its_debit_held(bank, hold):
    token, held, _ = _noc_of_prenote(bank)
    trace = NachaPrenote.objects.get(account_token=token).trace_number

    result = nacha_files_collect(transport=bank, min_age_seconds=0)

    assert (result.published, result.dead_lettered) == (0, 0)
    validation = AccountValidation.objects.get(account_token=token)
    assert validation.state == ValidationState.UNVALIDATED
    noc = NotificationOfChange.objects.get()
    assert validation.evidence["nocs"] == [
        {"change_code": "C01", "source": "prenote_noc", "noc_id": noc.id}
    ]
    (row,) = NachaInboundEvent.objects.all()
    corrected = row.event["corrected_data"]
    assert corrected["account_number_last4"] == "4321"  # the sandbox reverses the digits
    # The corrected account is another vault token: a new account, never validated.
    assert corrected["source_token"] != token
    assert not AccountValidation.objects.filter(account_token=corrected["source_token"]).exists()
    assert "123456789012" not in json.dumps(row.event)
    held.refresh_from_db()
    assert (held.state, held.review_status) == (PaymentState.PENDING, ReviewStatus.VALIDATION)
    assert _submit_commands(held) == 0
    assert prenotes_mature(now=timezone.now() + timedelta(days=30)) == 0
    # Kept as any NOC: of the validation (no payment), open, with its deadline.
    assert (noc.payment, noc.account_validation) == (None, validation)
    assert (noc.merchant_id, noc.source_token) == (MERCHANT, token)
    assert (noc.change_code, noc.change_title) == ("C01", "Incorrect DFI Account Number")
    assert noc.processor_event_id == f"ach.{trace}.C01"
    assert noc.status == NocStatus.OPEN and not noc.unknown_code
    assert noc.deadline == noc_deadline(noc.received_at)
    assert noc.corrected_data == corrected
    # Validated again (a new prenote, no answer by its wait): the held debit goes, once.
    _prenote(token)
    delivered = _cut_and_deliver(bank, now=timezone.now() + timedelta(minutes=1))
    assert prenotes_mature(now=prenote_live_from(delivered.effective_entry_date)) == 1
    held.refresh_from_db()
    assert held.review_status == ReviewStatus.NONE and _submit_commands(held) == 1


def test_a_prenotes_noc_read_twice_is_recorded_once(bank, hold):
    token, _, answer = _noc_of_prenote(bank)
    nacha_files_collect(transport=bank, min_age_seconds=0)
    # The same file again under another name, and the same NOC in a file of another moment.
    (Path(bank.inbound) / "resent-answers.ach").write_bytes(answer)
    header = answer[:94]
    (Path(bank.inbound) / "second.ach").write_bytes(
        header[:29] + b"2359" + header[33:] + answer[94:]
    )

    again = nacha_files_collect(transport=bank, min_age_seconds=0)

    assert len(again.seen_before) == 1 and len(again.imported) == 1
    assert NotificationOfChange.objects.count() == 1
    assert Event.objects.filter(type="noc.received").count() == 1
    validation = AccountValidation.objects.get(account_token=token)
    assert len(validation.evidence["nocs"]) == 1


def test_the_merchant_sees_a_prenotes_noc_as_an_event_without_the_corrected_data(
    bank, hold, api_client, user
):
    from tests.factories import grant

    grant(user, MERCHANT)
    token, _, _ = _noc_of_prenote(bank)
    nacha_files_collect(transport=bank, min_age_seconds=0)
    noc = NotificationOfChange.objects.get()
    events_dispatch()  # the events committed get their place in the merchant's list

    listed = api_client.get("/api/events/", {"merchant": MERCHANT})

    assert listed.status_code == 200, listed.json()
    (event,) = [e for e in listed.json()["data"] if e["type"] == "noc.received"]
    shown = event["data"]["object"]
    assert shown["object"] == "notification_of_change"
    assert (shown["id"], shown["payment_id"], shown["account_token"]) == (str(noc.id), None, token)
    assert (shown["change_code"], shown["status"]) == ("C01", "open")
    assert "corrected_data" not in shown and "4321" not in json.dumps(event)
    assert Event.objects.get(type="noc.received").object_id == str(noc.id)


def test_a_debit_on_the_token_of_a_prenotes_noc_past_its_deadline_is_refused_until_applied(
    bank, hold, admin_user
):
    token, _, _ = _noc_of_prenote(bank)
    nacha_files_collect(transport=bank, min_age_seconds=0)
    noc = NotificationOfChange.objects.get()
    within = _web(token)
    assert [n.id for n in within.nocs_open] == [noc.id]  # its answer warns
    NotificationOfChange.objects.filter(pk=noc.pk).update(
        deadline=timezone.now() - timedelta(minutes=1)
    )

    with pytest.raises(NocPastDeadline) as refused:
        _web(token)
    assert refused.value.noc_id == noc.id

    noc_mark_applied(noc_id=noc.id, user=admin_user, note="account number corrected")
    assert _web(token).review_status == ReviewStatus.VALIDATION
    applied = Event.objects.get(type="noc.applied")
    assert applied.object_id == str(noc.id)
    assert applied.data["object"]["status"] == "applied"
    validation = AccountValidation.objects.get(account_token=token)
    assert [n["source"] for n in validation.evidence["nocs"]] == ["prenote_noc", "noc_applied"]


def test_a_prenotes_noc_of_another_detail_is_kept_and_the_prenote_still_validates(bank, hold):
    token, held, _ = _noc_of_prenote(bank, holder="NOCSAVINGS Customer")

    nacha_files_collect(transport=bank, min_age_seconds=0)

    noc = NotificationOfChange.objects.get()
    assert (noc.change_code, noc.status) == ("C05", NocStatus.OPEN)
    assert noc.corrected_data == {"transaction_code": "37", "account_type": "savings"}
    validation = AccountValidation.objects.get(account_token=token)
    assert validation.state == ValidationState.PENDING
    assert validation.evidence["nocs"] == [
        {"change_code": "C05", "source": "prenote_noc", "noc_id": noc.id}
    ]
    assert prenotes_mature(now=validation.live_from) == 1
    held.refresh_from_db()
    assert held.review_status == ReviewStatus.NONE and _submit_commands(held) == 1


def test_the_admin_lists_a_prenotes_noc_and_shows_it_on_the_validations_page(
    bank, hold, admin_client
):
    token, _, _ = _noc_of_prenote(bank)
    nacha_files_collect(transport=bank, min_age_seconds=0)
    noc = NotificationOfChange.objects.get()
    validation = AccountValidation.objects.get(account_token=token)

    validation_url = reverse("admin:payments_accountvalidation_change", args=[validation.pk])

    listed = admin_client.get(reverse("admin:payments_notificationofchange_changelist"))
    page = admin_client.get(validation_url)
    shown = admin_client.get(reverse("admin:payments_notificationofchange_change", args=[noc.pk]))

    assert listed.status_code == page.status_code == shown.status_code == 200
    assert f'<a href="{validation_url}">prenote of {token}</a>' in listed.content.decode()
    assert "Notifications of change of its prenotes" in page.content.decode()
    assert "Incorrect DFI Account Number" in page.content.decode()
    assert "Mark applied" in shown.content.decode()
    assert "123456789012" not in listed.content.decode() + page.content.decode()


# --- prenotes that must not go --------------------------------------------------------------------


def test_a_prenote_the_cut_cannot_write_fails_its_validation_and_held_debits_once(bank, hold):
    token = _account()
    held = _web(token)
    _prenote(token)
    # The vault row names another merchant by the cut: the prenote must not go.
    from bank.vault.models import VaultAccount

    VaultAccount.objects.filter(token=token).update(merchant_id="m-other")

    cut = nacha_file_cut(now=timezone.now(), resolve_account=vault_account_reveal)

    assert cut.file is None
    prenote = NachaPrenote.objects.get(account_token=token)
    assert prenote.refused_reason == "the account token belongs to another merchant"
    validation = AccountValidation.objects.get(account_token=token)
    assert validation.state == ValidationState.FAILED
    assert validation.failure_reason == (
        "prenote not sent: the account token belongs to another merchant"
    )
    held.refresh_from_db()
    assert held.state == PaymentState.FAILED and len(_failures(held)) == 1


def test_a_prenote_whose_account_changed_number_before_the_cut_is_not_sent(bank, hold):
    token = _account()
    _prenote(token)
    earlier = PaymentFactory(merchant_id=MERCHANT, source_token=token, state="confirmed")
    with transaction.atomic():
        noc_record(
            payment=earlier,
            event=processor_event(earlier, "notification_of_change", change_code="C01"),
        )

    cut = nacha_file_cut(now=timezone.now(), resolve_account=vault_account_reveal)

    assert cut.file is None
    prenote = NachaPrenote.objects.get(account_token=token)
    assert "unvalidated" in prenote.refused_reason
    assert AccountValidation.objects.get(account_token=token).state == "unvalidated"


# --- through the API -----------------------------------------------------------------------------


def test_the_api_starts_a_prenote_and_micro_entries_on_the_bank_backend(bank, api_client, user):
    from tests.factories import grant

    grant(user, MERCHANT)
    token = _account()

    started = api_client.post(
        f"/api/accounts/{token}/validation/",
        {"merchant_id": MERCHANT, "method": "prenote"},
        format="json",
    )
    micro = api_client.post(
        f"/api/accounts/{_account(account_number='999988887777')}/validation/",
        {"merchant_id": MERCHANT, "method": "micro_entries"},
        format="json",
    )

    assert started.status_code == 201, started.json()
    assert (started.json()["state"], started.json()["method"]) == ("pending", "prenote")
    assert NachaPrenote.objects.filter(account_token=token, file__isnull=True).count() == 1
    assert micro.status_code == 201, micro.json()
    assert (micro.json()["state"], micro.json()["method"]) == ("pending", "micro_entries")
    assert NachaEntry.objects.filter(payment__purpose="micro_entry").count() == 3
    _cut_and_deliver(bank)
    shown = api_client.get(f"/api/accounts/{token}/validation/").json()
    assert shown["state"] == "pending"
    assert "123456789012" not in json.dumps(shown)
