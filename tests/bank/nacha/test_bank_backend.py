"""The bank as the processor backend, end to end on the real stack: a payment waits pending
until its file is at the bank, then moves to submitted exactly once; the sandbox bank answers
by its rules and its return comes back through the queue."""

import os
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.utils import timezone

from bank.collect import nacha_files_collect
from bank.nacha.backend import NachaBankBackend
from bank.nacha.models import NachaEntry, NachaFile
from bank.nacha.services import nacha_file_cut, nacha_file_deliver
from bank.nacha.windows import EASTERN
from bank.vault.services import vault_account_reveal, vault_account_store
from callbacks.models import PaymentHold, QueueMessage
from payments.models import PaymentEvent, PaymentState, ProcessorAttempt
from payments.processor.backend import backend_class_problem
from payments.services import payment_create, payment_submit
from payments.services.submission import SubmitOutcome
from payments.signing import SignatureError
from sandbox.bank import bank_answer_files
from tests.bank.vault.conftest import ACCOUNT
from tests.callbacks.worker_support import drain, run_worker, send_body
from tests.factories import PaymentFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _payment(holder: str = "Jane Q Customer", amount: str = "42.00"):
    token = vault_account_store(**(ACCOUNT | {"holder_name": holder})).token
    return payment_create(merchant_id="m-1", amount=Decimal(amount), source_token=token)


def test_the_backend_implements_the_interface():
    assert backend_class_problem("bank.nacha.backend.NachaBankBackend") is None


def test_a_payment_stays_pending_until_its_file_is_delivered_then_is_submitted_once(bank):
    payment = _payment()
    # Queued for its file: the message is done, no retry waits for the window.
    assert payment_submit(payment_id=payment.pk).outcome == SubmitOutcome.QUEUED
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING
    attempt = ProcessorAttempt.objects.get(payment=payment)
    assert attempt.outcome == "queued" and "waits for the" in attempt.response_body
    assert attempt.retry_after_seconds is None

    cut = nacha_file_cut(
        now=timezone.now() + timedelta(days=7), resolve_account=vault_account_reveal
    )
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING  # cut, not yet at the bank
    nacha_file_deliver(file_id=cut.file.pk, transport=bank)
    nacha_file_deliver(file_id=cut.file.pk, transport=bank)  # a retry sends and submits nothing
    run_worker(relay=True)  # the submit_payment the delivery promised

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    entry = NachaEntry.objects.get(payment=payment)
    assert payment.processor_id == entry.trace_number
    submitted = PaymentEvent.objects.filter(payment=payment, to_state=PaymentState.SUBMITTED)
    assert submitted.filter(outcome="applied").count() == 1
    # Another submission (a late retry of the first message) changes nothing.
    assert str(payment_submit(payment_id=payment.pk).outcome) == "skipped"
    assert os.listdir(bank.outbound) == [cut.file.name]


def test_debit_get_reports_a_delivered_entry_as_submitted(bank):
    payment = _payment()
    backend = NachaBankBackend()
    assert payment_submit(payment_id=payment.pk).outcome == SubmitOutcome.QUEUED
    assert backend.debit_get(idempotency_key=payment.idempotency_key).found is False
    cut = nacha_file_cut(
        now=timezone.now() + timedelta(days=7), resolve_account=vault_account_reveal
    )
    nacha_file_deliver(file_id=cut.file.pk, transport=bank)
    status = backend.debit_get(idempotency_key=payment.idempotency_key)
    assert (status.found, status.status) == (True, "submitted")
    assert status.processor_id == NachaEntry.objects.get(payment=payment).trace_number


def test_an_account_the_vault_cannot_give_fails_the_payment(bank):
    # payment_create refuses an unknown vault token; a payment written around it (or whose
    # account left the vault) still fails at the cut, never debits.
    payment = PaymentFactory(merchant_id="m-1", amount=Decimal("5.00"), source_token="vtok_gone_1x")
    assert payment_submit(payment_id=payment.pk).outcome == SubmitOutcome.QUEUED
    nacha_file_cut(now=timezone.now() + timedelta(days=7), resolve_account=vault_account_reveal)
    payment_submit(payment_id=payment.pk)
    payment.refresh_from_db()
    assert payment.state == PaymentState.FAILED
    assert "no account for this token" in ProcessorAttempt.objects.latest("id").error


def test_the_bank_backend_refuses_every_callback(bank):
    with pytest.raises(SignatureError):
        NachaBankBackend().callback_verify(None)


def test_the_sandbox_bank_answers_by_its_rules_and_the_return_comes_back(bank):
    nsf, fine = _payment(holder="NSF Customer"), _payment(holder="Paying Customer")
    for payment in (nsf, fine):
        assert payment_submit(payment_id=payment.pk).outcome == SubmitOutcome.QUEUED
    call_command("nacha_send", "--now")
    run_worker(relay=True)
    written = bank_answer_files(
        outbound=bank.outbound,
        inbound=bank.inbound,
        now=datetime(2026, 12, 2, 6, 0, tzinfo=EASTERN),
    )
    result = nacha_files_collect(transport=bank, min_age_seconds=0)
    run_worker()

    assert len(written) == 1 and result.published == 1
    nsf.refresh_from_db()
    fine.refresh_from_db()
    assert nsf.state == PaymentState.FAILED  # returned R01 before it settled
    assert fine.state == PaymentState.SUBMITTED
    assert NachaFile.objects.get().delivered_at is not None
    # The sandbox answered each file once.
    assert bank_answer_files(outbound=bank.outbound, inbound=bank.inbound) == []


