"""The vault's keys held by KMS, against LocalStack's KMS over real HTTP (no stand-in).

Run by ``make test-slow`` (LOCALSTACK_TESTS, ``TEST_SQS_SERVER=localstack``): the session's
LocalStack serves SQS and KMS; the fauxqs run leaves these tests out (``localstack_only``).
Each test makes KMS keys of its own, so none depends on another's keys or their state.
"""

import base64
import logging
import time
from datetime import datetime

import boto3
import pytest
from django.core.management import CommandError, call_command

from bank.nacha.accounts import AccountUnavailable
from bank.nacha.inbound import nacha_inbound_store
from bank.nacha.models import NachaEntry, NachaFile, NachaInboundFile
from bank.nacha.services import nacha_entry_add, nacha_file_cut
from bank.nacha.windows import EASTERN
from bank.vault.crypto import VaultKeyError, VaultUnavailable, key_provider
from bank.vault.kms import CONTEXT_KEY
from bank.vault.models import VaultAccount
from bank.vault.services import vault_account_reveal, vault_account_store, vault_keys_rotate
from tests.bank.nacha.conftest import ORIGINATOR_SETTING
from tests.bank.vault.conftest import ACCOUNT, RAW_NUMBERS
from tests.factories import PaymentFactory, grant

pytestmark = [pytest.mark.django_db, pytest.mark.localstack_only]
REGION = "us-east-1"
# A loopback port nothing listens on: KMS unreachable.
CLOSED_ENDPOINT = "http://127.0.0.1:9"
EVENING = datetime(2026, 12, 1, 20, 0, tzinfo=EASTERN)


@pytest.fixture
def kms(local_sqs):
    """A KMS client of the test's own on the session's LocalStack."""
    return boto3.client("kms", endpoint_url=local_sqs.endpoint_url, region_name=REGION)


@pytest.fixture
def kms_keys(kms):
    """Two fresh KMS keys' ARNs: versions k1 and k2."""
    return {version: kms.create_key()["KeyMetadata"]["Arn"] for version in ("k1", "k2")}


@pytest.fixture
def kms_vault(module_settings, local_sqs, kms_keys):
    module_settings.VAULT_KEY_PROVIDER = "bank.vault.kms.KmsKeyProvider"
    module_settings.VAULT_KMS_KEYS = {"k1": kms_keys["k1"]}
    module_settings.VAULT_ACTIVE_KEY = "k1"
    module_settings.VAULT_KMS_REGION = REGION
    module_settings.VAULT_KMS_ENDPOINT_URL = local_sqs.endpoint_url
    module_settings.VAULT_KMS_TIMEOUT_SECONDS = 2
    return module_settings


def _kms_decrypt_file(kms, cut: NachaFile | NachaInboundFile) -> dict:
    """A sealed file's wrapped key opened by KMS itself (kept out of the captured log)."""
    return kms.decrypt(
        CiphertextBlob=bytes(cut.wrapped_key),
        EncryptionContext={CONTEXT_KEY: "dek:" + cut.content_aad().decode()},
    )


def _cut_with_kms(settings) -> NachaFile:
    """A file of one vaulted payment, cut and sealed through KMS."""
    settings.NACHA_ORIGINATOR = dict(ORIGINATOR_SETTING)
    token = vault_account_store(**ACCOUNT).token
    nacha_entry_add(payment_id=PaymentFactory(source_token=token, merchant_id="m-1").pk)
    cut = nacha_file_cut(now=EVENING, resolve_account=vault_account_reveal).file
    assert cut.key_version == "k1" and ACCOUNT["account_number"].encode() in cut.content_bytes()
    return cut


def _kms_decrypt(kms, account: VaultAccount) -> dict:
    """The record's wrapped key opened by KMS itself, under the context the vault binds."""
    return kms.decrypt(
        CiphertextBlob=bytes(account.wrapped_key),
        EncryptionContext={CONTEXT_KEY: f"dek:{account.token}"},
    )


def test_an_account_stored_through_kms_reads_back_and_its_data_key_is_wrapped_by_kms(
    kms_vault, kms, kms_keys
):
    account = vault_account_store(**ACCOUNT)

    revealed = vault_account_reveal(account.token)
    assert (revealed.routing_number, revealed.account_number) == RAW_NUMBERS
    assert account.key_version == "k1"
    answer = _kms_decrypt(kms, account)
    assert answer["KeyId"] == kms_keys["k1"] and len(answer["Plaintext"]) == 32
    assert key_provider().__class__.__name__ == "KmsKeyProvider"


