"""The demo's webhooks section: its settings are ones the module accepts, and its checks pass on
receivers that got everything (the flaky one after its endpoint was disabled and enabled
again) and fail on one that missed an event or saw an id repeated with another body."""

import pytest

from demo.webhooks import ENVIRONMENT, flaky_recover, webhooks_checks, webhooks_start
from payments.webhooks.delivery import deliveries_run
from payments.webhooks.models import WebhookEndpoint
from payments.webhooks.services import webhook_endpoint_enable
from tests.payments.webhook_support import loopback_webhooks, settle  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db(transaction=True)

MERCHANTS = ["m-flaky", "m-thin", "m-full"]


def test_the_demo_s_webhook_settings_are_ones_the_module_accepts(monkeypatch):
    import environ

    from config.settings.environment import app_settings_from_environ
    from payments.conf import payments_settings
    from payments.kernel.setting_specs import value_problem

    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    values = app_settings_from_environ(environ.Env(), payments_settings, list(ENVIRONMENT))
    assert set(values) == set(ENVIRONMENT)
    problems = {n: value_problem(payments_settings.specs[n], v) for n, v in values.items()}
    assert problems == {name: None for name in ENVIRONMENT}


@pytest.fixture
def story(loopback_webhooks):  # noqa: F811 - the imported fixture
    """The demo's story in one process: traffic for every merchant, the main receiver failing
    first, the flaky endpoint disabled by the failure rule, then enabled and replayed."""
    loopback_webhooks.WEBHOOK_RETRY_SCHEDULE = [0] * 30
    loopback_webhooks.WEBHOOK_DISABLE_AFTER_FAILURES = 3
    loopback_webhooks.WEBHOOK_DISABLE_AFTER_HOURS = 0
    webhooks = webhooks_start(MERCHANTS)
    webhooks["main"].fail_first = 3
    try:
        for merchant in MERCHANTS:
            settle(merchant_id=merchant)
        for _ in range(6):
            deliveries_run()
        endpoint = webhooks["flaky_endpoint"]
        assert not WebhookEndpoint.objects.get(pk=endpoint.pk).enabled
        webhooks["flaky"].status = 200
        webhook_endpoint_enable(endpoint=endpoint, actor="api:demo")
        for _ in range(3):
            deliveries_run()
        yield webhooks
    finally:
        webhooks["main"].stop()
        webhooks["flaky"].stop()


def _failed(checks) -> list[str]:
    return [label for label, passed in checks if not passed]


def test_the_checks_pass_when_every_event_reached_its_endpoint(story):
    rows, checks = webhooks_checks(story, recovered=True)
    assert _failed(checks) == []
    # The full endpoints alternate between the versions: m-full's events came in 2026-12-01's.
    versions = {e.merchant_id: e.api_version for e in WebhookEndpoint.objects.all()}
    assert versions == {"m-flaky": "2026-11-01", "m-thin": "2026-11-01", "m-full": "2026-12-01"}
    full = [b for b in story["main"].verified if b["merchant_id"] == "m-full"]
    assert full and all(body["api_version"] == "2026-12-01" for body in full)
    shown = dict(rows)
    assert shown["requests answered with a failure"] >= 3 + 3  # main's first, flaky's until off
    assert shown["disabled endpoint's deliveries replayed"] >= 2


def test_the_checks_fail_when_the_re_enabled_endpoint_missed_an_event(story):
    flaky = story["flaky"]
    got = [r for r in flaky.receipts if r["status"] == 200]
    flaky.receipts.remove(got[0])
    assert _failed(webhooks_checks(story, recovered=True)[1]) == [
        "every event delivered to every endpoint wanting it",
        "the re-enabled endpoint got every event of its merchant",
    ]


def test_the_checks_fail_on_an_id_repeated_with_another_body(story):
    main = story["main"]
    main.receipts.append({**main.receipts[-1], "sha256": "0" * 64})
    assert _failed(webhooks_checks(story, recovered=False)[1]) == [
        "repeats only under the same webhook-id, with the same body",
        "the failing endpoint was disabled, then enabled through the API",
    ]


def test_recovery_reports_an_endpoint_never_disabled_in_time(loopback_webhooks):  # noqa: F811
    webhooks = webhooks_start(MERCHANTS[:1])
    try:
        assert not flaky_recover(webhooks, web_url="http://127.0.0.1:9", token="x", timeout=0)
    finally:
        webhooks["main"].stop()
        webhooks["flaky"].stop()
    assert webhooks["flaky"].status == 503  # not brought back
