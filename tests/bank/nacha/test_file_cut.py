"""Cutting files: each payment's entry gets one trace number and goes into exactly one file,
whatever is retried or runs at once."""

import threading
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection

from bank.nacha import services
from bank.nacha.accounts import AccountUnavailable, BankAccount
from bank.nacha.models import NachaEntry, NachaFile
from bank.nacha.parser import parse_nacha
from bank.nacha.services import nacha_entry_add, nacha_file_cut
from bank.nacha.windows import EASTERN
from tests.factories import PaymentFactory

pytestmark = pytest.mark.django_db

MORNING = datetime(2026, 12, 1, 9, 55, tzinfo=EASTERN)  # 5 minutes before same_day_1 closes
EVENING = datetime(2026, 12, 1, 20, 0, tzinfo=EASTERN)


def resolve(token: str) -> BankAccount:
    """Accounts as the vault would give them (the vault's own tests cover the vault)."""
    if token.startswith("tok_closed"):
        raise AccountUnavailable("the account is closed")
    n = int("".join(c for c in token if c.isdigit()) or 0)
    return BankAccount(
        routing_number="011000015",
        account_number=f"55500{n:04d}",
        account_type="checking",
        holder_name=f"Holder {n}",
        sec_code="WEB" if n % 2 else "PPD",
    )


def test_a_payment_gets_one_trace_number_however_often_its_entry_is_added(nacha_settings):
    payment = PaymentFactory()
    first = nacha_entry_add(payment_id=payment.pk)
    again = nacha_entry_add(payment_id=payment.pk)
    other = nacha_entry_add(payment_id=PaymentFactory().pk)
    assert first.pk == again.pk and first.trace_number == again.trace_number
    assert first.trace_number == "021000020000001"
    assert other.trace_number == "021000020000002"
    assert payment.nacha_entry.trace_number == first.trace_number


def test_the_cut_puts_every_waiting_entry_in_one_file_and_a_retry_cuts_nothing(nacha_settings):
    payments = [PaymentFactory(amount=Decimal("10.00") + n) for n in range(3)]
    for payment in payments:
        nacha_entry_add(payment_id=payment.pk)

    cut = nacha_file_cut(now=EVENING, resolve_account=resolve)
    again = nacha_file_cut(now=EVENING + timedelta(minutes=1), resolve_account=resolve)

    assert again.file is None
    assert cut.window.name == "next_day" and cut.file.effective_entry_date.isoformat() == (
        "2026-12-02"
    )
    parsed = parse_nacha(cut.file.content_bytes())
    read = {e.trace_number: e.amount_cents for e in parsed.entries()}
    assert read == {p.nacha_entry.trace_number: int(p.amount * 100) for p in payments}
    assert cut.file.entry_count == 3 and cut.file.total_debit_cents == sum(read.values())
    assert set(NachaEntry.objects.values_list("file", flat=True)) == {cut.file.pk}
    assert cut.file.name == "20261201-A-next_day.ach"


def test_a_later_cut_of_the_same_day_takes_the_next_modifier(nacha_settings):
    nacha_entry_add(payment_id=PaymentFactory().pk)
    first = nacha_file_cut(now=EVENING, resolve_account=resolve).file
    nacha_entry_add(payment_id=PaymentFactory().pk)
    second = nacha_file_cut(now=EVENING + timedelta(hours=1), resolve_account=resolve).file
    assert (first.file_id_modifier, second.file_id_modifier) == ("A", "B")
    assert len(list(parse_nacha(second.content_bytes()).entries())) == 1


def test_the_cut_waits_until_the_window_is_within_the_lead(nacha_settings):
    nacha_entry_add(payment_id=PaymentFactory().pk)
    early = nacha_file_cut(
        now=MORNING - timedelta(hours=1), resolve_account=resolve, lead=timedelta(minutes=10)
    )
    due = nacha_file_cut(now=MORNING, resolve_account=resolve, lead=timedelta(minutes=10))
    assert early.file is None and early.window.name == "same_day_1"
    assert due.file is not None and due.file.window_name == "same_day_1"
    assert due.file.effective_entry_date.isoformat() == "2026-12-01"


