"""Start-up checks refuse a setting the run time cannot use, naming it, its value and the range.

Each of the module's settings is declared once with its type and accepted range (``SPECS`` in
each app's ``conf.py``); ``manage.py check`` fails on any value outside it.
"""

import importlib
import math
import os
import subprocess
import sys
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from callbacks.checks import callbacks_setting_values_check, callbacks_stray_settings_check
from payments.checks import payments_setting_values_check, payments_stray_settings_check
from payments.kernel.app_settings import AppSettings
from triage.checks import triage_setting_values_check, triage_stray_settings_check

ROOT = Path(__file__).resolve().parent.parent
APPS = {
    "payments": payments_setting_values_check,
    "callbacks": callbacks_setting_values_check,
    "triage": triage_setting_values_check,
}
DECLARED = [(app, name) for app in APPS for name in importlib.import_module(f"{app}.conf").SPECS]
# The Django setting holding each setting: PAYMENTS, CALLBACKS or TRIAGE.
OWNER = {name: app.setting for app in AppSettings.every for name in app.names}


def check_refuses(module_settings, **values) -> str:
    for name, value in values.items():
        setattr(module_settings, name, value)
    with pytest.raises(SystemCheckError) as refused:
        call_command("check")
    return str(refused.value)


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        # Every alert would fail to fire: alert_fire reads the window each time.
        (
            "SETTLEMENT_WINDOW",
            "whenever",
            "'<days> <HH:MM>-<HH:MM> <IANA zone>' such as 'Mon-Fri 05:00-08:00 America/Chicago'",
        ),
        # Every callback would be answered 401.
        ("CALLBACK_TOLERANCE_SECONDS", -1, "a number of seconds from 1 to 3600"),
        # Every submission would fail with "Invalid timeout".
        ("PROCESSOR_TIMEOUT_SECONDS", 0, "a number of seconds above 0 and at most 300"),
        # The bulk pages would raise ValueError.
        ("TRIAGE_BULK_RATE_PER_SECOND", 0, "a number per second above 0 and at most 10000"),
    ],
)
def test_a_nonsense_value_fails_check_naming_the_setting_the_value_and_the_range(
    module_settings, name, value, accepted
):
    message = check_refuses(module_settings, **{name: value})

    assert f'{OWNER[name]}["{name}"] = {value!r} is refused' in message
    assert f"Accepted: {accepted}" in message


@pytest.mark.parametrize(("app", "name"), DECLARED)
def test_every_declared_setting_accepts_its_default(module_settings, app, name):
    conf = importlib.import_module(f"{app}.conf")
    setattr(module_settings, name, conf.SPECS[name].default)

    assert conf.SPECS[name].problem(conf.SPECS[name].default) is None
    assert [e for e in APPS[app]() if e.obj == name] == []
    assert getattr(conf, name) == conf.DEFAULTS[name]  # read as before, through conf.NAME


@pytest.mark.parametrize(("app", "name"), DECLARED)
def test_every_declared_setting_refuses_a_value_of_no_type_it_knows(module_settings, app, name):
    setattr(module_settings, name, object())

    [error] = [e for e in APPS[app]() if e.obj == name]
    assert error.is_serious() and error.id.startswith(f"{app}.E")
    assert "object is not a type this setting accepts" in error.msg


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("PROCESSOR_TIMEOUT_SECONDS", "10", "str is not a type this setting accepts"),
        ("CALLBACK_TOLERANCE_SECONDS", True, "bool is not a type this setting accepts"),
        ("WORKER_VISIBILITY_HEARTBEAT", "false", "str is not a type this setting accepts"),
        ("WORKER_MAX_ATTEMPTS", 6.5, "float is not a type this setting accepts"),
        ("PROCESSED_EVENT_RETENTION", 30, "int is not a type this setting accepts"),
        ("QUEUE_MESSAGE_RETENTION", timedelta(0), "out of range"),
        ("HOLD_RETENTION", -timedelta(days=1), "out of range"),
        ("API_IDEMPOTENCY_RETENTION", timedelta(hours=1), "out of range"),
        ("TRIAGE_BULK_RATE_PER_SECOND", math.inf, "not a finite number"),
        ("PROCESSOR_BREAKER_FAILURE_RATE", math.nan, "not a finite number"),
        ("RETURN_RATE_THRESHOLDS", {"overall": Decimal("NaN")}, "['overall']"),
        ("RETURN_RATE_THRESHOLDS", {"nsf": 1}, "unknown key(s) ['nsf']"),
        ("RETURN_RATE_THRESHOLDS", {"overall": 0}, "['overall'] = 0: out of range"),
        ("ALERT_REMINDER_INTERVALS", {"high": timedelta(minutes=5)}, "missing key(s)"),
        (
            "ALERT_REMINDER_INTERVALS",
            {"high": 15, "medium": timedelta(hours=1), "low": timedelta(hours=4)},
            "['high'] = 15: int is not a type",
        ),
        ("SQS_QUEUE_NAME", "payments", "not of the accepted form"),
        ("ALERT_WEBHOOK_URL", "ftp://hooks.example/x", "not of the accepted form"),
        ("WORKER_PAUSE_AT", "anywhere", "not of the accepted form"),
        ("PROCESSOR_BASE_URL", "127.0.0.1:9", "not of the accepted form"),
    ],
)
def test_a_wrong_type_or_shape_fails_check(module_settings, name, value, problem):
    message = check_refuses(module_settings, **{name: value})

    assert f'{OWNER[name]}["{name}"] = ' in message and problem in message


def test_an_upper_bound_below_its_lower_one_fails_check(module_settings):
    message = check_refuses(
        module_settings, WORKER_BACKOFF_BASE_SECONDS=60, WORKER_BACKOFF_CAP_SECONDS=30
    )

    assert (
        'CALLBACKS["WORKER_BACKOFF_BASE_SECONDS"] = 60 is above '
        'CALLBACKS["WORKER_BACKOFF_CAP_SECONDS"] = 30'
    ) in message


