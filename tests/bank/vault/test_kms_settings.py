"""The KMS key holder's settings and start-up checks: no KMS is called (the KMS itself is
tests/bank/vault/test_kms.py's, against LocalStack)."""

import pytest

from bank import conf
from bank.checks import bank_setting_values_check, vault_key_provider_check
from bank.vault.crypto import VaultKeyError
from bank.vault.keys import parse_kms_keys
from bank.vault.kms import KmsKeyProvider
from config.settings.environment import app_settings_from_environ

ARN_1 = "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
ARN_2 = "arn:aws:kms:us-east-1:111122223333:key/mrk-1234abcd12ab34cd56ef1234567890ab"
KMS_HOLDER = "bank.vault.kms.KmsKeyProvider"


@pytest.fixture
def kms_settings(module_settings, monkeypatch):
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    module_settings.VAULT_KEY_PROVIDER = KMS_HOLDER
    module_settings.VAULT_KMS_KEYS = {"k1": ARN_1}
    module_settings.VAULT_ACTIVE_KEY = "k1"
    module_settings.VAULT_KMS_REGION = "us-east-1"
    return module_settings


def _errors(check) -> list[tuple[str, str]]:
    return [(error.id, error.msg) for error in check()]


@pytest.mark.parametrize(
    "key_id",
    [
        ARN_1,
        ARN_2,
        "1234abcd-12ab-34cd-56ef-1234567890ab",
        "alias/payments-vault",
        "arn:aws:kms:eu-west-1:111122223333:alias/payments-vault",
        "arn:aws-us-gov:kms:us-gov-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    ],
    ids=["arn", "multi-region", "id", "alias", "alias-arn", "gov-partition"],
)
def test_a_kms_key_may_be_named_by_id_arn_or_alias(key_id):
    assert parse_kms_keys({"k1": key_id}) == {"k1": key_id}


def test_kms_keys_from_the_environment_keep_the_colons_of_their_arns():
    assert parse_kms_keys(f"k1:{ARN_1}, k2:{ARN_2}") == {"k1": ARN_1, "k2": ARN_2}


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"k1": "my-key"}, "'k1' is not a KMS key id"),
        ({"k1": "arn:aws:s3:::bucket"}, "'k1' is not a KMS key id"),
        ({"k1": ARN_1 + " "}, "'k1' is not a KMS key id"),
        ({"k 1": ARN_1}, "version"),
        ({"k1": 7}, "'k1' is not a KMS key id"),
        (":" + ARN_1, "version"),
        ("k1", "version:<KMS key id or ARN>"),
        ([ARN_1], "dict"),
    ],
    ids=["word", "other-service", "space", "version", "number", "no-version", "text", "list"],
)
def test_a_wrong_kms_keys_setting_is_refused_naming_the_version(value, problem):
    with pytest.raises(ValueError, match=problem):
        parse_kms_keys(value)


def test_the_start_up_check_passes_a_complete_kms_holder(kms_settings):
    assert _errors(vault_key_provider_check) == []
    assert _errors(bank_setting_values_check) == []


def test_the_start_up_check_refuses_a_kms_keys_value_naming_the_setting(kms_settings):
    kms_settings.VAULT_KMS_KEYS = {"k1": "my-key"}
    [(error_id, message)] = _errors(bank_setting_values_check)
    assert error_id == "bank.E001"
    assert 'BANK["VAULT_KMS_KEYS"]' in message and "'k1' is not a KMS key id" in message


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("VAULT_KMS_REGION", "US East"),
        ("VAULT_KMS_ENDPOINT_URL", "localhost:4566"),
        ("VAULT_KMS_TIMEOUT_SECONDS", 0),
        ("VAULT_KMS_TIMEOUT_SECONDS", 61),
    ],
)
def test_the_start_up_check_refuses_a_kms_connection_setting_naming_it(kms_settings, name, value):
    setattr(kms_settings, name, value)
    [(error_id, message)] = _errors(bank_setting_values_check)
    assert error_id == "bank.E001" and f'BANK["{name}"]' in message


