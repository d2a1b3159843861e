"""The bank path's settings were keys of ``PAYMENTS`` in 0.1.0 and are keys of ``BANK`` now. A
host that has not moved them yet keeps working for one release: the old key is read, checked
like the new one, and warned about at start-up (bank.W001), naming where it goes; the payments
app does not refuse it as unknown. Where both are set, ``BANK`` wins."""

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from bank import conf as bank_conf
from bank.checks import bank_moved_settings_check, bank_setting_values_check
from payments.checks import payments_setting_values_check


def test_a_key_left_in_payments_is_read_and_warned_about(settings):
    settings.PAYMENTS = {**settings.PAYMENTS, "NACHA_BANK_BUFFER_MINUTES": 45}

    assert bank_conf.NACHA_BANK_BUFFER_MINUTES == 45
    [warning] = bank_moved_settings_check()
    assert warning.id == "bank.W001"
    assert (
        'PAYMENTS["NACHA_BANK_BUFFER_MINUTES"] has moved to BANK["NACHA_BANK_BUFFER_MINUTES"]'
        in (warning.msg)
    )
    assert [
        e for e in payments_setting_values_check() if e.obj == "NACHA_BANK_BUFFER_MINUTES"
    ] == []


def test_the_new_place_wins_over_the_old_one(settings):
    settings.PAYMENTS = {**settings.PAYMENTS, "NACHA_BANK_BUFFER_MINUTES": 45}
    settings.BANK = {**settings.BANK, "NACHA_BANK_BUFFER_MINUTES": 20}

    assert bank_conf.NACHA_BANK_BUFFER_MINUTES == 20
    assert bank_moved_settings_check() == []


def test_a_bad_value_left_in_payments_is_refused_like_a_bad_value_in_bank(settings):
    settings.PAYMENTS = {**settings.PAYMENTS, "NACHA_BANK_BUFFER_MINUTES": -1}

    [error] = bank_setting_values_check()
    assert error.id == "bank.E001" and error.obj == "NACHA_BANK_BUFFER_MINUTES"
    with pytest.raises(SystemCheckError, match="NACHA_BANK_BUFFER_MINUTES"):
        call_command("check")


def test_nothing_moved_warns_nothing(settings):
    assert bank_moved_settings_check() == []


def test_a_key_neither_app_knows_is_still_refused_by_payments(settings):
    settings.PAYMENTS = {**settings.PAYMENTS, "NACHA_BUFER_MINUTES": 45}

    [error] = [e for e in payments_setting_values_check() if e.obj == "NACHA_BUFER_MINUTES"]
    assert error.id == "payments.E004"


@pytest.mark.parametrize(
    ("setting", "old", "new", "warning_id"),
    [
        (
            "PROCESSOR_BACKEND",
            "payments.nacha.backend.NachaBankBackend",
            "bank.nacha.backend.NachaBankBackend",
            "payments.W002",
        ),
        (
            "PROCESSOR_BACKEND",
            "payments.processor.client.ProcessorClient",
            "payments.processor.backends.http.ProcessorClient",
            "payments.W002",
        ),
        (
            "VAULT_KEY_PROVIDER",
            "payments.vault.kms.KmsKeyProvider",
            "bank.vault.kms.KmsKeyProvider",
            "bank.W003",
        ),
    ],
)
def test_a_path_of_0_1_0_is_read_as_its_new_one_and_warned_about(
    module_settings, setting, old, new, warning_id
):
    from bank.checks import bank_renamed_paths_check
    from payments.checks import payments_renamed_paths_check

    setattr(module_settings, setting, old)

    assert getattr(module_settings, setting) == new
    warnings = payments_renamed_paths_check() + bank_renamed_paths_check()
    [warning] = [w for w in warnings if w.obj == setting]
    assert warning.id == warning_id and repr(old) in warning.msg and repr(new) in warning.msg


def test_a_logging_config_of_0_1_0_still_loads_and_is_warned_about(settings):
    import logging.config

    from payments.checks import payments_renamed_paths_check

    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": "payments.logcontext.LogContextFilter"}},
        "formatters": {"json": {"()": "payments.logformat.JsonLineFormatter"}},
        "handlers": {"null": {"class": "logging.NullHandler", "filters": ["context"]}},
    }
    logging.config.dictConfig(config)  # the old names still import
    settings.LOGGING = config

    found = {w.msg.split(":")[0] for w in payments_renamed_paths_check() if w.id == "payments.W003"}
    assert found == {"LOGGING names payments.logformat", "LOGGING names payments.logcontext"}