@pytest.mark.parametrize("window", ["", None, "Sat-Mon 22:00-02:00 UTC"])
def test_no_window_or_one_the_alerting_reads_passes_check(module_settings, window):
    module_settings.SETTLEMENT_WINDOW = window

    assert triage_setting_values_check() == []


@pytest.mark.subprocess
def test_manage_py_check_fails_on_a_nonsense_environment_value():
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            "SECRET_KEY": "x",
            "DATABASE_URL": "sqlite:///:memory:",
            "PROCESSOR_BASE_URL": "http://127.0.0.1:9",
            "PROCESSOR_API_KEY": "k",
            "CALLBACK_SIGNING_SECRETS": "s",
            "CALLBACK_TOLERANCE_SECONDS": "-1",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode != 0
    assert (
        '(callbacks.E002) CALLBACKS["CALLBACK_TOLERANCE_SECONDS"] = -1 is refused' in result.stderr
    )


@pytest.mark.parametrize(
    ("setting", "key", "app", "error_id", "hint"),
    [
        # A typo: the closest of the app's own names.
        (
            "CALLBACKS",
            "WORKER_MAX_ATTEMPT",
            "callbacks",
            "callbacks.E003",
            'Did you mean CALLBACKS["WORKER_MAX_ATTEMPTS"]?',
        ),
        # Another app's setting in this app's dict: where it belongs.
        (
            "PAYMENTS",
            "WORKER_MAX_ATTEMPTS",
            "payments",
            "payments.E004",
            "WORKER_MAX_ATTEMPTS is a setting of the callbacks app: "
            'set CALLBACKS["WORKER_MAX_ATTEMPTS"].',
        ),
        # A typo of another app's setting.
        (
            "TRIAGE",
            "SQS_QUEUE_NAM",
            "triage",
            "triage.E002",
            'Did you mean CALLBACKS["SQS_QUEUE_NAME"]?',
        ),
    ],
)
def test_an_unknown_key_fails_check_naming_the_key_the_app_and_the_closest_name(
    settings, setting, key, app, error_id, hint
):
    setattr(settings, setting, {**getattr(settings, setting, {}), key: 3})

    [error] = [e for e in APPS[app]() if e.obj == key]
    assert error.id == error_id
    assert error.msg == f'{setting}["{key}"] is not a setting of the {app} app.'
    assert error.hint == hint


@pytest.mark.parametrize(
    ("name", "check", "warning_id", "owner"),
    [
        ("PROCESSOR_TIMEOUT_SECONDS", payments_stray_settings_check, "payments.W001", "PAYMENTS"),
        ("WORKER_MAX_ATTEMPTS", callbacks_stray_settings_check, "callbacks.W001", "CALLBACKS"),
        ("ALERT_WEBHOOK_URL", triage_stray_settings_check, "triage.W001", "TRIAGE"),
    ],
)
def test_a_setting_written_at_the_top_level_is_named_not_silently_ignored(
    settings, name, check, warning_id, owner
):
    assert check() == []
    in_dict = {k: v for k, v in getattr(settings, owner, {}).items() if k != name}
    setattr(settings, owner, in_dict)
    setattr(settings, name, 7)

    [warning] = check()
    assert (warning.id, warning.obj) == (warning_id, name)
    assert warning.msg == (
        f"{name} is set as a top-level setting, which the {owner.lower()} app does not read; "
        f'{owner}["{name}"] is not set, so its default is in force.'
    )
    assert warning.hint == f'Move it into {owner}: {owner}["{name}"] = ...'

    setattr(settings, owner, {**in_dict, name: 8})
    [warning] = check()
    assert warning.msg.endswith(f'{owner}["{name}"] is also set, and is the value in force.')


def test_an_apps_settings_that_are_not_a_dict_fail_check(settings):
    settings.TRIAGE = ["ALERT_WEBHOOK_URL"]

    [error] = triage_setting_values_check()
    assert error.id == "triage.E001"
    assert error.msg.startswith("TRIAGE = ['ALERT_WEBHOOK_URL'] is refused")


def test_a_wrong_type_and_an_out_of_range_value_are_named_by_their_app_and_key(settings):
    settings.CALLBACKS = {**settings.CALLBACKS, "WORKER_MAX_ATTEMPTS": "6"}
    settings.PAYMENTS = {**settings.PAYMENTS, "RETENTION_PURGE_BATCH_SIZE": 0}

    [wrong_type] = [e for e in callbacks_setting_values_check() if e.obj == "WORKER_MAX_ATTEMPTS"]
    [out_of_range] = [
        e for e in payments_setting_values_check() if e.obj == "RETENTION_PURGE_BATCH_SIZE"
    ]
    assert wrong_type.id == "callbacks.E002"
    assert wrong_type.msg.startswith(
        """CALLBACKS["WORKER_MAX_ATTEMPTS"] = '6' is refused: str is not a type"""
    )
    assert out_of_range.id == "payments.E003"
    assert out_of_range.msg.startswith(
        'PAYMENTS["RETENTION_PURGE_BATCH_SIZE"] = 0 is refused: out of range'
    )
    assert out_of_range.hint.endswith("or remove it to use the default 1000.")


def test_a_changed_apps_dict_is_read_at_once_and_its_end_restores_the_default():
    from django.test import override_settings

    from callbacks import conf

    with override_settings(CALLBACKS={"WORKER_MAX_ATTEMPTS": 2}):
        assert conf.WORKER_MAX_ATTEMPTS == 2
    assert conf.WORKER_MAX_ATTEMPTS == 6
