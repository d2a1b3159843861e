"""Beat's heartbeat: the task beat schedules, the in-app alert on it, and its ``/metrics`` gauge."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from tests.triage.test_metrics import scrape, value
from triage.beat import beat_schedule
from triage.models import Alert, BeatHeartbeat
from triage.operations.alert_conditions import BEAT_HEARTBEAT_STALE, alerts_evaluate
from triage.tasks import beat_heartbeat


@pytest.fixture(autouse=True)
def quiet_sinks(settings, module_settings):
    module_settings.ALERT_WEBHOOK_URL = None
    settings.ADMINS = []


def database_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def heartbeat_aged(seconds: float) -> None:
    BeatHeartbeat.objects.update_or_create(
        pk=1, defaults={"beat_at": database_now() - timedelta(seconds=seconds)}
    )


def test_beat_schedules_the_heartbeat_every_minute():
    entry = beat_schedule()["beat-heartbeat"]
    assert entry["task"] == "triage.tasks.beat_heartbeat"
    assert entry["schedule"] == 60.0


@pytest.mark.django_db
def test_the_heartbeat_task_keeps_one_row_at_the_databases_time():
    heartbeat_aged(3600)

    beat_heartbeat()
    beat_heartbeat()

    [row] = BeatHeartbeat.objects.all()
    assert abs((database_now() - row.beat_at).total_seconds()) < 5


@pytest.mark.django_db
def test_a_stale_heartbeat_fires_a_high_alert_and_a_fresh_one_resolves_it(sqs_queues):
    heartbeat_aged(400)

    fired = alerts_evaluate()

    assert fired.fired[BEAT_HEARTBEAT_STALE] == "fired"
    alert = Alert.objects.get(key=BEAT_HEARTBEAT_STALE, status="firing")
    assert alert.severity == "high"
    assert "heartbeat is 400 s old (threshold 300 s)" in alert.summary

    beat_heartbeat()
    resolved = alerts_evaluate(now=timezone.now() + timedelta(minutes=1))

    assert BEAT_HEARTBEAT_STALE in resolved.resolved
    assert not Alert.objects.filter(key=BEAT_HEARTBEAT_STALE, status="firing").exists()


@pytest.mark.django_db
def test_the_stale_threshold_is_the_setting(module_settings, sqs_queues):
    module_settings.BEAT_HEARTBEAT_STALE_SECONDS = 600
    heartbeat_aged(400)

    result = alerts_evaluate()

    assert BEAT_HEARTBEAT_STALE not in result.fired
    assert not Alert.objects.filter(key=BEAT_HEARTBEAT_STALE).exists()


@pytest.mark.django_db
def test_a_heartbeat_that_never_ran_neither_fires_nor_resolves_in_app(sqs_queues):
    result = alerts_evaluate()

    assert BEAT_HEARTBEAT_STALE not in result.fired
    assert BEAT_HEARTBEAT_STALE not in result.resolved


@pytest.mark.django_db
def test_metrics_serve_the_heartbeat_time_and_zero_before_beat_ever_ran(
    client, module_settings, sqs_queues
):
    module_settings.METRICS_SNAPSHOT_SECONDS = 0  # each scrape reads the row again
    assert value(scrape(client), "payments_beat_heartbeat_timestamp_seconds") == 0

    beat_heartbeat()

    served = value(scrape(client), "payments_beat_heartbeat_timestamp_seconds")
    assert served == BeatHeartbeat.objects.get().beat_at.timestamp()
