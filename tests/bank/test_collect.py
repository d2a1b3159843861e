"""The bank's return and NOC files, read into events on the same FIFO path as callbacks and
applied exactly once by run_sqs_worker; an unknown trace number reaches a human; a malformed
file is refused whole and kept."""

import json
import os
from datetime import datetime
from decimal import Decimal

import pytest

from bank.collect import UNKNOWN_TRACE, nacha_files_collect
from bank.nacha.models import NachaEntry, NachaInboundEvent, NachaInboundFile
from bank.nacha.parser import parse_nacha
from bank.nacha.services import nacha_entry_add, nacha_file_cut
from bank.nacha.transports import DirectoryTransport
from bank.nacha.windows import EASTERN
from bank.vault.services import vault_account_reveal, vault_account_store
from payments.models import LedgerEntry, Payment, PaymentState
from sandbox.bank_writer import BankAnswer, nacha_answer_file_write
from tests.bank.nacha.conftest import BANK, ORIGINATOR_SETTING
from tests.bank.vault.conftest import ACCOUNT, KEY_1
from tests.callbacks.worker_support import run_worker
from tests.factories import LedgerEntryFactory, PaymentFactory
from triage import ingestion
from triage.models import DeadLetter

pytestmark = pytest.mark.django_db(transaction=True)
EVENING = datetime(2026, 12, 1, 20, 0, tzinfo=EASTERN)


@pytest.fixture
def bank_path(module_settings, sqs_queues, tmp_path):
    module_settings.NACHA_ORIGINATOR = dict(ORIGINATOR_SETTING)
    module_settings.VAULT_KEYS = {"k1": KEY_1}
    module_settings.VAULT_ACTIVE_KEY = "k1"
    transport = DirectoryTransport(outbound=str(tmp_path / "out"), inbound=str(tmp_path / "in"))
    os.makedirs(transport.inbound)
    return transport


def _settled_payments(n: int, state=PaymentState.CONFIRMED):
    """Payments of ours that went out in a file: vaulted account, entry, the file cut."""
    token = vault_account_store(**ACCOUNT).token
    payments = [
        PaymentFactory(source_token=token, amount=Decimal("25.00") + i, merchant_id="m-1")
        for i in range(n)
    ]
    for payment in payments:
        nacha_entry_add(payment_id=payment.pk)
    cut = nacha_file_cut(now=EVENING, resolve_account=vault_account_reveal).file
    # Then delivered, submitted and settled (the bank backend's tests follow those steps).
    Payment.objects.filter(pk__in=[p.pk for p in payments]).update(state=state)
    for payment in payments:
        payment.refresh_from_db()
        if state == PaymentState.CONFIRMED:
            LedgerEntryFactory(payment=payment, merchant_id=payment.merchant_id)
    ours = {e.trace_number: e for e in parse_nacha(cut.content_bytes()).entries()}
    return payments, ours


def _drop(transport, name: str, content: bytes) -> None:
    path = os.path.join(transport.inbound, name)
    with open(path, "wb") as handle:
        handle.write(content)


def _answers(ours, payments, codes, corrected=None):
    answers = []
    for payment, code in zip(payments, codes, strict=True):
        entry = ours[NachaEntry.objects.get(payment=payment).trace_number]
        answers.append(BankAnswer(entry, code, corrected_data=(corrected or {}).get(code, "")))
    return answers


def _received(client, url) -> list[dict]:
    messages = []
    while True:
        batch = client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            AttributeNames=["All"],
            VisibilityTimeout=30,
        ).get("Messages", [])
        if not batch:
            return messages
        messages += batch


def test_returns_are_applied_exactly_once_through_the_queue_and_worker(bank_path, sqs_queues):
    payments, ours = _settled_payments(2)
    content = nacha_answer_file_write(
        answers=_answers(ours, payments, ["R01", "R10"]), created_at=EVENING, **BANK
    )
    _drop(bank_path, "returns-1.ach", content)

    first = nacha_files_collect(transport=bank_path, min_age_seconds=0)
    # The bank resends the same returns in another file (another creation time): no new event.
    resent = nacha_answer_file_write(
        answers=_answers(ours, payments, ["R01", "R10"]),
        created_at=EVENING,
        file_id_modifier="B",
        **BANK,
    )
    _drop(bank_path, "returns-2.ach", resent)
    second = nacha_files_collect(transport=bank_path, min_age_seconds=0)
    run_worker()

    assert (first.imported, first.published) == (["returns-1.ach"], 2)
    assert (second.imported, second.published) == (["returns-2.ach"], 0)
    for payment in payments:
        payment.refresh_from_db()
        assert payment.state == PaymentState.RETURNED
        reversals = LedgerEntry.objects.filter(payment=payment, kind="reversal")
        assert reversals.count() == 1
    assert sorted(os.listdir(os.path.join(bank_path.inbound, "processed"))) == sorted(
        ["returns-1.ach", "returns-2.ach"]
    )


