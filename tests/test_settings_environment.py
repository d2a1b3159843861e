"""This project's environment variables onto the apps' settings dicts (config/settings/
environment.py): an unset variable leaves the app's default, a set one is read with its
setting's type, and one that type cannot read is named by ``manage.py check``."""

import json
import os
import subprocess
import sys
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import environ
import pytest

from bank.conf import bank_settings
from callbacks.checks import callbacks_setting_values_check
from callbacks.conf import callbacks_settings
from config.settings.environment import app_settings_from_environ
from payments.conf import payments_settings
from payments.kernel.setting_specs import Unreadable
from triage.conf import triage_settings

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = {
    "SECRET_KEY": "x",
    "DATABASE_URL": "sqlite:///:memory:",
    "PROCESSOR_BASE_URL": "http://127.0.0.1:9",
    "PROCESSOR_API_KEY": "k",
    "CALLBACK_SIGNING_SECRETS": "s",
}


def base_settings_process(
    code: str, *, without: str = "", **variables: str
) -> subprocess.CompletedProcess:
    """``code`` after ``django.setup()`` with config.settings.base and only ``variables`` (and
    the required ones but ``without``) in the environment, as a fresh deployment sees it."""
    required = {name: value for name, value in REQUIRED.items() if name != without}
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env={
            "PATH": os.environ["PATH"],
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            **required,
            **variables,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def environment(monkeypatch):
    """A clean environment to set variables in, read the way base.py reads it."""
    for name in list(os.environ):
        monkeypatch.delenv(name)
    return monkeypatch


def test_an_unset_variable_is_left_out_so_the_app_default_applies(environment):
    values = app_settings_from_environ(
        environ.Env(),
        callbacks_settings,
        ["WORKER_MAX_ATTEMPTS"],
        QUEUE_MESSAGE_RETENTION="QUEUE_MESSAGE_RETENTION_DAYS",
    )

    assert values == {}


@pytest.mark.parametrize(
    ("app", "name", "variable", "text", "value"),
    [
        (callbacks_settings, "WORKER_MAX_ATTEMPTS", "WORKER_MAX_ATTEMPTS", "4", 4),
        (
            callbacks_settings,
            "WORKER_VISIBILITY_HEARTBEAT",
            "WORKER_VISIBILITY_HEARTBEAT",
            "false",
            False,
        ),
        (payments_settings, "PROCESSOR_TIMEOUT_SECONDS", "PROCESSOR_TIMEOUT_SECONDS", "2.5", 2.5),
        (
            callbacks_settings,
            "QUEUE_MESSAGE_RETENTION",
            "QUEUE_MESSAGE_RETENTION_DAYS",
            "5",
            timedelta(days=5),
        ),
        (
            triage_settings,
            "ALERT_BACKLOG_OLDEST_AGE",
            "ALERT_BACKLOG_OLDEST_AGE_SECONDS",
            "90",
            timedelta(seconds=90),
        ),
        (
            triage_settings,
            "ALERT_WEBHOOK_URL",
            "ALERT_WEBHOOK_URL",
            "https://hooks.example/x",
            "https://hooks.example/x",
        ),
    ],
)
def test_a_set_variable_is_read_with_its_settings_type(
    environment, app, name, variable, text, value
):
    environment.setenv(variable, text)

    values = app_settings_from_environ(environ.Env(), app, **{name: variable})

    assert values == {name: value} and type(values[name]) is type(value)


def test_one_variable_of_a_dict_setting_keeps_the_other_keys_defaults(environment):
    environment.setenv("RETURN_RATE_OVERALL_PERCENT", "10")

    values = app_settings_from_environ(
        environ.Env(),
        triage_settings,
        RETURN_RATE_THRESHOLDS={
            "unauthorized": "RETURN_RATE_UNAUTHORIZED_PERCENT",
            "overall": "RETURN_RATE_OVERALL_PERCENT",
        },
    )

    # Decimal, as the app declares it (the percentages are compared as Decimals).
    assert values == {
        "RETURN_RATE_THRESHOLDS": {
            "unauthorized": Decimal("0.5"),
            "administrative": Decimal("3.0"),
            "overall": Decimal("10"),
        }
    }


def test_a_variable_its_type_cannot_read_is_passed_on_unread(environment):
    environment.setenv("WORKER_MAX_ATTEMPTS", "six")

    values = app_settings_from_environ(environ.Env(), callbacks_settings, ["WORKER_MAX_ATTEMPTS"])

    assert values == {
        "WORKER_MAX_ATTEMPTS": Unreadable("WORKER_MAX_ATTEMPTS", "six", "a whole number")
    }


def test_check_names_a_variable_its_type_cannot_read(settings):
    settings.CALLBACKS = {
        **settings.CALLBACKS,
        "QUEUE_MESSAGE_RETENTION": Unreadable(
            "QUEUE_MESSAGE_RETENTION_DAYS", "a month", "a whole number"
        ),
    }

    [error] = [e for e in callbacks_setting_values_check() if e.obj == "QUEUE_MESSAGE_RETENTION"]
    assert error.id == "callbacks.E002"
    assert error.msg.startswith(
        "CALLBACKS[\"QUEUE_MESSAGE_RETENTION\"] = 'a month' is refused: the environment "
        "variable QUEUE_MESSAGE_RETENTION_DAYS is not a whole number."
    )


def test_reading_a_variable_its_type_cannot_read_names_it(settings):
    from django.core.exceptions import ImproperlyConfigured

    from callbacks import conf

    settings.CALLBACKS = {
        "WORKER_MAX_ATTEMPTS": Unreadable("WORKER_MAX_ATTEMPTS", "six", "a whole number")
    }

    with pytest.raises(
        ImproperlyConfigured, match="WORKER_MAX_ATTEMPTS = 'six' is not a whole number"
    ):
        conf.WORKER_MAX_ATTEMPTS  # noqa: B018 - the read is what is tested


@pytest.mark.subprocess
def test_the_project_passes_only_what_the_environment_sets():
    result = base_settings_process(
        "from django.conf import settings; import json; "
        "print(json.dumps([settings.PAYMENTS, settings.CALLBACKS, settings.TRIAGE]))",
        WORKER_MAX_ATTEMPTS="4",
    )

    assert result.returncode == 0, result.stderr
    payments, callbacks, triage = json.loads(result.stdout.strip().splitlines()[-1])
    assert payments == {"PROCESSOR_BASE_URL": "http://127.0.0.1:9", "PROCESSOR_API_KEY": "k"}
    assert callbacks == {"CALLBACK_SIGNING_SECRETS": "s", "WORKER_MAX_ATTEMPTS": 4}
    assert triage == {}


@pytest.mark.subprocess
def test_manage_py_check_names_an_unreadable_variable_without_a_traceback():
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={
            "PATH": os.environ["PATH"],
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            **REQUIRED,
            "PROCESSED_EVENT_RETENTION_DAYS": "thirty",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert (
        "(payments.E003) PAYMENTS[\"PROCESSED_EVENT_RETENTION\"] = 'thirty' is refused: the "
        "environment variable PROCESSED_EVENT_RETENTION_DAYS is not a whole number"
    ) in result.stderr


@pytest.mark.subprocess
def test_a_required_variable_left_unset_stops_start_up_naming_it():
    result = base_settings_process("", without="PROCESSOR_API_KEY")

    assert result.returncode != 0
    assert "Set the PROCESSOR_API_KEY environment variable" in result.stderr


def test_the_bank_paths_dict_settings_are_read_from_json(environment):
    from bank.nacha.originator import parse_originator
    from bank.nacha.transport_options import parse_transport
    from tests.bank.nacha.conftest import ORIGINATOR_SETTING

    transport = {"kind": "directory", "outbound": "/tmp/o", "inbound": "/tmp/i"}
    windows = [{"name": "next_day", "deadline": "02:15", "same_day": False}]
    environment.setenv("NACHA_ORIGINATOR", json.dumps(ORIGINATOR_SETTING))
    environment.setenv("NACHA_TRANSPORT", json.dumps(transport))
    environment.setenv("NACHA_WINDOWS", json.dumps(windows))
    environment.setenv("PROCESSOR_BACKEND", "bank.nacha.backend.NachaBankBackend")

    values = app_settings_from_environ(
        environ.Env(), bank_settings, ["NACHA_ORIGINATOR", "NACHA_TRANSPORT", "NACHA_WINDOWS"]
    )
    backend = app_settings_from_environ(environ.Env(), payments_settings, ["PROCESSOR_BACKEND"])

    assert values == {
        "NACHA_ORIGINATOR": ORIGINATOR_SETTING,
        "NACHA_TRANSPORT": transport,
        "NACHA_WINDOWS": windows,
    }
    assert backend == {"PROCESSOR_BACKEND": "bank.nacha.backend.NachaBankBackend"}
    assert parse_originator(values["NACHA_ORIGINATOR"]) is not None
    assert parse_transport(values["NACHA_TRANSPORT"]) == transport


def test_a_bank_setting_that_is_not_json_is_named_as_such(environment):
    environment.setenv("NACHA_TRANSPORT", "kind=directory")

    values = app_settings_from_environ(environ.Env(), bank_settings, ["NACHA_TRANSPORT"])

    assert values == {"NACHA_TRANSPORT": Unreadable("NACHA_TRANSPORT", "kind=directory", "JSON")}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"kind": "ftp"}', "kind is 'directory' or 'sftp'"),
        ('["directory"]', "dict or NoneType"),
    ],
    ids=["unknown-kind", "not-a-dict"],
)
def test_a_bank_setting_read_from_json_is_checked_like_any_value(settings, text, problem):
    from bank.checks import bank_setting_values_check

    settings.BANK = {**settings.BANK, "NACHA_TRANSPORT": json.loads(text)}

    [error] = [e for e in bank_setting_values_check() if e.obj == "NACHA_TRANSPORT"]
    assert problem in error.msg
