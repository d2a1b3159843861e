"""The processor demo's account validation section (demo/validation.py): its setting is one the
module accepts, its story passes every check against the real parts (the API on a live server,
the sandbox processor posting callbacks, a worker process), and its checks fail what they
guard."""

import dataclasses
import signal

import pytest
from django.utils import timezone

from demo.validation import (
    ENVIRONMENT,
    micro_entries_checks,
    micro_entries_run,
    micro_entries_setup,
    wrong_amounts,
)
from payments.models import AccountValidation
from tests.factories import UserFactory

CLIENT = "demo-api-client"


def test_the_demo_s_validation_setting_is_one_the_module_accepts(monkeypatch):
    import environ

    from config.settings.environment import app_settings_from_environ
    from payments.conf import payments_settings
    from payments.kernel.setting_specs import value_problem

    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    values = app_settings_from_environ(environ.Env(), payments_settings, list(ENVIRONMENT))
    assert values == {"UNVALIDATED_WEB_DEBITS": "hold"}
    assert value_problem(payments_settings.specs["UNVALIDATED_WEB_DEBITS"], "hold") is None


@pytest.mark.parametrize(
    ("amounts", "wrong"),
    [(["0.07", "0.32"], ["0.08", "0.32"]), (["0.99", "0.01"], ["0.02", "0.01"])],
)
def test_the_wrong_try_is_one_cent_off_and_never_the_right_amounts(amounts, wrong):
    assert wrong_amounts(amounts) == wrong
    assert sorted(wrong_amounts(amounts)) != sorted(amounts)


@pytest.fixture
def section(module_settings, live_server, sqs_queues, tmp_path):
    """The section as the demo runs it, against the real parts; (story, sandbox stats)."""
    import requests
    from rest_framework.authtoken.models import Token

    from tests.callbacks.sandbox_support import sandbox_posting_callbacks
    from tests.callbacks.worker_support import WorkerProcess

    module_settings.UNVALIDATED_WEB_DEBITS = ENVIRONMENT["UNVALIDATED_WEB_DEBITS"]
    token = Token.objects.create(user=UserFactory(username=CLIENT)).key
    micro_entries_setup(CLIENT)
    with sandbox_posting_callbacks(module_settings, live_server, return_after_seconds=0.2) as sb:
        worker = WorkerProcess("--wait-time", "1", log_dir=tmp_path)
        try:
            story = micro_entries_run(
                web_url=live_server.url, token=token, sandbox_url=sb.base_url, timeout=60
            )
            stats = requests.get(f"{sb.base_url}/_sandbox/stats", timeout=10).json()
        finally:
            worker.signal(signal.SIGTERM)
            worker.wait(30)
    return story, stats, worker


def _failed(checks) -> list[str]:
    return [label for label, passed in checks if not passed]


@pytest.mark.django_db(transaction=True)
def test_the_section_on_the_processor_backend_passes_every_check(section):
    story, stats, worker = section

    rows, checks = micro_entries_checks(story, sandbox_stats=stats)

    assert _failed(checks) == [], (rows, worker.output[-2000:])
    assert len(checks) == 8
    shown = dict(rows)
    assert shown["  the wrong try"] == "409 micro_entries_mismatch"
    assert shown["  the right amounts"] == "200 validated"
    assert shown["  a WEB debit from it afterwards"] == "409 account_not_validated"
    assert shown["  micro-entry credits read from the statements"] == 4
    assert story.released_state in ("submitted", "confirmed")
    assert (story.expired_debit_state, story.expired_debit_failures) == ("failed", 1)


@pytest.mark.django_db(transaction=True)
def test_the_checks_fail_what_they_guard(section):
    story, stats, _ = section
    key = story.held[story.verified_token]["idempotency_key"]
    corruptions = {
        "a wrong try was refused": dataclasses.replace(story, wrong_try=(200, "validated")),
        "the debit held on it was released": dataclasses.replace(story, released_state="pending"),
        "unverified micro-entries expired": dataclasses.replace(story, expired_debit_failures=2),
        "the right amounts after the expiry": dataclasses.replace(
            story, verify_after_expiry=(200, "validated")
        ),
        "a WEB debit from the account whose validation failed": dataclasses.replace(
            story, refused=(201, "pending")
        ),
        "micro-entries started at the processor": dataclasses.replace(
            story, amounts={story.verified_token: ["0.07"], story.expired_token: []}
        ),
        "a WEB debit from an account not validated yet": dataclasses.replace(
            story, held={**story.held, story.expired_token: {}}
        ),
    }
    for start, corrupted in corruptions.items():
        failed = _failed(micro_entries_checks(corrupted, sandbox_stats=stats)[1])
        assert [label for label in failed if label.startswith(start)], (start, failed)
    charged_twice = {**stats, "charges": {**stats["charges"], key: 2}}
    failed = _failed(micro_entries_checks(story, sandbox_stats=charged_twice)[1])
    assert len(failed) == 1 and failed[0].startswith("the debit held on it was released")
    # The verified account's validation after its debit left: the chaos invariant's check.
    AccountValidation.objects.filter(account_token=story.verified_token).update(
        validated_at=timezone.now()
    )
    failed = _failed(micro_entries_checks(story, sandbox_stats=stats)[1])
    assert len(failed) == 1 and failed[0].startswith("no WEB debit left before")
