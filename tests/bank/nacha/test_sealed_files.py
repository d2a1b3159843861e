"""NACHA files at rest: ours and the bank's are stored only as the vault seals them, open only on
their own row, are re-keyed by the rotation, and a key holder outage loses nothing; the cut asks
the key holder outside any transaction."""

import os
from datetime import datetime, timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from bank.collect import nacha_files_collect
from bank.nacha import services
from bank.nacha.inbound import nacha_inbound_store
from bank.nacha.models import NachaEntry, NachaFile, NachaInboundFile
from bank.nacha.parser import parse_nacha
from bank.nacha.services import nacha_entry_add, nacha_file_cut, nacha_file_deliver
from bank.nacha.transports import DirectoryTransport
from bank.nacha.windows import EASTERN
from bank.vault.crypto import SettingsKeyProvider, VaultKeyError, VaultUnavailable
from bank.vault.services import vault_account_reveal, vault_account_store, vault_keys_rotate
from payments.models import Payment, PaymentState
from sandbox.bank_writer import BankAnswer, nacha_answer_file_write
from tests.bank.nacha.conftest import BANK
from tests.bank.vault.conftest import ACCOUNT, KEY_1, KEY_2
from tests.factories import PaymentFactory

pytestmark = pytest.mark.django_db(transaction=True)

EVENING = datetime(2026, 12, 1, 20, 0, tzinfo=EASTERN)
NUMBER = ACCOUNT["account_number"]  # 123456789012


@pytest.fixture
def transport(tmp_path):
    found = DirectoryTransport(outbound=str(tmp_path / "out"), inbound=str(tmp_path / "in"))
    os.makedirs(found.inbound)
    return found


def _token() -> str:
    return vault_account_store(**ACCOUNT).token


def _vaulted_payments(n: int, *, own_accounts: bool = False) -> list[Payment]:
    """``n`` payments of merchant m-1 with their entries: one vaulted account for all, or one
    each."""
    token = _token()
    payments = [
        PaymentFactory(
            source_token=_token() if own_accounts and i else token,
            amount=Decimal("25.00") + i,
            merchant_id="m-1",
        )
        for i in range(n)
    ]
    for payment in payments:
        nacha_entry_add(payment_id=payment.pk)
    return payments


def _cut(n: int = 2) -> NachaFile:
    _vaulted_payments(n)
    return nacha_file_cut(now=EVENING, resolve_account=vault_account_reveal).file


def _two_cuts() -> tuple[NachaFile, NachaFile]:
    """Two files cut five minutes apart, of one entry each."""
    first = _cut(1)
    nacha_entry_add(payment_id=PaymentFactory(source_token=_token(), merchant_id="m-1").pk)
    second = nacha_file_cut(
        now=EVENING + timedelta(minutes=5), resolve_account=vault_account_reveal
    ).file
    return first, second


def _return_file(cut: NachaFile) -> bytes:
    answers = [BankAnswer(entry, "R01") for entry in parse_nacha(cut.content_bytes()).entries()]
    return nacha_answer_file_write(answers=answers, created_at=EVENING, **BANK)


def _raw_rows(table: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table}")  # noqa: S608 - a table name of ours
        return cursor.fetchall()


def _assert_no_number_in(table: str) -> None:
    rows = _raw_rows(table)
    assert rows
    for row in rows:
        for value in row:
            if isinstance(value, memoryview | bytes):
                raw = bytes(value)
                assert NUMBER.encode() not in raw and NUMBER not in raw.hex()
                assert NUMBER.encode().hex() not in raw.hex()
            else:
                assert NUMBER not in str(value)