def test_rotation_moves_every_account_from_one_kms_key_to_another(kms_vault, kms, kms_keys, capsys):
    tokens = [vault_account_store(**ACCOUNT).token for _ in range(3)]
    kms_vault.VAULT_KMS_KEYS = {"k1": kms_keys["k1"], "k2": kms_keys["k2"]}
    kms_vault.VAULT_ACTIVE_KEY = "k2"

    call_command("vault_rotate_keys", "--batch-size", "2")

    assert (
        "re-keyed 3 records under key k2; left: 0 accounts, 0 NACHA files, 0 inbound NACHA files, "
        "0 bank statements" in capsys.readouterr().out
    )
    for account in VaultAccount.objects.all():
        assert account.key_version == "k2" and account.rotated_at is not None
        assert _kms_decrypt(kms, account)["KeyId"] == kms_keys["k2"]
    # The old key can go: nothing needs it any more.
    kms.disable_key(KeyId=kms_keys["k1"])
    kms_vault.VAULT_KMS_KEYS = {"k2": kms_keys["k2"]}
    assert {vault_account_reveal(t).account_number for t in tokens} == {"123456789012"}


def test_rotation_re_wraps_the_sealed_files_data_keys_under_the_other_kms_key(
    kms_vault, kms, kms_keys
):
    cut = _cut_with_kms(kms_vault)
    bank_file = nacha_inbound_store(name="broken.ach", content=b"not a NACHA file\n").file
    kms_vault.VAULT_KMS_KEYS = {"k1": kms_keys["k1"], "k2": kms_keys["k2"]}
    kms_vault.VAULT_ACTIVE_KEY = "k2"

    assert vault_keys_rotate(batch_size=1) == 3  # the account, our file, the bank's file

    kms.disable_key(KeyId=kms_keys["k1"])  # the old key is no longer needed
    cut = NachaFile.objects.get(pk=cut.pk)
    assert cut.key_version == "k2" and _kms_decrypt_file(kms, cut)["KeyId"] == kms_keys["k2"]
    assert ACCOUNT["account_number"].encode() in cut.content_bytes()
    bank_file = NachaInboundFile.objects.get(pk=bank_file.pk)
    assert bank_file.content_bytes() == b"not a NACHA file\n"


def test_a_wrapped_key_moved_to_another_record_is_refused_by_kms(kms_vault):
    first, second = vault_account_store(**ACCOUNT), vault_account_store(**ACCOUNT)
    VaultAccount.objects.filter(pk=second.pk).update(
        wrapped_key=first.wrapped_key, nonce=first.nonce, ciphertext=first.ciphertext
    )

    with pytest.raises(AccountUnavailable, match="InvalidCiphertextException"):
        vault_account_reveal(second.token)
    with pytest.raises(VaultKeyError, match="does not open under key 'k1'"):
        key_provider().unwrap("k1", bytes(first.wrapped_key), aad=f"dek:{second.token}".encode())
    assert vault_account_reveal(first.token).account_number == "123456789012"


def test_a_record_whose_version_names_another_kms_key_is_refused(kms_vault, kms_keys):
    account = vault_account_store(**ACCOUNT)
    # k1 now names a key that did not wrap the record: KMS refuses, the blob is not tried.
    kms_vault.VAULT_KMS_KEYS = {"k1": kms_keys["k2"]}

    with pytest.raises(AccountUnavailable, match="IncorrectKeyException"):
        vault_account_reveal(account.token)


def test_kms_unreachable_is_the_vaults_unavailable_error_and_stores_nothing(
    kms_vault, api_client, user
):
    account = vault_account_store(**ACCOUNT)
    kms_vault.VAULT_KMS_ENDPOINT_URL = CLOSED_ENDPOINT
    grant(user, "m-1")

    started = time.monotonic()
    with pytest.raises(VaultUnavailable, match="KMS cannot be reached .* key 'k1'"):
        vault_account_store(**ACCOUNT)
    with pytest.raises(VaultUnavailable, match="KMS cannot be reached"):
        vault_account_reveal(account.token)
    response = api_client.post("/api/vault/accounts/", ACCOUNT, format="json")

    assert time.monotonic() - started < 20
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "vault_unavailable"
    assert VaultAccount.objects.count() == 1


def test_a_file_cut_while_kms_is_unreachable_refuses_no_entry_and_cuts_once_it_answers(
    kms_vault, local_sqs
):
    kms_vault.NACHA_ORIGINATOR = dict(ORIGINATOR_SETTING)
    token = vault_account_store(**ACCOUNT).token
    nacha_entry_add(payment_id=PaymentFactory(source_token=token, merchant_id="m-1").pk)
    now = datetime(2026, 12, 1, 20, 0, tzinfo=EASTERN)
    kms_vault.VAULT_KMS_ENDPOINT_URL = CLOSED_ENDPOINT

    with pytest.raises(VaultUnavailable):
        nacha_file_cut(now=now, resolve_account=vault_account_reveal)
    [entry] = NachaEntry.objects.all()
    assert entry.refused_reason == "" and entry.file_id is None

    kms_vault.VAULT_KMS_ENDPOINT_URL = local_sqs.endpoint_url
    cut = nacha_file_cut(now=now, resolve_account=vault_account_reveal)
    assert cut.refused == [] and "123456789012" in cut.file.content_bytes().decode()


