"""The alert table's one-firing-row-per-key rule, its race fallback, and the shipped reminder
intervals, each exercised as shipped."""

import runpy
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import IntegrityError, close_old_connections, connection, transaction

from tests.waiting import backend_pid, wait_for, waits_on_a_lock
from triage.models import Alert, AlertStatus
from triage.operations.alerting import alert_fire

ROOT = Path(__file__).resolve().parents[2]
# Monday 30 November 2026, 09:00 in Chicago: after the settlement window.
AFTER_WINDOW = datetime(2026, 11, 30, 15, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def quiet_sinks(settings, module_settings):
    module_settings.SETTLEMENT_WINDOW = "Mon-Fri 05:00-08:00 America/Chicago"
    module_settings.ALERT_WEBHOOK_URL = None
    settings.ADMINS = []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("severity", "interval"),
    [("high", timedelta(minutes=15)), ("medium", timedelta(hours=1)), ("low", timedelta(hours=4))],
)
def test_shipped_reminder_intervals_are_15_minutes_1_hour_and_4_hours(
    module_settings, monkeypatch, severity, interval
):
    for name in (
        "ALERT_REMINDER_HIGH_MINUTES",
        "ALERT_REMINDER_MEDIUM_MINUTES",
        "ALERT_REMINDER_LOW_MINUTES",
    ):
        monkeypatch.delenv(name, raising=False)
    # The settings module as shipped, read afresh without any override in the environment: it
    # passes none on, so the triage app's own intervals apply.
    shipped = runpy.run_path(str(ROOT / "config" / "settings" / "base.py"))
    assert "ALERT_REMINDER_INTERVALS" not in shipped["TRIAGE"]
    del module_settings.ALERT_REMINDER_INTERVALS
    key = f"test.reminder.{severity}"

    def fire(at):
        return alert_fire(key=key, severity=severity, summary="s", now=at).decision

    assert fire(AFTER_WINDOW) == "fired"
    assert fire(AFTER_WINDOW + interval - timedelta(seconds=1)) == "repeated"
    assert fire(AFTER_WINDOW + interval) == "reminder"
    assert fire(AFTER_WINDOW + 2 * interval - timedelta(seconds=1)) == "repeated"
    assert fire(AFTER_WINDOW + 2 * interval) == "reminder"
    assert Alert.objects.get(key=key).notify_count == 3


@pytest.mark.django_db
def test_the_database_refuses_a_second_firing_alert_for_one_key():
    Alert.objects.create(key="k", severity="high", summary="first")
    with pytest.raises(IntegrityError), transaction.atomic():
        Alert.objects.create(key="k", severity="high", summary="second")
    # The rule is for firing rows only: history keeps any number of resolved ones.
    Alert.objects.filter(key="k").update(status=AlertStatus.RESOLVED)
    Alert.objects.create(key="k", severity="high", summary="again", status=AlertStatus.RESOLVED)
    Alert.objects.create(key="k", severity="high", summary="firing again")
    assert Alert.objects.filter(key="k", status=AlertStatus.FIRING).count() == 1
    assert Alert.objects.filter(key="k").count() == 3


@pytest.mark.django_db(transaction=True)
def test_an_alert_fired_while_another_process_creates_its_row_joins_that_row():
    """Forced race: the test inserts the firing row and holds its transaction open; alert_fire,
    finding no committed row, tries to insert its own and waits on the unique index. The test
    commits: the insert fails, and alert_fire falls back to the row that won."""
    pid: list[int] = []
    pid_known = threading.Event()
    outcome: list = []

    def fire():
        try:
            pid.append(backend_pid())
            pid_known.set()
            outcome.append(alert_fire(key="queue.dlq", severity="medium", summary="from fire"))
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)
        finally:
            pid_known.set()
            connection.close()
            close_old_connections()

    thread = threading.Thread(target=fire)
    with transaction.atomic():
        winner = Alert.objects.create(key="queue.dlq", severity="medium", summary="from the other")
        thread.start()
        assert pid_known.wait(10) and pid
        wait_for(lambda: waits_on_a_lock(pid[0]), 10, "alert_fire to wait on the row", every=0.01)
    thread.join(30)

    [result] = outcome
    assert not isinstance(result, Exception), result
    assert result.alert.pk == winner.pk
    assert result.decision == "fired"  # the winner's row had notified nobody yet
    [alert] = Alert.objects.filter(key="queue.dlq")
    assert (alert.status, alert.notify_count, alert.summary) == ("firing", 1, "from fire")
    assert alert.details["occurrences"] == 1
