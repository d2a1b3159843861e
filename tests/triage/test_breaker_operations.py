"""The processor breaker in operations: the dashboard banner, the gauges, the alert reminders."""

from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.urls import reverse
from django.utils import timezone

from payments.models import BreakerState, CircuitBreaker, PaymentState
from payments.processor.breaker import (
    ALERT_KEY,
    DEGRADED_ALERT_KEY,
    CallOutcome,
    processor_breaker_admit,
    processor_breaker_degraded,
    processor_breaker_get,
    processor_breaker_record,
)
from tests.factories import PaymentFactory, open_breaker
from tests.triage.deadletters import viewer
from tests.triage.test_metrics import scrape, value
from triage.models import Alert, AlertNotification, AlertStatus
from triage.operations.alert_conditions import alerts_evaluate

pytestmark = pytest.mark.django_db
DASHBOARD = "admin:triage_triagedashboard_changelist"
# An outage as operators meet it: the processor's last error, the next trial 40 s away.
OUTAGE = {"open_for": timedelta(seconds=40), "last_error": "HTTP 503: upstream connect error"}


def test_dashboard_shows_an_open_breaker_prominently_with_the_waiting_payments(client):
    PaymentFactory.create_batch(3, state=PaymentState.PENDING)
    open_breaker(opened_ago=timedelta(minutes=3), **OUTAGE)
    client.force_login(viewer())

    page = client.get(reverse(DASHBOARD)).content.decode()

    banner = page[page.index('id="processor-breaker"') :][:2000]
    assert "Processor unavailable: circuit breaker OPEN" in banner
    assert "<strong>3</strong> payment(s) waiting" in banner
    assert "(3 min)" in banner and "Next trial in" in banner
    assert "HTTP 503: upstream connect error" in banner
    # Above everything else on the page.
    assert page.index('id="processor-breaker"') < page.index('id="tile-open"')


def test_dashboard_shows_a_closed_breaker_and_its_recent_history(client, module_settings):
    module_settings.PROCESSOR_BREAKER_TRIAL_CALLS = 1
    for _ in range(5):
        admission = processor_breaker_admit()
        processor_breaker_record(admission=admission, outcome=CallOutcome.FAILURE)
    CircuitBreaker.objects.filter(name="processor").update(open_until=Now())
    trial = processor_breaker_admit()
    processor_breaker_record(admission=trial, outcome=CallOutcome.SUCCESS)
    client.force_login(viewer())

    page = client.get(reverse(DASHBOARD)).content.decode()

    assert "Processor: circuit breaker closed" in page
    assert "Recent breaker history" in page
    assert "Opened" in page and "Half-open: trial submissions admitted" in page
    assert "Closed" in page


def test_evaluation_resolves_the_alert_only_once_the_incident_is_over(module_settings):
    module_settings.PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS = 60
    open_breaker(opened_ago=timedelta(minutes=3), **OUTAGE)
    alerts_evaluate()
    # Closed 10 s ago: the incident is in its cool-down, a reopening would be the same one.
    CircuitBreaker.objects.filter(name="processor").update(
        state=BreakerState.CLOSED, closed_at=Now() - timedelta(seconds=10)
    )
    assert ALERT_KEY not in alerts_evaluate().resolved
    assert Alert.objects.get(key=ALERT_KEY).status == AlertStatus.FIRING

    CircuitBreaker.objects.filter(name="processor").update(closed_at=Now() - timedelta(seconds=61))
    result = alerts_evaluate()

    assert ALERT_KEY in result.resolved
    assert Alert.objects.get(key=ALERT_KEY).status == AlertStatus.RESOLVED
    assert processor_breaker_get().opened_at is None


