"""Canceling on the bank backend: a canceled payment is never cut into a file, and a cancel
racing the file cut has one winner, forced both ways on PostgreSQL on the entry's row lock
(the lock the cut stores its file under)."""

from datetime import datetime
from decimal import Decimal

import pytest
from django.utils import timezone

from bank.nacha.accounts import BankAccount
from bank.nacha.models import NachaEntry, NachaFile
from bank.nacha.parser import parse_nacha
from bank.nacha.services import CANCELED_REASON, nacha_entry_add, nacha_file_cut
from bank.nacha.windows import EASTERN
from bank.vault.services import vault_account_reveal, vault_account_store
from payments.exceptions import CancelRefused
from payments.models import PaymentState
from payments.processor.backend import get_backend
from payments.services import payment_cancel, payment_create, payment_submit
from payments.services.submission import SubmitOutcome
from tests.bank.vault.conftest import ACCOUNT
from tests.factories import PaymentFactory
from tests.waiting import race_in_order

pytestmark = pytest.mark.django_db(transaction=True)

EVENING = datetime(2026, 12, 1, 20, 0, tzinfo=EASTERN)


@pytest.fixture
def bank_backend(nacha_settings):
    nacha_settings.PROCESSOR_BACKEND = "bank.nacha.backend.NachaBankBackend"
    return nacha_settings


def resolve(token: str) -> BankAccount:
    n = int("".join(c for c in token if c.isdigit()) or 0)
    return BankAccount(
        routing_number="011000015",
        account_number=f"55500{n:04d}",
        account_type="checking",
        holder_name=f"Holder {n}",
        sec_code="PPD",
    )


def _waiting_entry(amount: str = "10.00"):
    payment = PaymentFactory(amount=Decimal(amount))
    return payment, nacha_entry_add(payment_id=payment.pk)


def _lock_entry(entry: NachaEntry):
    return lambda: NachaEntry.objects.select_for_update().get(pk=entry.pk)


def _traces_in(cut_file: NachaFile) -> set[str]:
    return {e.trace_number for e in parse_nacha(cut_file.content_bytes()).entries()}


def test_a_payment_canceled_while_its_entry_waits_is_never_cut(bank_backend):
    payment, entry = _waiting_entry()
    other, other_entry = _waiting_entry("11.00")

    assert payment_cancel(payment_id=payment.pk).canceled
    cut = nacha_file_cut(now=EVENING, resolve_account=resolve)

    entry.refresh_from_db()
    assert entry.file is None and entry.refused_reason == CANCELED_REASON
    assert _traces_in(cut.file) == {other_entry.trace_number}
    assert entry not in cut.refused  # left out by the cancel, not refused by the cut


def test_a_payment_whose_entry_is_in_a_file_is_refused_as_already_submitted(bank_backend):
    payment, entry = _waiting_entry()
    nacha_file_cut(now=EVENING, resolve_account=resolve)

    with pytest.raises(CancelRefused) as refused:
        payment_cancel(payment_id=payment.pk)

    assert refused.value.rule == "already_submitted"
    payment.refresh_from_db()
    entry.refresh_from_db()
    assert payment.state == PaymentState.PENDING and entry.refused_reason == ""


@pytest.mark.parametrize("attempt", range(2))
def test_a_cut_that_takes_the_entry_lock_first_wins_and_the_cancel_is_refused(
    bank_backend, attempt
):
    payment, entry = _waiting_entry()

    cut, canceled = race_in_order(
        _lock_entry(entry),
        lambda: nacha_file_cut(now=EVENING, resolve_account=resolve),
        lambda: payment_cancel(payment_id=payment.pk),
    )

    assert cut.file is not None, cut
    assert isinstance(canceled, CancelRefused) and canceled.rule == "already_submitted", canceled
    payment.refresh_from_db()
    entry.refresh_from_db()
    assert payment.state == PaymentState.PENDING
    assert entry.file_id == cut.file.pk and _traces_in(cut.file) == {entry.trace_number}


@pytest.mark.parametrize("attempt", range(2))
def test_a_cancel_that_takes_the_entry_lock_first_wins_and_the_cut_leaves_it_out(
    bank_backend, attempt
):
    payment, entry = _waiting_entry()
    other, other_entry = _waiting_entry("11.00")

    canceled, cut = race_in_order(
        _lock_entry(entry),
        lambda: payment_cancel(payment_id=payment.pk),
        lambda: nacha_file_cut(now=EVENING, resolve_account=resolve),
    )

    assert canceled.canceled, canceled
    # The cut planned with the entry, found it refused under the lock, and planned again.
    assert cut.file is not None, cut
    assert _traces_in(cut.file) == {other_entry.trace_number}
    payment.refresh_from_db()
    entry.refresh_from_db()
    assert payment.state == PaymentState.CANCELED
    assert entry.file is None and entry.refused_reason == CANCELED_REASON
    assert NachaFile.objects.count() == 1


def test_a_cancel_after_the_worker_queued_the_entry_keeps_it_out_of_every_file(bank_backend):
    """The submission's mark is cleared once the backend says it holds the debit unsent: the
    payment may still be canceled, and the entry guards itself from then on."""
    token = vault_account_store(**ACCOUNT).token
    payment = payment_create(merchant_id="m-1", amount=Decimal("42.00"), source_token=token)

    assert payment_submit(payment_id=payment.pk).outcome == SubmitOutcome.QUEUED
    payment.refresh_from_db()
    assert get_backend().withdraws_debits
    assert payment.submission_started_at is None
    assert payment_cancel(payment_id=payment.pk).canceled
    cut = nacha_file_cut(now=timezone.now(), resolve_account=vault_account_reveal)

    assert cut.file is None
    assert NachaEntry.objects.get(payment=payment).file is None
    # A late retry of the submit message sends nothing.
    assert payment_submit(payment_id=payment.pk).outcome == SubmitOutcome.SKIPPED
