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
