"""The vault seals account details with envelope encryption and mints the tokens payments
carry; what it keeps in the clear is the token and the last 4 digits."""

import base64

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection

from bank.nacha.accounts import AccountUnavailable
from bank.vault.crypto import VaultKeyError, seal, unseal
from bank.vault.keys import parse_vault_keys
from bank.vault.models import VaultAccount
from bank.vault.services import (
    VaultInputError,
    vault_account_reveal,
    vault_account_store,
    vault_keys_rotate,
)
from payments.services.create import validate_source_token
from tests.bank.vault.conftest import ACCOUNT, KEY_1, KEY_2, RAW_NUMBERS

pytestmark = pytest.mark.django_db


def test_a_stored_account_reads_back_through_its_token(vault_keys):
    account = vault_account_store(**ACCOUNT)
    revealed = vault_account_reveal(account.token)
    assert (revealed.routing_number, revealed.account_number) == RAW_NUMBERS
    assert (revealed.account_type, revealed.sec_code) == ("checking", "PPD")
    assert revealed.holder_name == "Jane Q Customer"
    assert account.account_last4 == "9012" and account.key_version == "k1"


def test_the_token_is_the_modules_own_and_passes_the_source_token_rule(vault_keys):
    tokens = {vault_account_store(**ACCOUNT).token for _ in range(20)}
    assert len(tokens) == 20
    for token in tokens:
        assert token.startswith("vtok_")
        validate_source_token(token)  # raises for anything payments would refuse


def test_no_column_of_the_stored_row_holds_a_number_in_the_clear(vault_keys):
    account = vault_account_store(**ACCOUNT)
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM payments_vaultaccount WHERE id = %s", [account.pk])
        row = cursor.fetchone()
    stored = b"".join(bytes(v) if isinstance(v, memoryview) else str(v).encode() for v in row)
    for number in RAW_NUMBERS:
        assert number.encode() not in stored
    assert b"Jane" not in stored


def test_the_repr_of_what_the_vault_reveals_shows_the_last_4_only(vault_keys):
    revealed = vault_account_reveal(vault_account_store(**ACCOUNT).token)
    for text in (repr(revealed), str(revealed), f"{revealed}"):
        assert "****9012" in text
        assert all(number not in text for number in RAW_NUMBERS)


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("routing_number", "011000016", "check digit"),
        ("routing_number", "01100001", "9 digits"),
        ("account_number", "123", "4 to 17"),
        ("account_number", "1234-5678-9012", "4 to 17"),
        ("account_number", "123456789012345678", "4 to 17"),
        ("account_type", "brokerage", "checking"),
        ("sec_code", "IAT", "PPD"),
        ("holder_name", "   ", "holder"),
    ],
    ids=["check-digit", "short-routing", "short", "dashes", "long", "type", "sec", "name"],
)
def test_a_wrong_detail_is_refused_naming_the_field_never_its_value(
    vault_keys, field, value, problem
):
    with pytest.raises(VaultInputError) as caught:
        vault_account_store(**(ACCOUNT | {field: value}))
    assert problem in " ".join(caught.value.errors[field])
    assert value.strip() == "" or value not in str(caught.value)
    assert VaultAccount.objects.count() == 0


def test_an_unknown_token_is_unavailable_not_an_error(vault_keys):
    with pytest.raises(AccountUnavailable, match="no account"):
        vault_account_reveal("vtok_nothing_here")


def test_a_ciphertext_moved_to_another_row_does_not_open(vault_keys):
    first, second = vault_account_store(**ACCOUNT), vault_account_store(**ACCOUNT)
    VaultAccount.objects.filter(pk=second.pk).update(
        wrapped_key=first.wrapped_key, nonce=first.nonce, ciphertext=first.ciphertext
    )
    with pytest.raises(AccountUnavailable, match="cannot open"):
        vault_account_reveal(second.token)
    assert vault_account_reveal(first.token).account_number == "123456789012"


def test_an_altered_ciphertext_does_not_open(vault_keys):
    account = vault_account_store(**ACCOUNT)
    altered = bytearray(bytes(account.ciphertext))
    altered[0] ^= 1
    VaultAccount.objects.filter(pk=account.pk).update(ciphertext=bytes(altered))
    with pytest.raises(AccountUnavailable, match="altered or moved"):
        vault_account_reveal(account.token)


def test_a_record_under_a_key_no_longer_configured_is_unavailable(vault_keys):
    account = vault_account_store(**ACCOUNT)
    vault_keys.VAULT_KEYS = {"k2": KEY_2}
    vault_keys.VAULT_ACTIVE_KEY = "k2"
    with pytest.raises(AccountUnavailable, match="no key-encrypting key of version 'k1'"):
        vault_account_reveal(account.token)


def test_each_record_has_its_own_data_key_wrapped_by_the_kek(vault_keys):
    a, b = seal(b"same", aad=b"t1"), seal(b"same", aad=b"t2")
    assert a.wrapped_key != b.wrapped_key and a.ciphertext != b.ciphertext
    assert unseal(a, aad=b"t1") == b"same"
    with pytest.raises(VaultKeyError):
        unseal(a, aad=b"t2")