def test_a_disabled_kms_key_is_refused_as_unavailable_and_nothing_is_lost(kms_vault, kms, kms_keys):
    account = vault_account_store(**ACCOUNT)
    kms.disable_key(KeyId=kms_keys["k1"])

    with pytest.raises(VaultUnavailable, match="'k1': DisabledException"):
        vault_account_reveal(account.token)
    with pytest.raises(VaultUnavailable, match="DisabledException"):
        vault_account_store(**ACCOUNT)

    kms.enable_key(KeyId=kms_keys["k1"])
    assert vault_account_reveal(account.token).account_number == "123456789012"


def test_a_kms_key_scheduled_for_deletion_is_refused_and_stops_the_rotation(
    kms_vault, kms, kms_keys
):
    account = vault_account_store(**ACCOUNT)
    kms_vault.VAULT_KMS_KEYS = {"k1": kms_keys["k1"], "k2": kms_keys["k2"]}
    kms_vault.VAULT_ACTIVE_KEY = "k2"
    kms.schedule_key_deletion(KeyId=kms_keys["k1"], PendingWindowInDays=7)

    with pytest.raises(VaultUnavailable, match="KMSInvalidStateException"):
        vault_account_reveal(account.token)
    with pytest.raises(
        CommandError,
        match=f"rotation stopped: account {account.token}: .*'k1': KMSInvalidStateException",
    ):
        call_command("vault_rotate_keys")
    assert VaultAccount.objects.get().key_version == "k1"

    # Deletion cancelled in its waiting period: the key, and the record, are back.
    kms.cancel_key_deletion(KeyId=kms_keys["k1"])
    kms.enable_key(KeyId=kms_keys["k1"])
    assert vault_keys_rotate() == 1
    assert vault_account_reveal(account.token).account_number == "123456789012"


def test_nothing_sensitive_reaches_a_message_or_a_log_line(kms_vault, kms, kms_keys, caplog):
    # Every logger at INFO (as deployed), the module's own at DEBUG, and botocore at DEBUG: it
    # then logs request parameters and response bodies, a data key among them.
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="payments")
    caplog.set_level(logging.DEBUG, logger="botocore")
    account = vault_account_store(**ACCOUNT)
    data_key = _kms_decrypt(kms, account)["Plaintext"]
    # The test's own KMS call is no vault call: botocore logs its body, the data key in it.
    own = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("botocore"))
    assert base64.b64encode(data_key).decode() in own
    caplog.clear()
    assert vault_account_reveal(account.token).account_number == ACCOUNT["account_number"]
    cut_file = _cut_with_kms(kms_vault)
    moved = vault_account_store(**ACCOUNT)
    VaultAccount.objects.filter(pk=moved.pk).update(wrapped_key=account.wrapped_key)
    messages = []

    def failure(call, *args):
        with pytest.raises((VaultUnavailable, VaultKeyError, AccountUnavailable)) as caught:
            call(*args)
        messages.append(f"{caught.value!r} {caught.value}")

    failure(vault_account_reveal, moved.token)
    kms.disable_key(KeyId=kms_keys["k1"])
    failure(vault_account_reveal, account.token)
    failure(lambda: vault_account_store(**ACCOUNT))
    kms.enable_key(KeyId=kms_keys["k1"])
    kms_vault.VAULT_KMS_ENDPOINT_URL = CLOSED_ENDPOINT
    failure(vault_account_reveal, account.token)
    failure(lambda: vault_account_store(**ACCOUNT))

    kms.disable_key(KeyId=kms_keys["k2"])  # a call of the test's own, logged at DEBUG

    assert len(messages) == 5
    logged = "\n".join(f"{r.getMessage()} {r.__dict__} {r.exc_text or ''}" for r in caplog.records)
    assert "vault key holder unavailable" in logged
    assert "OperationModel(name=DisableKey)" in logged  # botocore's DEBUG reached the log
    file_key = _kms_decrypt_file(kms, cut_file)["Plaintext"]
    secrets = [
        *RAW_NUMBERS,
        ACCOUNT["holder_name"],
        base64.b64encode(data_key).decode(),
        data_key.hex(),
        repr(data_key)[2:-1],
        base64.b64encode(bytes(account.wrapped_key)).decode(),
        base64.b64encode(file_key).decode(),
        file_key.hex(),
        base64.b64encode(bytes(cut_file.wrapped_key)).decode(),
    ]
    for text in (*messages, logged):
        for secret in secrets:
            assert secret not in text
