"""Settings read at start-up: the signing secrets, and the module's own defaults."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from payments import signing
from payments.signing import secrets_parse
from tests.callbacks.test_endpoint import event_body

ROOT = Path(__file__).resolve().parent.parent


def settings_in_subprocess(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("new,old", ["new", "old"]),
        ("new, old", ["new", "old"]),
        (" new ,\told , ", ["new", "old"]),
        ("only", ["only"]),
        (["new ", " old"], ["new", "old"]),
    ],
)
def test_signing_secrets_are_split_and_stripped(raw, expected):
    assert secrets_parse(raw) == expected


@pytest.mark.parametrize("raw", ["", ",", " , ", " ", [], [" "]])
def test_an_empty_secret_list_is_refused_naming_the_setting(raw):
    with pytest.raises(ImproperlyConfigured, match="CALLBACK_SIGNING_SECRETS"):
        secrets_parse(raw)


@pytest.mark.subprocess
@pytest.mark.parametrize("raw", ["", ",", " , "])
def test_an_empty_secret_list_stops_start_up_naming_the_setting(raw):
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
            "CALLBACK_SIGNING_SECRETS": raw,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode != 0
    assert "CALLBACK_SIGNING_SECRETS is empty" in result.stderr


@pytest.mark.subprocess
def test_environment_value_with_a_space_after_the_comma_yields_both_secrets():
    result = settings_in_subprocess(
        "from callbacks import conf; import json; print(json.dumps(conf.CALLBACK_SIGNING_SECRETS))",
        CALLBACK_SIGNING_SECRETS="new-secret, old-secret",
    )

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == ["new-secret", "old-secret"]


@pytest.mark.parametrize("raw", ["new-secret,old-secret", "new-secret, old-secret"])
@pytest.mark.parametrize("signer", ["new-secret", "old-secret"])
def test_rotation_verifies_a_callback_signed_with_either_secret(
    sqs_queues, module_settings, raw, signer
):
    # The value config/settings/base.py passes on from the environment variable.
    module_settings.CALLBACK_SIGNING_SECRETS = raw
    body = json.dumps(event_body()).encode()

    response = Client().post(
        "/callbacks/processor/",
        data=body,
        content_type="application/json",
        headers={signing.HEADER: signing.sign(body, [signer])},
    )

    assert response.status_code == 202


def test_a_retired_secret_no_longer_verifies(sqs_queues, module_settings):
    module_settings.CALLBACK_SIGNING_SECRETS = "new-secret"
    body = json.dumps(event_body()).encode()

    response = Client().post(
        "/callbacks/processor/",
        data=body,
        content_type="application/json",
        headers={signing.HEADER: signing.sign(body, ["old-secret"])},
    )

    assert response.status_code == 401


@pytest.mark.parametrize(
    ("module", "name", "default"),
    [
        ("payments", "PROCESSOR_TIMEOUT_SECONDS", 10.0),
        ("payments", "PAYMENTS_MERCHANT_ACCESS_POLICY", "payments.access.merchant_access_granted"),
        ("callbacks", "WORKER_MAX_ATTEMPTS", 6),
        ("callbacks", "SQS_QUEUE_NAME", "payments.fifo"),
        ("triage", "DLQ_INGEST_INTERVAL_SECONDS", 60.0),
    ],
)
def test_a_setting_the_host_leaves_out_takes_the_modules_default(
    module_settings, module, name, default
):
    import importlib

    conf = importlib.import_module(f"{module}.conf")
    delattr(module_settings, name)

    assert getattr(conf, name) == default


def test_a_setting_the_host_sets_wins_over_the_default(settings):
    from callbacks import conf

    settings.CALLBACKS = {**settings.CALLBACKS, "WORKER_MAX_ATTEMPTS": 3}
    assert conf.WORKER_MAX_ATTEMPTS == 3


def test_a_missing_required_setting_is_named(module_settings):
    from payments import conf

    del module_settings.PROCESSOR_API_KEY
    with pytest.raises(ImproperlyConfigured, match="PROCESSOR_API_KEY"):
        getattr(conf, "PROCESSOR_API_KEY")  # noqa: B009


def test_start_up_checks_pass_with_the_projects_settings():
    from callbacks.checks import callbacks_settings_check
    from payments.checks import payments_settings_check

    assert payments_settings_check() == [] and callbacks_settings_check() == []


def test_start_up_check_names_a_missing_required_setting(module_settings):
    from callbacks.checks import callbacks_settings_check
    from payments.checks import payments_settings_check

    del module_settings.PROCESSOR_BASE_URL
    module_settings.CALLBACK_SIGNING_SECRETS = " , "

    [payments_error] = payments_settings_check()
    [callbacks_error] = callbacks_settings_check()
    assert "PROCESSOR_BASE_URL" in payments_error.msg
    assert "CALLBACK_SIGNING_SECRETS" in callbacks_error.msg


@pytest.mark.parametrize("path", ["payments.access.no_such_policy", "payments.conf.DEFAULTS"])
def test_start_up_check_names_a_broken_access_policy(module_settings, path):
    from payments.checks import payments_settings_check

    module_settings.PAYMENTS_MERCHANT_ACCESS_POLICY = path

    [error] = payments_settings_check()
    assert error.id == "payments.E002" and path in error.msg


def test_the_settings_reference_lists_every_setting_as_the_django_setting_a_host_writes():
    import re

    from payments.kernel.app_settings import AppSettings

    reference = (ROOT / "docs" / "reference" / "settings.md").read_text()
    listed = set(re.findall(r'^\| `(PAYMENTS|CALLBACKS|BANK|TRIAGE)\["(\w+)"\]`', reference, re.M))

    assert listed == {(app.setting, name) for app in AppSettings.every for name in app.names}