def _outage(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise VaultUnavailable("KMS cannot be reached to wrap a data key under key 'k1'")

    monkeypatch.setattr(SettingsKeyProvider, "wrap", refuse)
    monkeypatch.setattr(SettingsKeyProvider, "unwrap", refuse)


def test_no_column_of_a_cut_or_imported_file_holds_the_account_number(nacha_settings):
    cut = _cut()
    returns = _return_file(cut)
    assert NUMBER.encode() in cut.content_bytes() and NUMBER.encode() in returns  # in the clear

    stored = nacha_inbound_store(name="returns.ach", content=returns)

    assert stored.created and stored.file.status == "imported"
    _assert_no_number_in(NachaFile._meta.db_table)
    _assert_no_number_in(NachaInboundFile._meta.db_table)


def test_each_file_opens_to_its_bytes_under_a_data_key_of_its_own(nacha_settings):
    cut = _cut()
    stored = nacha_inbound_store(name="returns.ach", content=_return_file(cut)).file
    cut, stored = NachaFile.objects.get(pk=cut.pk), NachaInboundFile.objects.get(pk=stored.pk)

    assert len(list(parse_nacha(cut.content_bytes()).entries())) == 2
    assert stored.content_bytes() == _return_file(cut)
    assert cut.key_version == stored.key_version == "k1"
    assert bytes(cut.wrapped_key) != bytes(stored.wrapped_key)


def test_a_sealed_outbound_file_moved_to_another_row_does_not_open(nacha_settings):
    first, second = _two_cuts()
    NachaFile.objects.filter(pk=second.pk).update(
        key_version=first.key_version,
        wrapped_key=first.wrapped_key,
        nonce=first.nonce,
        ciphertext=first.ciphertext,
    )

    with pytest.raises(VaultKeyError, match="does not open"):
        NachaFile.objects.get(pk=second.pk).content_bytes()
    assert NachaFile.objects.get(pk=first.pk).content_bytes()


def test_a_sealed_inbound_file_moved_to_another_row_does_not_open(nacha_settings):
    cut = _cut()
    first = nacha_inbound_store(name="returns.ach", content=_return_file(cut)).file
    second = nacha_inbound_store(name="broken.ach", content=b"not a NACHA file\n").file
    assert second.status == "refused"
    NachaInboundFile.objects.filter(pk=second.pk).update(
        wrapped_key=first.wrapped_key, nonce=first.nonce, ciphertext=first.ciphertext
    )

    with pytest.raises(VaultKeyError, match="does not open"):
        NachaInboundFile.objects.get(pk=second.pk).content_bytes()


def test_a_file_whose_hash_was_changed_does_not_open(nacha_settings):
    cut = _cut(1)
    NachaFile.objects.filter(pk=cut.pk).update(sha256="0" * 64)
    with pytest.raises(VaultKeyError):
        NachaFile.objects.get(pk=cut.pk).content_bytes()


def test_delivery_sends_the_opened_bytes_and_a_retry_after_an_outage_delivers(
    nacha_settings, transport, monkeypatch
):
    cut = _cut()
    clear = cut.content_bytes()
    with monkeypatch.context() as outage:
        _outage(outage)
        with pytest.raises(VaultUnavailable):
            nacha_file_deliver(file_id=cut.pk, transport=transport)
    assert NachaFile.objects.get(pk=cut.pk).delivered_at is None
    assert not os.path.exists(os.path.join(transport.outbound, cut.name))

    delivered = nacha_file_deliver(file_id=cut.pk, transport=transport)

    assert delivered.delivered_at is not None
    with open(os.path.join(transport.outbound, cut.name), "rb") as handle:
        assert handle.read() == clear


def test_a_key_holder_outage_during_the_cut_stores_nothing_and_the_next_cut_takes_all(
    nacha_settings, monkeypatch
):
    _vaulted_payments(3)
    with monkeypatch.context() as outage:
        _outage(outage)
        with pytest.raises(VaultUnavailable):
            nacha_file_cut(now=EVENING, resolve_account=vault_account_reveal)
    assert NachaFile.objects.count() == 0
    assert NachaEntry.objects.filter(file__isnull=True, refused_reason="").count() == 3

    cut = nacha_file_cut(now=EVENING, resolve_account=vault_account_reveal)

    assert cut.refused == [] and cut.file.entry_count == 3


def test_a_key_holder_outage_while_sealing_the_file_stores_nothing(nacha_settings, monkeypatch):
    _vaulted_payments(2)

    def refuse(*args, **kwargs):
        raise VaultUnavailable("KMS refused to wrap a data key under key 'k1': ThrottlingException")

    monkeypatch.setattr(services, "content_seal", refuse)
    with pytest.raises(VaultUnavailable):
        nacha_file_cut(now=EVENING, resolve_account=vault_account_reveal)

    assert NachaFile.objects.count() == 0
    assert NachaEntry.objects.filter(file__isnull=True, refused_reason="").count() == 2


def test_a_key_holder_outage_during_collection_leaves_the_file_in_the_drop(
    nacha_settings, transport, monkeypatch
):
    returns = _return_file(_cut())
    with open(os.path.join(transport.inbound, "returns.ach"), "wb") as handle:
        handle.write(returns)
    with monkeypatch.context() as outage:
        _outage(outage)
        with pytest.raises(VaultUnavailable):
            nacha_files_collect(transport=transport, min_age_seconds=0)
    assert NachaInboundFile.objects.count() == 0
    assert os.listdir(transport.inbound) == ["returns.ach"]

    stored = nacha_inbound_store(name="returns.ach", content=transport.read("returns.ach"))

    assert stored.file.status == "imported" and stored.file.content_bytes() == returns


def test_the_cut_asks_the_key_holder_outside_any_transaction(nacha_settings, key_holder_calls):
    # With KMS each reveal and each seal is a network call: none may hold the entries' or the
    # counter's locks (nor any transaction) while it waits.
    _vaulted_payments(3, own_accounts=True)
    key_holder_calls.clear()

    cut = nacha_file_cut(now=EVENING, resolve_account=vault_account_reveal)

    assert cut.file.entry_count == 3
    # Three reveals of the account (one each) and the file's seal, none in a transaction.
    assert key_holder_calls == [("unwrap", False)] * 3 + [("wrap", False)]


def test_an_entry_whose_payment_fails_while_the_cut_reveals_is_left_out_the_rest_go(
    nacha_settings,
):
    payments = _vaulted_payments(3)
    failing = payments[1]

    def reveal_while_a_payment_fails(token):
        Payment.objects.filter(pk=failing.pk).update(state=PaymentState.FAILED)
        return vault_account_reveal(token)

    cut = nacha_file_cut(now=EVENING, resolve_account=reveal_while_a_payment_fails)

    assert [entry.payment_id for entry in cut.refused] == [failing.pk]
    traces = {e.trace_number for e in parse_nacha(cut.file.content_bytes()).entries()}
    assert traces == {
        NachaEntry.objects.get(payment=p).trace_number for p in (payments[0], payments[2])
    }
    assert set(cut.file.entries.values_list("payment_id", flat=True)) == {
        payments[0].pk,
        payments[2].pk,
    }


def test_entries_another_cut_took_meanwhile_are_in_its_file_only(nacha_settings, monkeypatch):
    _vaulted_payments(2)
    real_plan = services._cut_plan
    rival = []

    def plan_while_another_cut_runs(**kwargs):
        plan = real_plan(**kwargs)
        if not rival:  # the other cut, between this one's plan and its locks
            rival.append(real_plan(**kwargs))
            services._cut_store(
                rival[0], window=kwargs["window"], originator=kwargs["originator"], refused=[]
            )
        return plan

    monkeypatch.setattr(services, "_cut_plan", plan_while_another_cut_runs)

    mine = nacha_file_cut(now=EVENING, resolve_account=vault_account_reveal)

    assert mine.file is None and mine.refused == []
    [only] = NachaFile.objects.all()
    assert only.entry_count == 2 and only.entries.count() == 2
    assert len(list(parse_nacha(only.content_bytes()).entries())) == 2


def test_rotation_re_wraps_the_data_keys_of_both_kinds_of_files_in_batches(nacha_settings):
    cut = _cut()
    stored = nacha_inbound_store(name="returns.ach", content=_return_file(cut)).file
    nacha_inbound_store(name="broken.ach", content=b"not a NACHA file\n")
    clear = {NachaFile: {cut.pk: cut.content_bytes()}, NachaInboundFile: {}}
    for row in NachaInboundFile.objects.all():
        clear[NachaInboundFile][row.pk] = row.content_bytes()
    ciphertexts = {row.pk: bytes(row.ciphertext) for row in NachaInboundFile.objects.all()}
    nacha_settings.VAULT_KEYS = {"k1": KEY_1, "k2": KEY_2}
    nacha_settings.VAULT_ACTIVE_KEY = "k2"

    # One account, one file, two bank files: a batch of 1 at a time, two batches this run.
    assert vault_keys_rotate(batch_size=1, max_batches=2) == 2
    assert NachaFile.objects.get().key_version == "k2"
    assert NachaInboundFile.objects.filter(key_version="k1").count() == 2
    assert vault_keys_rotate(batch_size=1) == 2

    nacha_settings.VAULT_KEYS = {"k2": KEY_2}  # the old key is gone: everything still opens
    for model, rows in clear.items():
        for pk, content in rows.items():
            row = model.objects.get(pk=pk)
            assert row.key_version == "k2" and row.content_bytes() == content
    for row in NachaInboundFile.objects.all():
        assert bytes(row.ciphertext) == ciphertexts[row.pk]  # only the data key re-wrapped
    assert stored.pk in clear[NachaInboundFile]


def test_rotation_of_files_asks_the_key_holder_outside_any_transaction(
    nacha_settings, key_holder_calls
):
    cut = _cut(1)
    nacha_inbound_store(name="returns.ach", content=_return_file(cut))
    nacha_settings.VAULT_KEYS = {"k1": KEY_1, "k2": KEY_2}
    nacha_settings.VAULT_ACTIVE_KEY = "k2"
    key_holder_calls.clear()

    assert vault_keys_rotate(batch_size=1) == 3  # the account and the two files
    assert [in_transaction for _, in_transaction in key_holder_calls] == [False] * 6


def test_rotation_stops_at_a_file_that_does_not_open_naming_it(nacha_settings):
    first, second = _two_cuts()
    NachaFile.objects.filter(pk=second.pk).update(
        wrapped_key=first.wrapped_key, nonce=first.nonce, ciphertext=first.ciphertext
    )
    nacha_settings.VAULT_KEYS = {"k1": KEY_1, "k2": KEY_2}
    nacha_settings.VAULT_ACTIVE_KEY = "k2"

    with pytest.raises(VaultKeyError, match=f"NACHA file {second.pk}: "):
        vault_keys_rotate()
    assert NachaFile.objects.get(pk=second.pk).key_version == "k1"


def test_the_rotation_command_reports_files_left_under_another_key(nacha_settings, capsys):
    _cut(1)
    nacha_settings.VAULT_KEYS = {"k1": KEY_1, "k2": KEY_2}
    nacha_settings.VAULT_ACTIVE_KEY = "k2"

    call_command("vault_rotate_keys", "--batch-size", "5")

    assert (
        "re-keyed 2 records under key k2; left: 0 accounts, 0 NACHA files, 0 inbound NACHA files, "
        "0 bank statements" in capsys.readouterr().out
    )
    assert NachaFile.objects.get().key_version == "k2"


def test_the_send_command_stops_its_round_naming_the_vault_and_the_next_round_sends(
    nacha_settings, transport, monkeypatch
):
    nacha_settings.NACHA_TRANSPORT = {
        "kind": "directory",
        "outbound": str(transport.outbound),
        "inbound": str(transport.inbound),
    }
    _vaulted_payments(2)
    with monkeypatch.context() as outage:
        _outage(outage)
        with pytest.raises(CommandError, match="delivery stopped, vault unavailable: KMS cannot"):
            call_command("nacha_send", "--now")
    assert NachaFile.objects.count() == 0
    assert not transport.outbound.exists() or not os.listdir(transport.outbound)

    out = StringIO()
    call_command("nacha_send", "--now", stdout=out)

    [cut] = NachaFile.objects.all()
    assert f"cut {cut.name}: 2 entries" in out.getvalue()
    assert sorted(os.listdir(transport.outbound)) == [cut.name]


def test_the_collect_command_stops_its_round_naming_the_vault_and_the_next_round_imports(
    nacha_settings, transport, monkeypatch, sqs_queues
):
    nacha_settings.NACHA_TRANSPORT = {
        "kind": "directory",
        "outbound": str(transport.outbound),
        "inbound": str(transport.inbound),
    }
    returns = _return_file(_cut())
    with open(os.path.join(transport.inbound, "returns.ach"), "wb") as handle:
        handle.write(returns)
    with monkeypatch.context() as outage:
        _outage(outage)
        with pytest.raises(CommandError, match="collection stopped, vault unavailable: KMS"):
            call_command("nacha_collect", "--min-age-seconds", "0")
    assert NachaInboundFile.objects.count() == 0
    assert os.listdir(transport.inbound) == ["returns.ach"]

    out = StringIO()
    call_command("nacha_collect", "--min-age-seconds", "0", stdout=out)

    assert "imported 1, refused 0" in out.getvalue()
    assert NachaInboundFile.objects.get().content_bytes() == returns