def test_a_same_day_window_leaves_an_entry_over_a_million_for_the_next_day(nacha_settings):
    small = PaymentFactory(amount=Decimal("999999.99"))
    large = PaymentFactory(amount=Decimal("1000000.01"))
    for payment in (small, large):
        nacha_entry_add(payment_id=payment.pk)
    same_day = nacha_file_cut(now=MORNING, resolve_account=resolve).file
    next_day = nacha_file_cut(now=EVENING, resolve_account=resolve).file
    assert [e.payment_id for e in same_day.entries.all()] == [small.pk]
    assert [e.payment_id for e in next_day.entries.all()] == [large.pk]


def test_an_account_the_vault_refuses_is_left_out_and_marked_the_rest_go(nacha_settings):
    good = PaymentFactory(source_token="tok_bank_0001abc")
    closed = PaymentFactory(source_token="tok_closed_0002")
    for payment in (good, closed):
        nacha_entry_add(payment_id=payment.pk)
    cut = nacha_file_cut(now=EVENING, resolve_account=resolve)
    assert [e.payment_id for e in cut.refused] == [closed.pk]
    closed_entry = NachaEntry.objects.get(payment=closed)
    assert closed_entry.refused_reason == "the account is closed" and closed_entry.file is None
    assert [e.payment_id for e in cut.file.entries.all()] == [good.pk]
    assert nacha_file_cut(now=EVENING, resolve_account=resolve).file is None


def test_a_cut_that_fails_leaves_every_entry_waiting(nacha_settings, monkeypatch):
    nacha_entry_add(payment_id=PaymentFactory().pk)

    def broken(**kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(services, "nacha_file_write", broken)
    with pytest.raises(RuntimeError):
        nacha_file_cut(now=EVENING, resolve_account=resolve)
    assert NachaFile.objects.count() == 0
    assert NachaEntry.objects.filter(file__isnull=True).count() == 1


def test_the_37th_file_of_a_day_is_refused(nacha_settings, monkeypatch):
    nacha_entry_add(payment_id=PaymentFactory().pk)
    monkeypatch.setattr(services, "FILE_ID_MODIFIERS", "A")
    NachaFile.objects.create(
        window_name="next_day",
        bank_cutoff_at=EVENING,
        effective_entry_date=EVENING.date(),
        creation_date=EVENING.date(),
        file_id_modifier="A",
        name="x",
        sha256="",
        entry_count=0,
        total_debit_cents=0,
    )
    with pytest.raises(services.FilesExhausted):
        nacha_file_cut(now=EVENING, resolve_account=resolve)
    assert NachaEntry.objects.filter(file__isnull=True).count() == 1


def test_the_bank_path_unset_says_which_setting_is_missing(module_settings):
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match=r"BANK\['NACHA_ORIGINATOR'\]"):
        nacha_entry_add(payment_id=PaymentFactory().pk)


@pytest.mark.django_db(transaction=True)
def test_concurrent_cuts_and_adds_put_each_entry_in_exactly_one_file(nacha_settings):
    payments = [PaymentFactory() for _ in range(30)]
    errors = []

    def add(chunk):
        try:
            for payment in chunk:
                nacha_entry_add(payment_id=payment.pk)
                nacha_entry_add(payment_id=payment.pk)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    def cut(minute):
        try:
            for step in range(5):
                nacha_file_cut(
                    now=EVENING + timedelta(minutes=minute + step), resolve_account=resolve
                )
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=add, args=(payments[i::3],)) for i in range(3)]
    threads += [threading.Thread(target=cut, args=(m,)) for m in (0, 10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    nacha_file_cut(now=EVENING + timedelta(hours=1), resolve_account=resolve)

    assert errors == []
    assert NachaEntry.objects.count() == 30
    traces = []
    for cut_file in NachaFile.objects.all():
        traces += [e.trace_number for e in parse_nacha(cut_file.content_bytes()).entries()]
    assert sorted(traces) == sorted(NachaEntry.objects.values_list("trace_number", flat=True))
    assert len(set(traces)) == 30


def test_an_entry_whose_payment_is_no_longer_pending_is_left_out(nacha_settings):
    from payments.models import Payment

    gone = PaymentFactory()
    nacha_entry_add(payment_id=gone.pk)
    Payment.objects.filter(pk=gone.pk).update(state="failed")
    cut = nacha_file_cut(now=EVENING, resolve_account=resolve)
    assert cut.file is None
    assert cut.refused[0].refused_reason == "the payment is failed, not pending"