def test_each_event_goes_out_grouped_by_its_payment_deduplicated_by_trace_and_code(
    bank_path, sqs_queues
):
    payments, ours = _settled_payments(1)
    _drop(
        bank_path,
        "r.ach",
        nacha_answer_file_write(
            answers=_answers(ours, payments, ["R01"]), created_at=EVENING, **BANK
        ),
    )
    nacha_files_collect(transport=bank_path, min_age_seconds=0)
    [message] = _received(sqs_queues.client, sqs_queues.url)
    trace = NachaEntry.objects.get(payment=payments[0]).trace_number
    assert message["Attributes"]["MessageGroupId"] == str(payments[0].pk)
    dedup = message["Attributes"]["MessageDeduplicationId"]
    assert dedup.startswith(f"{trace}.") and len(dedup) == 15 + 1 + 16
    body = json.loads(message["Body"])
    assert body["kind"] == "processor_event"
    assert body["event"]["event_type"] == "returned" and body["event"]["reason_code"] == "R01"
    assert body["event"]["processor_event_id"] == f"ach.{trace}.R01"
    assert body["event"]["amount"] == "25.00"


def test_a_noc_is_queued_with_its_code_and_corrected_data_and_no_account_number(
    bank_path, sqs_queues
):
    payments, ours = _settled_payments(2)
    corrected = {"C01": "98765432100", "C05": "37"}
    _drop(
        bank_path,
        "noc.ach",
        nacha_answer_file_write(
            answers=_answers(ours, payments, ["C01", "C05"], corrected), created_at=EVENING, **BANK
        ),
    )
    result = nacha_files_collect(transport=bank_path, min_age_seconds=0)
    messages = _received(sqs_queues.client, sqs_queues.url)

    assert result.published == 2
    events = {
        json.loads(m["Body"])["event"]["change_code"]: json.loads(m["Body"])["event"]
        for m in messages
    }
    c01, c05 = events["C01"], events["C05"]
    assert c01["event_type"] == "notification_of_change" and c01["reason_code"] == ""
    assert c01["corrected_data"]["account_number_last4"] == "2100"
    new_token = c01["corrected_data"]["source_token"]
    assert vault_account_reveal(new_token).account_number == "98765432100"
    assert c05["corrected_data"] == {"transaction_code": "37", "account_type": "savings"}
    for message in messages:
        assert "98765432100" not in message["Body"] and "123456789012" not in message["Body"]


def test_a_noc_from_the_banks_file_is_recorded_once_by_the_worker(bank_path, sqs_queues):
    """The bank's NOC speaks the callback contract: the worker records it against the payment
    and its token, with the corrected account's vault token; the same file read again adds
    nothing."""
    from payments.models import NotificationOfChange

    payments, ours = _settled_payments(1)
    content = nacha_answer_file_write(
        answers=_answers(ours, payments, ["C01"], {"C01": "98765432100"}),
        created_at=EVENING,
        **BANK,
    )
    _drop(bank_path, "noc.ach", content)
    nacha_files_collect(transport=bank_path, min_age_seconds=0)
    run_worker()
    _drop(bank_path, "noc-again.ach", content)
    nacha_files_collect(transport=bank_path, min_age_seconds=0)
    run_worker()

    [noc] = NotificationOfChange.objects.filter(payment=payments[0])
    assert (noc.change_code, noc.status, noc.source_token) == (
        "C01",
        "open",
        payments[0].source_token,
    )
    assert noc.corrected_data["account_number_last4"] == "2100"
    assert vault_account_reveal(noc.corrected_data["source_token"]).account_number == (
        "98765432100"
    )
    payments[0].refresh_from_db()
    assert payments[0].state == PaymentState.CONFIRMED  # a NOC moves no state


def test_dishonored_and_contested_returns_map_to_their_event_types(bank_path, sqs_queues):
    payments, ours = _settled_payments(2)
    _drop(
        bank_path,
        "d.ach",
        nacha_answer_file_write(
            answers=_answers(ours, payments, ["R68", "R71"]), created_at=EVENING, **BANK
        ),
    )
    nacha_files_collect(transport=bank_path, min_age_seconds=0)
    kinds = sorted(
        json.loads(m["Body"])["event"]["event_type"]
        for m in _received(sqs_queues.client, sqs_queues.url)
    )
    assert kinds == ["dishonor_contested", "return_dishonored"]