def test_metrics_report_the_breaker_state_and_how_long_it_has_been_open(client):
    open_breaker(opened_ago=timedelta(seconds=90), **OUTAGE)

    samples = scrape(client)

    assert value(samples, "payments_processor_breaker_state", state="open") == 1
    assert value(samples, "payments_processor_breaker_state", state="closed") == 0
    assert 89 <= value(samples, "payments_processor_breaker_open_seconds") < 120
    assert value(samples, "payments_ops_scrape_error", source="breaker") == 0


def test_metrics_report_a_closed_breaker_before_it_was_ever_used(client):
    samples = scrape(client)

    assert value(samples, "payments_processor_breaker_state", state="closed") == 1
    assert value(samples, "payments_processor_breaker_open_seconds") == 0


def test_evaluation_keeps_the_alert_firing_and_reminds_with_a_fresh_count(module_settings):
    module_settings.ALERT_REMINDER_INTERVALS = {**module_settings.ALERT_REMINDER_INTERVALS}
    breaker = open_breaker(opened_ago=timedelta(minutes=3), **OUTAGE)
    PaymentFactory.create_batch(2, state=PaymentState.PENDING)
    now = timezone.now()

    first = alerts_evaluate(now=now)
    PaymentFactory(state=PaymentState.PENDING)
    within = alerts_evaluate(now=now + timedelta(minutes=1))
    reminder = alerts_evaluate(now=now + module_settings.ALERT_REMINDER_INTERVALS["high"])

    assert first.fired[ALERT_KEY] == "fired"
    assert within.fired[ALERT_KEY] == "repeated"
    assert reminder.fired[ALERT_KEY] == "reminder"
    [alert] = Alert.objects.filter(key=ALERT_KEY)
    assert alert.severity == "high"
    since = f"processor unavailable since {breaker.opened_at:%Y-%m-%d %H:%M:%S} UTC"
    assert alert.summary.startswith(since)
    assert "3 payment(s) waiting" in alert.summary
    assert AlertNotification.objects.filter(alert=alert, kind="reminder").exists()


def test_evaluation_resolves_a_leftover_alert_once_the_breaker_is_closed():
    open_breaker(opened_ago=timedelta(minutes=3), **OUTAGE)
    alerts_evaluate()
    CircuitBreaker.objects.filter(name="processor").update(
        state=BreakerState.CLOSED, opened_at=None
    )

    result = alerts_evaluate()

    assert ALERT_KEY in result.resolved
    assert Alert.objects.get(key=ALERT_KEY).status == AlertStatus.RESOLVED


def test_dashboard_shows_a_429_pause_while_closed(client):
    processor_breaker_get()
    CircuitBreaker.objects.filter(name="processor").update(
        paused_until=timezone.now() + timedelta(seconds=90)
    )
    client.force_login(viewer())

    page = client.get(reverse(DASHBOARD)).content.decode()

    assert "Processor: circuit breaker closed" in page
    assert "paused by the processor's 429 for 1 min" in page


def test_evaluation_keeps_the_degraded_alert_firing_and_resolves_it_after_the_cooldown(
    module_settings,
):
    module_settings.PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS = 60
    PaymentFactory.create_batch(2, state=PaymentState.PENDING)
    processor_breaker_get()
    processor_breaker_degraded(reason="calls failed for 5 of the 9 other payments")

    assert DEGRADED_ALERT_KEY in alerts_evaluate().fired
    [alert] = Alert.objects.filter(key=DEGRADED_ALERT_KEY)
    assert alert.severity == "high" and alert.status == AlertStatus.FIRING
    assert "2 payment(s) waiting" in alert.summary

    # The last failure judged a degradation was 61 s ago: over, here or in a worker's loop.
    CircuitBreaker.objects.filter(name="processor").update(
        degraded_seen_at=Now() - timedelta(seconds=61)
    )
    alerts_evaluate()

    assert Alert.objects.get(key=DEGRADED_ALERT_KEY).status == AlertStatus.RESOLVED
    assert processor_breaker_get().degraded_since is None
    assert processor_breaker_get().state == BreakerState.CLOSED