def test_a_delivered_entry_settles_after_its_effective_date_once_then_a_return_reverses_it(bank):
    from bank.nacha.services import nacha_entries_settle
    from payments.models import LedgerEntry

    payment = _payment(holder="NSF Later")
    assert payment_submit(payment_id=payment.pk).outcome == SubmitOutcome.QUEUED
    cut = nacha_file_cut(now=timezone.now(), resolve_account=vault_account_reveal).file
    nacha_file_deliver(file_id=cut.pk, transport=bank)
    run_worker(relay=True)
    effective = cut.effective_entry_date
    before = datetime.combine(effective, datetime.min.time(), tzinfo=EASTERN).replace(hour=16)
    after = before.replace(hour=17)

    assert nacha_entries_settle(now=before) == 0
    assert nacha_entries_settle(now=after) == 1
    assert nacha_entries_settle(now=after + timedelta(days=1)) == 0
    run_worker(relay=True)
    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert LedgerEntry.objects.filter(payment=payment).count() == 1

    bank_answer_files(outbound=bank.outbound, inbound=bank.inbound, now=after)
    nacha_files_collect(transport=bank, min_age_seconds=0)
    run_worker()
    payment.refresh_from_db()
    assert payment.state == PaymentState.RETURNED
    assert LedgerEntry.objects.filter(payment=payment, kind="reversal").count() == 1


def test_a_token_of_another_merchant_is_never_debited_for_this_one(bank):
    # payment_create refuses it (tests/bank/vault/test_token_ownership.py); the cut is the
    # second check, for a payment written around the first.
    token = vault_account_store(**(ACCOUNT | {"merchant_id": "m-other"})).token
    payment = PaymentFactory(merchant_id="m-1", amount=Decimal("9.00"), source_token=token)
    assert payment_submit(payment_id=payment.pk).outcome == SubmitOutcome.QUEUED
    cut = nacha_file_cut(
        now=timezone.now() + timedelta(days=7), resolve_account=vault_account_reveal
    )
    assert cut.file is None
    assert cut.refused[0].refused_reason == "the account token belongs to another merchant"
    payment_submit(payment_id=payment.pk)
    payment.refresh_from_db()
    assert payment.state == PaymentState.FAILED


def test_a_submission_waiting_over_a_long_weekend_spends_no_attempt_and_holds_nothing(
    bank, sqs_queues
):
    """A file waits for its window, which from a Friday evening before a Monday holiday is
    Tuesday's first: more than any retry budget. The submit message is done at once, so nothing
    is retried, dead-lettered or held behind it; the delivery's own submission moves the
    payment (the test above)."""
    payment = _payment()
    send_body(
        sqs_queues.client,
        sqs_queues.url,
        payment.id,
        {"kind": "submit_payment", "payment_id": str(payment.id)},
    )
    run_worker()

    # The message sent here, and the one the create's outbox published on commit.
    records = QueueMessage.objects.filter(group_id=str(payment.id))
    assert records.count() == 2
    assert {(r.status, r.outcome, r.attempts) for r in records} == {("done", "queued", 1)}
    assert not PaymentHold.objects.filter(payment_id=str(payment.id)).exists()
    assert drain(sqs_queues.client, sqs_queues.url) == []
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING


class _Stop(Exception):
    """Ends a repeating command's loop in a test."""


def _rounds(monkeypatch, module, count: int) -> None:
    """Let the command's loop (``payments.management.rounds``, which ``module``'s command runs in)
    sleep ``count`` times, then stop it."""
    from payments.management import rounds

    assert issubclass(module.Command, rounds.RoundsCommand)
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        if len(slept) >= count:
            raise _Stop

    monkeypatch.setattr(rounds.time, "sleep", sleep)


def test_nacha_send_every_repeats_its_round_and_a_failed_round_does_not_stop_it(bank, monkeypatch):
    from io import StringIO

    from bank.management.commands import nacha_send
    from bank.nacha.transports import TransportError

    payment = _payment()
    assert payment_submit(payment_id=payment.pk).outcome == SubmitOutcome.QUEUED
    real = nacha_send.nacha_send_due
    calls = []

    def flaky(**kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise TransportError("the bank's drop is away")
        return real(**kwargs)

    monkeypatch.setattr(nacha_send, "nacha_send_due", flaky)
    _rounds(monkeypatch, nacha_send, 3)
    out, err = StringIO(), StringIO()
    with pytest.raises(_Stop):
        call_command("nacha_send", "--now", "--every", "2", stdout=out, stderr=err)

    assert len(calls) == 3
    assert "round failed, trying again: delivery stopped: the bank's drop is away" in (
        err.getvalue()
    )
    # One file cut and delivered by the second round; the third, with nothing to do, is quiet.
    assert out.getvalue().count("cut ") == 1 and "nothing cut" not in out.getvalue()
    assert NachaFile.objects.get().delivered_at is not None


def test_nacha_collect_every_repeats_its_round_quietly_until_a_file_comes(bank, monkeypatch):
    from io import StringIO

    from bank.management.commands import nacha_collect

    _rounds(monkeypatch, nacha_collect, 2)
    out = StringIO()
    with pytest.raises(_Stop):
        call_command("nacha_collect", "--every", "1", "--min-age-seconds", "0", stdout=out)
    assert out.getvalue() == ""


@pytest.mark.parametrize("command", ["nacha_send", "nacha_collect"])
def test_a_negative_interval_is_refused(bank, command):
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="--every"):
        call_command(command, "--every", "-1")