def test_a_kms_holder_without_kms_keys_stops_start_up(kms_settings):
    kms_settings.VAULT_KMS_KEYS = {}
    [(error_id, message)] = _errors(vault_key_provider_check)
    assert error_id == "bank.E004"
    assert "BANK['VAULT_KMS_KEYS'] names no KMS key" in message


def test_an_active_version_without_a_kms_key_stops_start_up(kms_settings):
    kms_settings.VAULT_ACTIVE_KEY = "k2"
    [(error_id, message)] = _errors(vault_key_provider_check)
    assert error_id == "bank.E004"
    assert "BANK['VAULT_ACTIVE_KEY'] = 'k2' is not a version of" in message
    with pytest.raises(VaultKeyError, match="no KMS key of version 'k2'"):
        KmsKeyProvider().active_version()


def test_a_kms_holder_with_no_region_at_all_stops_start_up(kms_settings, monkeypatch):
    kms_settings.VAULT_KMS_REGION = None
    [(error_id, message)] = _errors(vault_key_provider_check)
    assert error_id == "bank.E004" and "BANK['VAULT_KMS_REGION'] is not set" in message

    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert _errors(vault_key_provider_check) == []


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("bank.vault.nothing.KeyHolder", "cannot be imported"),
        ("bank.vault.crypto.seal", "is not a subclass of bank.vault.crypto.KeyProvider"),
    ],
)
def test_a_key_provider_that_is_none_stops_start_up_naming_the_setting(
    module_settings, path, problem
):
    module_settings.VAULT_KEY_PROVIDER = path
    [(error_id, message)] = _errors(vault_key_provider_check)
    assert error_id == "bank.E003"
    assert f'BANK["VAULT_KEY_PROVIDER"] = {path!r}' in message and problem in message


def test_the_settings_holder_refuses_an_active_version_it_has_no_key_for(module_settings):
    from tests.bank.vault.conftest import KEY_1

    module_settings.VAULT_KEYS = {"k1": KEY_1}
    module_settings.VAULT_ACTIVE_KEY = "k9"
    [(error_id, message)] = _errors(vault_key_provider_check)
    assert error_id == "bank.E004"
    assert "'k9' is not a version of BANK['VAULT_KEYS']" in message
    assert KEY_1 not in message


def test_the_kms_settings_are_read_from_the_environment_with_their_types():
    import environ

    env = environ.Env()
    env.ENVIRON = {
        "VAULT_KEY_PROVIDER": KMS_HOLDER,
        "VAULT_KMS_KEYS": f"k1:{ARN_1},k2:{ARN_2}",
        "VAULT_KMS_REGION": "eu-west-1",
        "VAULT_KMS_ENDPOINT_URL": "http://127.0.0.1:4566",
        "VAULT_KMS_TIMEOUT_SECONDS": "2.5",
    }
    values = app_settings_from_environ(
        env,
        conf.bank_settings,
        [
            "VAULT_KEY_PROVIDER",
            "VAULT_KMS_KEYS",
            "VAULT_KMS_REGION",
            "VAULT_KMS_ENDPOINT_URL",
            "VAULT_KMS_TIMEOUT_SECONDS",
        ],
    )
    assert values["VAULT_KMS_TIMEOUT_SECONDS"] == 2.5
    assert parse_kms_keys(values["VAULT_KMS_KEYS"]) == {"k1": ARN_1, "k2": ARN_2}
    assert values["VAULT_KMS_REGION"] == "eu-west-1"


def test_botocore_records_made_during_a_vault_kms_call_are_dropped_and_others_kept(caplog):
    import logging

    from bank.vault import kms

    caplog.set_level(logging.DEBUG, logger="botocore")
    for name in ("botocore.endpoint", "botocore.parsers"):
        with kms._vault_call():
            logging.getLogger(name).debug("Response body:\n%r", b'{"Plaintext": "secret"}')
        logging.getLogger(name).debug("Response body:\n%r", b'{"Plaintext": "public"}')

    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2 and all("public" in text for text in logged)
    assert all(kms._log_filter in logging.getLogger(name).filters for name in kms.BOTOCORE_LOGGERS)