def test_a_return_for_a_trace_number_of_no_payment_is_a_dead_letter_for_a_human(
    bank_path, sqs_queues
):
    payments, ours = _settled_payments(1)
    entry = ours[NachaEntry.objects.get(payment=payments[0]).trace_number]
    NachaEntry.objects.filter(payment=payments[0]).update(trace_number="021000029999999")
    _drop(
        bank_path,
        "r.ach",
        nacha_answer_file_write(answers=[BankAnswer(entry, "R01")], created_at=EVENING, **BANK),
    )
    result = nacha_files_collect(transport=bank_path, min_age_seconds=0)

    assert (result.published, result.dead_lettered) == (0, 1)
    assert _received(sqs_queues.client, sqs_queues.url) == []
    assert ingestion.dead_letters_ingest() == 1
    dead = DeadLetter.objects.get()
    assert dead.last_error_class == UNKNOWN_TRACE
    assert entry.trace_number in dead.last_error_message
    assert dead.processor_event_id == f"ach.{entry.trace_number}.R01"
    assert dead.status == "open"


def test_a_malformed_file_is_refused_whole_kept_and_imports_nothing(bank_path, sqs_queues):
    payments, ours = _settled_payments(2)
    good = nacha_answer_file_write(
        answers=_answers(ours, payments, ["R01", "R10"]), created_at=EVENING, **BANK
    )
    lines = good.decode().splitlines()
    lines[6] = lines[6][:4] + "000009" + lines[6][10:]  # the batch control's entry count
    broken = ("\n".join(lines) + "\n").encode()
    _drop(bank_path, "broken.ach", broken)
    result = nacha_files_collect(transport=bank_path, min_age_seconds=0)

    assert result.refused == ["broken.ach"] and result.published == 0
    stored = NachaInboundFile.objects.get()
    assert stored.status == "refused" and stored.content_bytes() == broken
    assert stored.refused_record == 7 and "entry/addenda count says 9" in stored.refused_reason
    assert NachaInboundEvent.objects.count() == 0
    assert _received(sqs_queues.client, sqs_queues.url) == []
    for payment in payments:
        payment.refresh_from_db()
        assert payment.state == PaymentState.CONFIRMED


def test_an_entry_without_a_return_or_noc_addenda_refuses_the_whole_file(bank_path, sqs_queues):
    payments, _ = _settled_payments(1)
    from bank.nacha.models import NachaFile

    forward = NachaFile.objects.get().content_bytes()  # our own debit file, sent back
    _drop(bank_path, "forward.ach", forward)
    result = nacha_files_collect(transport=bank_path, min_age_seconds=0)
    stored = NachaInboundFile.objects.get()
    assert result.refused == ["forward.ach"]
    assert "without a return or NOC addenda" in stored.refused_reason
    assert stored.refused_record == 3


def test_the_collect_command_reports_what_it_imported_refused_and_queued(
    bank_path, sqs_queues, module_settings, tmp_path
):
    from io import StringIO

    from django.core.management import call_command

    module_settings.NACHA_TRANSPORT = {
        "kind": "directory",
        "outbound": str(bank_path.outbound),
        "inbound": str(bank_path.inbound),
    }
    payments, ours = _settled_payments(1)
    _drop(
        bank_path,
        "r.ach",
        nacha_answer_file_write(
            answers=_answers(ours, payments, ["R01"]), created_at=EVENING, **BANK
        ),
    )
    _drop(bank_path, "junk.ach", b"not a nacha file\n")
    out, err = StringIO(), StringIO()
    call_command("nacha_collect", "--min-age-seconds", "0", stdout=out, stderr=err)
    assert "imported 1, refused 1, seen before 0; 1 events queued, 0 dead-lettered" in (
        out.getvalue()
    )
    assert "refused: junk.ach" in err.getvalue()


def test_the_collect_command_without_a_transport_names_the_setting(module_settings):
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import call_command

    module_settings.NACHA_TRANSPORT = None
    with pytest.raises(ImproperlyConfigured, match=r"BANK\['NACHA_TRANSPORT'\]"):
        call_command("nacha_collect")


def test_an_r17_questionable_return_from_the_banks_file_blocks_the_account_everywhere(
    bank_path, sqs_queues
):
    from payments.exceptions import AccountBlocked
    from payments.models import AccountBlock
    from payments.services import payment_create

    payments, ours = _settled_payments(2)
    questionable, plain = (ours[NachaEntry.objects.get(payment=p).trace_number] for p in payments)
    content = nacha_answer_file_write(
        answers=[
            BankAnswer(questionable, "R17", addenda_information="QUESTIONABLE"),
            BankAnswer(plain, "R17"),
        ],
        created_at=EVENING,
        **BANK,
    )
    _drop(bank_path, "returns-r17.ach", content)

    nacha_files_collect(transport=bank_path, min_age_seconds=0)
    run_worker()

    [block] = AccountBlock.objects.all()
    assert (block.scope, block.return_code, block.payment_id) == ("all", "R17", payments[0].id)
    with pytest.raises(AccountBlocked):
        payment_create(
            merchant_id="m-1", amount=Decimal("5.00"), source_token=payments[0].source_token
        )