def test_rotation_re_encrypts_every_account_in_batches_under_the_new_key(vault_keys):
    tokens = [vault_account_store(**ACCOUNT).token for _ in range(5)]
    before = {a.token: bytes(a.ciphertext) for a in VaultAccount.objects.all()}
    vault_keys.VAULT_KEYS = {"k1": KEY_1, "k2": KEY_2}
    vault_keys.VAULT_ACTIVE_KEY = "k2"
    newer = vault_account_store(**ACCOUNT)

    assert vault_keys_rotate(batch_size=2, max_batches=1) == 2
    assert VaultAccount.objects.filter(key_version="k1").count() == 3
    assert vault_keys_rotate(batch_size=2) == 3

    vault_keys.VAULT_KEYS = {"k2": KEY_2}  # the old key can go now
    for account in VaultAccount.objects.exclude(pk=newer.pk):
        assert account.key_version == "k2" and account.rotated_at is not None
        assert bytes(account.ciphertext) != before[account.token]
    assert {vault_account_reveal(t).account_number for t in tokens} == {"123456789012"}
    assert vault_keys_rotate(batch_size=2) == 0


def test_the_rotation_command_reports_and_fails_on_a_row_it_cannot_open(vault_keys, capsys):
    vault_account_store(**ACCOUNT)
    vault_keys.VAULT_KEYS = {"k1": KEY_1, "k2": KEY_2}
    vault_keys.VAULT_ACTIVE_KEY = "k2"
    call_command("vault_rotate_keys", "--batch-size", "1")
    assert (
        "re-keyed 1 records under key k2; left: 0 accounts, 0 NACHA files, 0 inbound NACHA files, "
        "0 bank statements" in capsys.readouterr().out
    )

    broken = vault_account_store(**ACCOUNT)
    VaultAccount.objects.filter(pk=broken.pk).update(key_version="k0")
    with pytest.raises(CommandError, match=f"rotation stopped: account {broken.token}: no key"):
        call_command("vault_rotate_keys")
    with pytest.raises(CommandError):
        call_command("vault_rotate_keys", "--batch-size", "0")


def test_an_active_key_that_is_not_configured_says_which_setting(vault_keys):
    vault_keys.VAULT_ACTIVE_KEY = "k9"
    with pytest.raises(ImproperlyConfigured, match=r"BANK\['VAULT_ACTIVE_KEY'\]"):
        vault_account_store(**ACCOUNT)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"k1": "not base64!"}, "not base64"),
        ({"k1": base64.b64encode(b"short").decode()}, "32 bytes"),
        ({"k 1": KEY_1}, "version"),
        ("k1", "version:base64"),
        (["k1"], "dict"),
    ],
    ids=["base64", "length", "version", "text", "list"],
)
def test_a_wrong_key_setting_is_refused_without_showing_the_key(value, problem):
    with pytest.raises(ValueError, match=problem) as caught:
        parse_vault_keys(value)
    assert KEY_1 not in str(caught.value)


def test_keys_from_the_environment_are_read_as_version_colon_base64():
    keys = parse_vault_keys(f"k1:{KEY_1}, k2:{KEY_2}")
    assert keys == {"k1": bytes(range(32)), "k2": bytes(range(32, 64))}


@pytest.mark.django_db(transaction=True)
def test_rotation_asks_the_key_holder_outside_any_transaction(vault_keys, key_holder_calls):
    # The holder may be KMS, a network away: no transaction (nor row lock) is held across it.
    for _ in range(3):
        vault_account_store(**ACCOUNT)
    vault_keys.VAULT_KEYS = {"k1": KEY_1, "k2": KEY_2}
    vault_keys.VAULT_ACTIVE_KEY = "k2"
    key_holder_calls.clear()

    assert vault_keys_rotate(batch_size=2) == 3
    assert [in_transaction for _, in_transaction in key_holder_calls] == [False] * 6
    assert set(VaultAccount.objects.values_list("key_version", flat=True)) == {"k2"}


def test_a_row_another_rotation_re_encrypted_meanwhile_keeps_that_work(vault_keys, monkeypatch):
    from bank.vault import services

    first, second = vault_account_store(**ACCOUNT), vault_account_store(**ACCOUNT)
    vault_keys.VAULT_KEYS = {"k1": KEY_1, "k2": KEY_2}
    vault_keys.VAULT_ACTIVE_KEY = "k2"
    theirs = seal(
        b'{"routing": "011000015", "account": "123456789012", "name": "Jane Q Customer"}',
        aad=first.token.encode(),
    )
    real_seal = services.seal

    def seal_while_another_rotation_writes(plaintext, *, aad):
        if aad == first.token.encode():
            VaultAccount.objects.filter(pk=first.pk).update(
                key_version=theirs.key_version,
                wrapped_key=theirs.wrapped_key,
                nonce=theirs.nonce,
                ciphertext=theirs.ciphertext,
            )
        return real_seal(plaintext, aad=aad)

    monkeypatch.setattr(services, "seal", seal_while_another_rotation_writes)

    assert vault_keys_rotate() == 1
    first.refresh_from_db()
    assert bytes(first.nonce) == theirs.nonce and first.rotated_at is None
    assert VaultAccount.objects.get(pk=second.pk).key_version == "k2"
    assert vault_account_reveal(first.token).account_number == "123456789012"


def test_the_bank_backend_says_when_an_account_was_vaulted_for_the_fraud_rules(vault_keys):
    from bank.nacha.backend import NachaBankBackend

    account = vault_account_store(**ACCOUNT)

    checked = NachaBankBackend().source_token_check(
        token=account.token, merchant_id=ACCOUNT["merchant_id"]
    )
    other = NachaBankBackend().source_token_check(token=account.token, merchant_id="someone-else")

    assert (checked.refused, checked.sec_code) == (None, "PPD")
    assert checked.changed_at == VaultAccount.objects.get(token=account.token).created_at
    assert (other.refused, other.changed_at) == ("unknown token", None)
