import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.exceptions import ImproperlyConfigured

from payments.alerts import alert_raise
from tests.factories import DeadLetterFactory
from triage.models import Alert, AlertNotification
from triage.operations.alert_conditions import (
    BACKLOG,
    DEAD_LETTERS_OPEN,
    DLQ_DEPTH,
    alerts_evaluate,
)
from triage.operations.alerting import alert_fire, alert_resolve
from triage.settlement_windows import settlement_window_parse

# Monday 30 November 2026; Chicago is on CST (UTC-6), so 12:00 UTC is 06:00 there.
INSIDE_WINDOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
AFTER_WINDOW = datetime(2026, 11, 30, 15, 0, tzinfo=UTC)
SATURDAY_MORNING = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


class Receiver:
    """A local webhook receiver: records each POSTed JSON body, answers ``status``."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.bodies: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                length = int(self.headers["Content-Length"])
                receiver.bodies.append(
                    {
                        "content_type": self.headers["Content-Type"],
                        "body": json.loads(self.rfile.read(length)),
                    }
                )
                self.send_response(receiver.status)
                self.end_headers()
                self.wfile.write(b"ok" if receiver.status < 300 else b"no channel")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/alerts"
        # A short poll: shutdown() waits for the loop to look (the default 0.5 s, every test).
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook(module_settings):
    receiver = Receiver()
    module_settings.ALERT_WEBHOOK_URL = receiver.url
    yield receiver
    receiver.stop()


@pytest.fixture(autouse=True)
def alert_settings(settings, module_settings):
    module_settings.SETTLEMENT_WINDOW = "Mon-Fri 05:00-08:00 America/Chicago"
    module_settings.ALERT_WEBHOOK_URL = None
    settings.ADMINS = [("Ops", "ops@example.com")]


# --- Settlement window -------------------------------------------------------------------------


def test_settlement_window_covers_weekday_mornings_in_chicago_time():
    window = settlement_window_parse("Mon-Fri 05:00-08:00 America/Chicago")
    assert window.contains(INSIDE_WINDOW)
    assert not window.contains(AFTER_WINDOW)
    assert not window.contains(SATURDAY_MORNING)
    # 05:00 CDT in July is 10:00 UTC: the window follows the zone's daylight saving time.
    assert window.contains(datetime(2026, 7, 6, 10, 30, tzinfo=UTC))
    assert not window.contains(datetime(2026, 7, 6, 13, 30, tzinfo=UTC))


def test_settlement_window_crossing_midnight_and_wrapping_day_range():
    window = settlement_window_parse("Sat-Mon 22:00-02:00 UTC")
    assert window.contains(datetime(2026, 12, 5, 23, 0, tzinfo=UTC))  # Saturday evening
    assert window.contains(datetime(2026, 12, 8, 1, 0, tzinfo=UTC))  # Tuesday after Monday
    assert not window.contains(datetime(2026, 12, 9, 1, 0, tzinfo=UTC))  # Wednesday morning
    assert not window.contains(datetime(2026, 12, 7, 12, 0, tzinfo=UTC))


def test_blank_settlement_window_means_no_window():
    assert settlement_window_parse("") is None
    assert settlement_window_parse(None) is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("Mon-Fri 5:00-8:00 America/Chicago", "not in the expected form"),
        ("Mon-Fri 05:00-08:00", "not in the expected form"),
        ("Mon-Fry 05:00-08:00 America/Chicago", "unknown day 'Fry'"),
        ("Mon-Fri 05:00-25:00 America/Chicago", "'25:00' is not a time of day"),
        ("Mon-Fri 05:00-05:00 America/Chicago", "starts and ends at the same time"),
        ("Mon-Fri 05:00-08:00 America/Chicag", "unknown time zone"),
        ("Mon,,Fri 05:00-08:00 UTC", "empty day"),
    ],
)
def test_bad_settlement_window_names_the_setting_and_the_problem(value, problem):
    with pytest.raises(ImproperlyConfigured) as excinfo:
        settlement_window_parse(value)
    assert "SETTLEMENT_WINDOW" in str(excinfo.value)
    assert problem in str(excinfo.value)


@pytest.mark.django_db
def test_bad_settlement_window_setting_fails_when_an_alert_fires(module_settings):
    module_settings.SETTLEMENT_WINDOW = "weekdays early"
    with pytest.raises(ImproperlyConfigured, match="SETTLEMENT_WINDOW"):
        alert_fire(key="x", severity="low", summary="x", now=AFTER_WINDOW)


# --- Policy --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_backlog_inside_window_is_silent_while_a_dead_letter_still_pages(webhook, mailoutbox):
    backlog = alert_fire(key=BACKLOG, severity="low", summary="backlog", now=INSIDE_WINDOW)
    again = alert_fire(
        key=BACKLOG, severity="low", summary="backlog", now=INSIDE_WINDOW + timedelta(minutes=1)
    )
    dead = alert_fire(
        key=DEAD_LETTERS_OPEN, severity="high", summary="1 dead letter", now=INSIDE_WINDOW
    )

    assert backlog.decision == again.decision == "suppressed"
    alert = Alert.objects.get(key=BACKLOG)
    assert alert.suppressed_count == 2
    assert alert.notify_count == 0
    assert alert.last_notified_at is None
    assert not AlertNotification.objects.filter(alert=alert).exists()

    assert dead.decision == "fired"
    sinks = set(
        AlertNotification.objects.filter(alert__key=DEAD_LETTERS_OPEN).values_list(
            "sink", flat=True
        )
    )
    assert sinks == {"log", "webhook", "email"}
    assert [b["body"]["text"] for b in webhook.bodies] == [
        "[FIRING] [high] dead_letters.open: 1 dead letter"
    ]
    assert len(mailoutbox) == 1
    assert mailoutbox[0].to == ["ops@example.com"]


@pytest.mark.django_db
def test_backlog_still_firing_after_the_window_is_notified_then(webhook):
    alert_fire(key=BACKLOG, severity="low", summary="backlog", now=INSIDE_WINDOW)
    result = alert_fire(key=BACKLOG, severity="low", summary="backlog", now=AFTER_WINDOW)
    assert result.decision == "fired"
    alert = Alert.objects.get(key=BACKLOG)
    assert (alert.suppressed_count, alert.notify_count) == (1, 1)
    assert len(webhook.bodies) == 1


@pytest.mark.django_db
def test_no_repeat_within_reminder_interval_and_a_reminder_after_it(module_settings, webhook):
    module_settings.ALERT_REMINDER_INTERVALS = {
        "high": timedelta(minutes=15),
        "medium": timedelta(hours=1),
        "low": timedelta(hours=4),
    }
    t0 = AFTER_WINDOW
    decisions = [
        alert_fire(key=DLQ_DEPTH, severity="high", summary="dlq", now=t0 + timedelta(minutes=m))
        for m in (0, 1, 5, 14)
    ]
    assert [d.decision for d in decisions] == ["fired", "repeated", "repeated", "repeated"]
    assert len(webhook.bodies) == 1

    reminder = alert_fire(
        key=DLQ_DEPTH, severity="high", summary="dlq", now=t0 + timedelta(minutes=15)
    )
    assert reminder.decision == "reminder"
    assert webhook.bodies[-1]["body"]["text"].startswith("[STILL FIRING] [high] queue.dlq")
    after = alert_fire(
        key=DLQ_DEPTH, severity="high", summary="dlq", now=t0 + timedelta(minutes=20)
    )
    assert after.decision == "repeated"
    alert = Alert.objects.get(key=DLQ_DEPTH)
    assert alert.notify_count == 2
    assert alert.details["occurrences"] == 6
    assert Alert.objects.filter(key=DLQ_DEPTH).count() == 1
    assert len(webhook.bodies) == 2


@pytest.mark.django_db
def test_low_severity_reminds_on_its_own_longer_interval(webhook):
    alert_fire(key=BACKLOG, severity="low", summary="b", now=AFTER_WINDOW)
    one_hour = alert_fire(
        key=BACKLOG, severity="low", summary="b", now=AFTER_WINDOW + timedelta(hours=1)
    )
    four_hours = alert_fire(
        key=BACKLOG, severity="low", summary="b", now=AFTER_WINDOW + timedelta(hours=4)
    )
    assert (one_hour.decision, four_hours.decision) == ("repeated", "reminder")


@pytest.mark.django_db
def test_resolve_notifies_the_sinks_and_a_new_occurrence_fires_a_new_alert(webhook, mailoutbox):
    alert_fire(key=DLQ_DEPTH, severity="high", summary="dlq", now=AFTER_WINDOW)
    resolved = alert_resolve(key=DLQ_DEPTH, now=AFTER_WINDOW + timedelta(minutes=3))

    assert resolved.status == "resolved"
    assert resolved.resolved_at == AFTER_WINDOW + timedelta(minutes=3)
    assert webhook.bodies[-1]["body"]["text"].startswith("[RESOLVED] [high] queue.dlq_not_empty")
    assert webhook.bodies[-1]["body"]["attachments"][0]["color"] == "#2eb886"
    assert set(
        AlertNotification.objects.filter(alert=resolved, kind="resolved").values_list(
            "sink", flat=True
        )
    ) == {"log", "webhook", "email"}
    assert len(mailoutbox) == 2
    assert alert_resolve(key=DLQ_DEPTH) is None

    again = alert_fire(
        key=DLQ_DEPTH, severity="high", summary="dlq", now=AFTER_WINDOW + timedelta(minutes=4)
    )
    assert again.decision == "fired"
    assert Alert.objects.filter(key=DLQ_DEPTH).count() == 2


@pytest.mark.django_db
def test_resolving_an_alert_that_was_only_suppressed_sends_nothing(webhook):
    alert_fire(key=BACKLOG, severity="low", summary="b", now=INSIDE_WINDOW)
    alert = alert_resolve(key=BACKLOG, now=INSIDE_WINDOW + timedelta(minutes=5))
    assert alert.status == "resolved"
    assert webhook.bodies == []
    assert not AlertNotification.objects.exists()


@pytest.mark.django_db
def test_email_goes_to_admins_only_for_high_severity(mailoutbox):
    alert_fire(key="payment.submission_rejected", severity="medium", summary="r", now=AFTER_WINDOW)
    alert_fire(key=BACKLOG, severity="low", summary="b", now=AFTER_WINDOW)
    assert mailoutbox == []
    alert_fire(key=DLQ_DEPTH, severity="high", summary="dlq depth 3", now=AFTER_WINDOW)
    assert len(mailoutbox) == 1
    assert "dlq depth 3" in mailoutbox[0].subject


@pytest.mark.django_db
def test_unknown_severity_is_refused():
    with pytest.raises(ValueError, match="unknown alert severity 'urgent'"):
        alert_fire(key="x", severity="urgent", summary="x")


# --- Sinks ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_webhook_gets_slack_compatible_json(webhook):
    alert_fire(
        key="payment.submission_rejected",
        severity="medium",
        summary="processor rejected payment",
        payment_id="6f1c1f9e-7a43-4d55-9d0e-8a3a7b0f1c2d",
        now=AFTER_WINDOW,
    )
    (posted,) = webhook.bodies
    assert posted["content_type"] == "application/json"
    body = posted["body"]
    assert (
        body["text"] == "[FIRING] [medium] payment.submission_rejected: processor rejected payment"
    )
    fields = {f["title"]: f["value"] for f in body["attachments"][0]["fields"]}
    assert fields["Severity"] == "medium"
    assert fields["Payment"] == "6f1c1f9e-7a43-4d55-9d0e-8a3a7b0f1c2d"
    assert (
        AlertNotification.objects.get(sink="webhook").ok,
        AlertNotification.objects.get(sink="webhook").error,
    ) == (True, "")


@pytest.mark.django_db
def test_failing_webhook_is_recorded_and_does_not_raise(module_settings, mailoutbox):
    receiver = Receiver(status=500)
    module_settings.ALERT_WEBHOOK_URL = receiver.url
    try:
        result = alert_fire(key=DLQ_DEPTH, severity="high", summary="dlq", now=AFTER_WINDOW)
    finally:
        receiver.stop()
    assert result.decision == "fired"
    failed = AlertNotification.objects.get(sink="webhook")
    assert failed.ok is False
    assert failed.error == "RuntimeError: HTTP 500: no channel"
    # The other sinks still ran.
    assert AlertNotification.objects.get(sink="log").ok
    assert AlertNotification.objects.get(sink="email").ok
    assert len(mailoutbox) == 1


@pytest.mark.django_db
def test_unreachable_webhook_is_recorded_with_the_connection_error(module_settings):
    receiver = Receiver()
    url = receiver.url
    receiver.stop()  # nothing listens on that port any more
    module_settings.ALERT_WEBHOOK_URL = url
    module_settings.ALERT_WEBHOOK_TIMEOUT_SECONDS = 1
    alert_fire(key=DLQ_DEPTH, severity="high", summary="dlq", now=AFTER_WINDOW)
    failed = AlertNotification.objects.get(sink="webhook")
    assert failed.ok is False
    assert "ConnectionError" in failed.error


@pytest.mark.django_db
def test_failing_mail_is_recorded(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    not_smtp = Receiver()  # speaks HTTP, not SMTP
    settings.EMAIL_PORT = not_smtp.server.server_port
    settings.EMAIL_TIMEOUT = 1
    try:
        alert_fire(key=DLQ_DEPTH, severity="high", summary="dlq", now=AFTER_WINDOW)
    finally:
        not_smtp.stop()
    failed = AlertNotification.objects.get(sink="email")
    assert failed.ok is False
    assert failed.error


# --- From payments.alerts.alert_raise ---------------------------------------------------------


@pytest.mark.django_db
def test_alert_raise_is_stored_and_routed_after_commit(webhook, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        alert_raise(
            severity="medium",
            key="payment.submission_rejected",
            summary="processor rejected payment p1 (HTTP 400)",
            details={"http_status": 400},
            payment_id="6f1c1f9e-7a43-4d55-9d0e-8a3a7b0f1c2d",
        )
        assert not Alert.objects.exists()  # not before the caller's transaction commits
    assert len(callbacks) == 1
    alert = Alert.objects.get(key="payment.submission_rejected")
    assert alert.severity == "medium"
    assert str(alert.payment_id) == "6f1c1f9e-7a43-4d55-9d0e-8a3a7b0f1c2d"
    assert alert.details["http_status"] == 400
    assert len(webhook.bodies) == 1


@pytest.mark.django_db
def test_alert_raised_in_a_rolled_back_transaction_is_not_stored(
    django_capture_on_commit_callbacks,
):
    from django.db import transaction

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError), transaction.atomic():
            alert_raise(severity="high", key="k", summary="s")
            raise RuntimeError("rolled back")
    assert callbacks == []
    assert not Alert.objects.exists()


# --- Evaluation against the local SQS server --------------------------------------------------


@pytest.mark.django_db
def test_evaluate_pages_on_dlq_depth_and_resolves_when_it_is_empty(sqs_queues, webhook):
    sqs_queues.client.send_message(
        QueueUrl=sqs_queues.dlq_url,
        MessageBody="{}",
        MessageGroupId="g",
        MessageDeduplicationId="d1",
    )
    result = alerts_evaluate(now=INSIDE_WINDOW)
    assert result.fired[DLQ_DEPTH] == "fired"
    assert Alert.objects.get(key=DLQ_DEPTH, status="firing").severity == "high"

    sqs_queues.client.purge_queue(QueueUrl=sqs_queues.dlq_url)
    result = alerts_evaluate(now=INSIDE_WINDOW + timedelta(minutes=1))
    assert DLQ_DEPTH in result.resolved
    assert Alert.objects.get(key=DLQ_DEPTH).status == "resolved"
    assert [b["body"]["text"].split("]")[0] for b in webhook.bodies] == ["[FIRING", "[RESOLVED"]


@pytest.mark.django_db
def test_evaluate_pages_on_open_dead_letters_inside_the_window(sqs_queues, webhook):
    dead_letter = DeadLetterFactory()
    result = alerts_evaluate(now=INSIDE_WINDOW)
    assert result.fired[DEAD_LETTERS_OPEN] == "fired"
    dead_letter.status = "resolved"
    dead_letter.save()
    result = alerts_evaluate(now=INSIDE_WINDOW + timedelta(minutes=1))
    assert result.resolved == [DEAD_LETTERS_OPEN]


@pytest.mark.django_db
def test_evaluate_backlog_is_suppressed_in_the_window_and_fires_after(
    module_settings, sqs_queues, webhook
):
    module_settings.ALERT_BACKLOG_VISIBLE_MESSAGES = 2
    for i in range(3):
        sqs_queues.client.send_message(
            QueueUrl=sqs_queues.url,
            MessageBody="{}",
            MessageGroupId=f"g{i}",
            MessageDeduplicationId=f"d{i}",
        )
    inside = alerts_evaluate(now=INSIDE_WINDOW)
    assert inside.fired == {BACKLOG: "suppressed"}
    assert webhook.bodies == []
    after = alerts_evaluate(now=AFTER_WINDOW)
    assert after.fired == {BACKLOG: "fired"}
    alert = Alert.objects.get(key=BACKLOG)
    assert alert.suppressed_count == 1
    assert "3 visible messages (threshold 2)" in alert.summary
    assert len(webhook.bodies) == 1

    sqs_queues.client.purge_queue(QueueUrl=sqs_queues.url)
    cleared = alerts_evaluate(now=AFTER_WINDOW + timedelta(minutes=1))
    assert cleared.resolved == [BACKLOG]


@pytest.mark.django_db
def test_evaluate_fires_queue_unreachable_when_sqs_is_down(module_settings, sqs_queues):
    from callbacks import sqs

    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"
    sqs.reset()
    result = alerts_evaluate(now=AFTER_WINDOW)
    assert result.fired == {"queue.unreachable": "fired"}
    # Unknown depth is not "empty": a firing DLQ alert is not resolved by an outage.
    assert DLQ_DEPTH not in result.resolved


@pytest.mark.django_db
def test_evaluate_resolves_one_off_alerts_after_a_quiet_day(sqs_queues):
    alert_fire(key="payment.submission_rejected", severity="medium", summary="r", now=AFTER_WINDOW)
    assert alerts_evaluate(now=AFTER_WINDOW + timedelta(hours=23)).resolved == []
    later = alerts_evaluate(now=AFTER_WINDOW + timedelta(hours=25))
    assert later.resolved == ["payment.submission_rejected"]


@pytest.mark.django_db
def test_dead_letter_alert_resolves_once_a_human_decided(sqs_queues, webhook):
    dead_letter = DeadLetterFactory()
    alert_fire(key=f"dead_letter:{dead_letter.pk}", severity="high", summary="dl", now=AFTER_WINDOW)
    # Still open a day later: not resolved by the quiet-period rule.
    later = alerts_evaluate(now=AFTER_WINDOW + timedelta(days=2))
    assert f"dead_letter:{dead_letter.pk}" not in later.resolved
    dead_letter.status = "discarded"
    dead_letter.save()
    decided = alerts_evaluate(now=AFTER_WINDOW + timedelta(days=2, minutes=1))
    assert f"dead_letter:{dead_letter.pk}" in decided.resolved
    alert = Alert.objects.get(key=f"dead_letter:{dead_letter.pk}")
    assert alert.details["resolved_because"] == f"dead letter {dead_letter.pk} is discarded"


@pytest.mark.django_db
def test_evaluate_alerts_command_prints_each_decision(sqs_queues, capsys):
    from django.core.management import call_command

    call_command("evaluate_alerts")
    assert "no alert condition holds" in capsys.readouterr().out
    DeadLetterFactory()
    call_command("evaluate_alerts")
    assert "dead_letters.open: fired" in capsys.readouterr().out


@pytest.mark.django_db
def test_alert_with_a_payment_reference_that_is_not_a_uuid_is_still_stored():
    result = alert_fire(
        key="dead_letter:7", severity="high", summary="dl", payment_id="g-1", now=AFTER_WINDOW
    )
    assert result.decision == "fired"
    assert result.alert.payment_id is None
    assert result.alert.details["payment_ref"] == "g-1"


@pytest.mark.django_db
def test_processor_rejection_raises_a_medium_alert_through_the_sinks(
    sandbox, webhook, mailoutbox, django_capture_on_commit_callbacks
):
    from payments.services import payment_submit
    from tests.factories import PaymentFactory

    payment = PaymentFactory(source_token="tok_reject_account_closed")
    with django_capture_on_commit_callbacks(execute=True):
        assert payment_submit(payment_id=payment.id).outcome == "rejected"
    alert = Alert.objects.get(key="payment.submission_rejected")
    assert alert.severity == "medium"
    assert alert.payment_id == payment.id
    assert alert.details["http_status"] == 400
    (posted,) = webhook.bodies
    assert posted["body"]["text"].startswith("[FIRING] [medium] payment.submission_rejected")
    assert mailoutbox == []  # medium does not e-mail
