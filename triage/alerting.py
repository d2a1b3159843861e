"""Alert policy, history and sinks.

``payments.alerts.alert_raise`` announces an alert with the ``alert_raised`` signal; the
receiver here hands it to ``alert_fire`` after the caller's transaction commits.
``alerts_evaluate`` (a periodic task) fires condition alerts (DLQ depth, open dead letters,
backlog) and resolves the ones whose condition cleared.

Policy:

- one ``Alert`` row per key while it fires (a unique constraint): repeats update it;
- a firing alert is notified when it starts, then at most once per reminder interval of its
  severity (``ALERT_REMINDER_INTERVALS``), never on every evaluation;
- low severity (backlog) is suppressed inside ``SETTLEMENT_WINDOW``, the predictable T+1
  settlement batch: the row is kept and ``suppressed_count`` rises, nothing is sent; if it still
  fires after the window it is notified then. High and medium are never suppressed;
- resolving notifies "resolved" on the sinks that heard about the alert.

Sinks: the log (every decision, always), a Slack-compatible webhook (``ALERT_WEBHOOK_URL``) and
e-mail to ``ADMINS`` for high severity. Every send is recorded as an ``AlertNotification``; a
failing sink is recorded with ``ok=False`` and its error and never raises into the caller. The
decision to notify is taken under the alert's row lock and committed before anything is sent,
so two evaluations running at once cannot both notify.
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import requests
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.mail import mail_admins
from django.db import IntegrityError, transaction
from django.utils import timezone

from triage import conf as triage_conf
from triage.models import Alert, AlertNotification, AlertSeverity, AlertStatus

logger = logging.getLogger(__name__)

SEVERITY_RANK = {AlertSeverity.LOW: 0, AlertSeverity.MEDIUM: 1, AlertSeverity.HIGH: 2}
LOG_LEVEL = {
    AlertSeverity.HIGH: logging.ERROR,
    AlertSeverity.MEDIUM: logging.ERROR,
    AlertSeverity.LOW: logging.WARNING,
}

# Keys of the conditions ``alerts_evaluate`` checks; any other key is a one-off event alert.
DLQ_DEPTH = "queue.dlq_not_empty"
DEAD_LETTERS_OPEN = "dead_letters.open"
BACKLOG = "queue.backlog"
QUEUE_UNREACHABLE = "queue.unreachable"
# Raised by the processor's circuit breaker when it opens, cleared when it closes; the
# evaluation keeps it firing (reminders) while the breaker is open.
PROCESSOR_UNAVAILABLE = "processor.unavailable"
CONDITION_KEYS = (DLQ_DEPTH, DEAD_LETTERS_OPEN, BACKLOG, QUEUE_UNREACHABLE, PROCESSOR_UNAVAILABLE)
# Alerts raised per dead letter at ingestion: "dead_letter:<DeadLetter pk>".
DEAD_LETTER_PREFIX = "dead_letter:"

FIRED, REMINDER, RESOLVED = "fired", "reminder", "resolved"
SUPPRESSED, REPEATED = "suppressed", "repeated"


# --- Settlement window -------------------------------------------------------------------------

DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_WINDOW_RE = re.compile(
    r"^(?P<days>[A-Za-z,\-]+)\s+(?P<start>\d{2}:\d{2})-(?P<end>\d{2}:\d{2})\s+(?P<tz>\S+)$"
)


@dataclass(frozen=True)
class SettlementWindow:
    """Weekly window, e.g. ``Mon-Fri 05:00-08:00 America/Chicago``.

    Days are names (``Mon``..``Sun``), ranges (``Mon-Fri``, ``Sat-Mon`` wraps) or comma lists.
    An end before the start crosses midnight; the day names the day the window opens.
    """

    days: frozenset[int]
    start: time
    end: time
    tz: ZoneInfo
    text: str

    def contains(self, moment: datetime) -> bool:
        local = moment.astimezone(self.tz)
        clock = local.time().replace(tzinfo=None)
        weekday = local.weekday()
        if self.start < self.end:
            return weekday in self.days and self.start <= clock < self.end
        # Crosses midnight: the evening part of an open day, or the morning after one.
        if weekday in self.days and clock >= self.start:
            return True
        return (weekday - 1) % 7 in self.days and clock < self.end


def _window_error(text: str, problem: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(
        f"SETTLEMENT_WINDOW {text!r}: {problem}. Expected '<days> <HH:MM>-<HH:MM> <IANA zone>', "
        "such as 'Mon-Fri 05:00-08:00 America/Chicago', or an empty value for no window."
    )


def _parse_day(text: str, name: str) -> int:
    try:
        return DAY_NAMES.index(name.capitalize())
    except ValueError:
        raise _window_error(text, f"unknown day {name!r} (use {', '.join(DAY_NAMES)})") from None


def _parse_clock(text: str, value: str) -> time:
    hours, minutes = (int(part) for part in value.split(":"))
    if hours > 23 or minutes > 59:
        raise _window_error(text, f"{value!r} is not a time of day")
    return time(hours, minutes)


def settlement_window_parse(text: str | None) -> SettlementWindow | None:
    """Parse the setting strictly; ``None`` or blank means no window. Raises
    ``ImproperlyConfigured`` naming ``SETTLEMENT_WINDOW`` and what is wrong."""
    if text is None or not text.strip():
        return None
    match = _WINDOW_RE.match(text.strip())
    if match is None:
        raise _window_error(text, "not in the expected form")
    days: set[int] = set()
    for part in match["days"].split(","):
        if not part:
            raise _window_error(text, "empty day in the day list")
        if "-" in part:
            first, _, last = part.partition("-")
            if not first or not last or "-" in last:
                raise _window_error(text, f"bad day range {part!r}")
            a, b = _parse_day(text, first), _parse_day(text, last)
            day = a
            days.add(day)
            while day != b:
                day = (day + 1) % 7
                days.add(day)
        else:
            days.add(_parse_day(text, part))
    start = _parse_clock(text, match["start"])
    end = _parse_clock(text, match["end"])
    if start == end:
        raise _window_error(text, "the window starts and ends at the same time")
    try:
        tz = ZoneInfo(match["tz"])
    except (ZoneInfoNotFoundError, ValueError):
        raise _window_error(text, f"unknown time zone {match['tz']!r}") from None
    return SettlementWindow(frozenset(days), start, end, tz, text.strip())


def settlement_window() -> SettlementWindow | None:
    return settlement_window_parse(triage_conf.SETTLEMENT_WINDOW)


def reminder_interval(severity: str) -> timedelta:
    intervals = triage_conf.ALERT_REMINDER_INTERVALS
    try:
        return intervals[severity]
    except KeyError:
        raise ImproperlyConfigured(
            f"ALERT_REMINDER_INTERVALS has no interval for severity {severity!r}"
        ) from None


# --- Fire and resolve --------------------------------------------------------------------------


@dataclass(frozen=True)
class FireResult:
    alert: Alert
    decision: str  # fired, reminder, repeated (within the interval) or suppressed
    notifications: list[AlertNotification]


def alert_fire(
    *,
    key: str,
    severity: str,
    summary: str,
    details: dict | None = None,
    payment_id=None,
    now: datetime | None = None,
) -> FireResult:
    """Record that the alert ``key`` fires now and notify the sinks if the policy says so.

    Never call inside a transaction that may roll back: it commits its decision and then sends.
    """
    if severity not in SEVERITY_RANK:
        raise ValueError(
            f"unknown alert severity {severity!r}; use one of {', '.join(SEVERITY_RANK)}"
        )
    if not key:
        raise ValueError("an alert needs a key")
    now = now or timezone.now()
    window = settlement_window()
    suppress = severity == AlertSeverity.LOW and window is not None and window.contains(now)
    details = dict(details or {})
    if payment_id is not None:
        try:
            payment_id = uuid.UUID(str(payment_id))
        except ValueError:
            # Not a payment id (a message group of a malformed message): keep it, as text.
            details["payment_ref"] = str(payment_id)
            payment_id = None

    with transaction.atomic():
        alert = _firing_alert_lock_or_create(
            key=key, severity=severity, summary=summary, payment_id=payment_id, now=now
        )
        occurrences = int(alert.details.get("occurrences", 0)) + 1
        alert.details = {**details, "occurrences": occurrences}
        alert.summary = summary
        alert.last_fired_at = now
        if SEVERITY_RANK[severity] > SEVERITY_RANK[alert.severity]:
            alert.severity = severity
        if payment_id is not None:
            alert.payment_id = payment_id
        if suppress:
            alert.suppressed_count += 1
            decision = SUPPRESSED
        elif alert.last_notified_at is None:
            decision = FIRED
        elif now - alert.last_notified_at >= reminder_interval(alert.severity):
            decision = REMINDER
        else:
            decision = REPEATED
        if decision in (FIRED, REMINDER):
            alert.last_notified_at = now
            alert.notify_count += 1
        alert.save()

    notifications: list[AlertNotification] = []
    if decision in (FIRED, REMINDER):
        notifications = _notify(alert, decision)
    else:
        logger.log(
            logging.INFO,
            "alert %s [%s] %s (%s: %s)",
            alert.severity,
            key,
            decision,
            summary,
            f"inside settlement window {window.text}" if suppress else "within reminder interval",
            extra=_log_extra(alert),
        )
    return FireResult(alert, decision, notifications)


def _firing_alert_lock_or_create(*, key, severity, summary, payment_id, now) -> Alert:
    alert = Alert.objects.select_for_update().filter(key=key, status=AlertStatus.FIRING).first()
    if alert is not None:
        return alert
    try:
        with transaction.atomic():
            alert = Alert.objects.create(
                key=key,
                severity=severity,
                summary=summary,
                payment_id=payment_id,
                details={},
            )
    except IntegrityError:
        # Another evaluation created the firing row first (one firing row per key): use it.
        return Alert.objects.select_for_update().get(key=key, status=AlertStatus.FIRING)
    # auto_now_add stamps the wall clock; the policy runs on the injected one.
    Alert.objects.filter(pk=alert.pk).update(first_fired_at=now, last_fired_at=now)
    alert.first_fired_at = alert.last_fired_at = now
    return alert


def alert_resolve(*, key: str, now: datetime | None = None, reason: str = "") -> Alert | None:
    """Mark the firing alert ``key`` resolved and tell the sinks that heard of it.

    Returns the alert, or ``None`` when nothing was firing under that key. An alert that was
    only ever suppressed is resolved quietly (the log still says so).
    """
    now = now or timezone.now()
    with transaction.atomic():
        alert = Alert.objects.select_for_update().filter(key=key, status=AlertStatus.FIRING).first()
        if alert is None:
            return None
        alert.status = AlertStatus.RESOLVED
        alert.resolved_at = now
        if reason:
            alert.details = {**alert.details, "resolved_because": reason}
        alert.save(update_fields=["status", "resolved_at", "details"])
    if alert.notify_count:
        _notify(alert, RESOLVED)
    else:
        logger.info(
            "alert %s [%s] resolved without having been notified (%s)",
            alert.severity,
            key,
            reason or "condition cleared",
            extra=_log_extra(alert),
        )
    return alert


# --- Sinks -------------------------------------------------------------------------------------


def _log_extra(alert: Alert) -> dict:
    return {
        "payment_id": str(alert.payment_id) if alert.payment_id else None,
        "alert_key": alert.key,
        "alert_severity": alert.severity,
    }


def alert_text(alert: Alert, kind: str) -> str:
    prefix = {FIRED: "FIRING", REMINDER: "STILL FIRING", RESOLVED: "RESOLVED"}[kind]
    text = f"[{prefix}] [{alert.severity}] {alert.key}: {alert.summary}"
    if kind == REMINDER:
        text += f" (since {alert.first_fired_at:%Y-%m-%d %H:%M} UTC)"
    return text


def webhook_payload(alert: Alert, kind: str) -> dict:
    """Slack-compatible body: ``text`` for any consumer, ``attachments`` for the details."""
    color = {"high": "#d00000", "medium": "#ff9900", "low": "#439fe0"}[alert.severity]
    if kind == RESOLVED:
        color = "#2eb886"
    fields = [
        {"title": "Severity", "value": alert.severity, "short": True},
        {"title": "Key", "value": alert.key, "short": True},
        {"title": "First fired", "value": alert.first_fired_at.isoformat(), "short": True},
    ]
    if alert.payment_id:
        fields.append({"title": "Payment", "value": str(alert.payment_id), "short": True})
    if alert.suppressed_count:
        fields.append({"title": "Suppressed", "value": str(alert.suppressed_count), "short": True})
    return {
        "text": alert_text(alert, kind),
        "attachments": [
            {
                "color": color,
                "fallback": alert_text(alert, kind),
                "fields": fields,
                "footer": f"payments alert ({kind})",
            }
        ],
    }


def _send_log(alert: Alert, kind: str) -> None:
    level = logging.INFO if kind == RESOLVED else LOG_LEVEL[alert.severity]
    logger.log(level, "%s", alert_text(alert, kind), extra=_log_extra(alert))


def _send_webhook(alert: Alert, kind: str) -> None:
    response = requests.post(
        triage_conf.ALERT_WEBHOOK_URL,
        json=webhook_payload(alert, kind),
        timeout=triage_conf.ALERT_WEBHOOK_TIMEOUT_SECONDS,
    )
    if not 200 <= response.status_code < 300:
        raise RuntimeError(f"HTTP {response.status_code}: {response.text[:500]}")


def _send_email(alert: Alert, kind: str) -> None:
    body = (
        alert_text(alert, kind)
        + "\n\n"
        + "\n".join(f"{k}: {v}" for k, v in sorted(alert.details.items()))
    )
    mail_admins(alert_text(alert, kind)[:200], body, fail_silently=False)


def _sinks(alert: Alert) -> list[tuple[str, object]]:
    sinks: list[tuple[str, object]] = [("log", _send_log)]
    if triage_conf.ALERT_WEBHOOK_URL:
        sinks.append(("webhook", _send_webhook))
    if alert.severity == AlertSeverity.HIGH and settings.ADMINS:
        sinks.append(("email", _send_email))
    return sinks


def _notify(alert: Alert, kind: str) -> list[AlertNotification]:
    """Send to every sink; record each outcome. A failing sink never raises."""
    records = []
    for name, send in _sinks(alert):
        try:
            send(alert, kind)
        except Exception as exc:  # noqa: BLE001 - any sink failure is recorded, not raised
            error = f"{type(exc).__name__}: {exc}"
            logger.error(
                "alert sink %s failed for %s (%s): %s",
                name,
                alert.key,
                kind,
                error,
                extra=_log_extra(alert),
            )
            records.append(
                AlertNotification(alert=alert, kind=kind, sink=name, ok=False, error=error)
            )
        else:
            records.append(AlertNotification(alert=alert, kind=kind, sink=name, ok=True))
    return AlertNotification.objects.bulk_create(records)


# --- The receiver of payments.signals.alert_raised --------------------------------------------


def alert_raised_receiver(
    sender, *, severity, key, summary, details=None, payment_id=None, **kwargs
) -> None:
    """Store and route an alert raised anywhere in the product, once the caller's transaction
    has committed (immediately outside one). A rolled-back caller raises nothing: its log line
    from ``alert_raise`` remains."""

    def fire() -> None:
        try:
            alert_fire(
                key=key,
                severity=severity,
                summary=summary,
                details=details,
                payment_id=payment_id,
            )
        except Exception:
            # The caller's work is committed; losing the alert row must not undo or fail it.
            logger.exception("could not record alert %s: %s", key, summary)

    transaction.on_commit(fire)


def alert_cleared_receiver(sender, *, key, reason="", **kwargs) -> None:
    """Resolve the alert ``key`` once the caller's transaction has committed."""

    def resolve() -> None:
        try:
            alert_resolve(key=key, reason=reason)
        except Exception:
            # Still firing: the next evaluation resolves it if its condition has cleared.
            logger.exception("could not resolve alert %s", key)

    transaction.on_commit(resolve)


# --- Evaluation of conditions ------------------------------------------------------------------


@dataclass(frozen=True)
class EvaluationResult:
    fired: dict[str, str]  # key -> decision
    resolved: list[str]


def alerts_evaluate(*, now: datetime | None = None) -> EvaluationResult:
    """Check every alert condition once: fire what holds, resolve what cleared."""
    from triage.monitoring import operations_snapshot

    now = now or timezone.now()
    snapshot = operations_snapshot(now=now)
    fired: dict[str, str] = {}
    resolved: list[str] = []

    def fire(key: str, severity: str, summary: str, details: dict) -> None:
        fired[key] = alert_fire(
            key=key, severity=severity, summary=summary, details=details, now=now
        ).decision

    def resolve(key: str, reason: str) -> None:
        if alert_resolve(key=key, now=now, reason=reason) is not None:
            resolved.append(key)

    if snapshot.queue_error:
        fire(
            QUEUE_UNREACHABLE,
            AlertSeverity.MEDIUM,
            f"cannot read queue attributes: {snapshot.queue_error}",
            {"error": snapshot.queue_error},
        )
    else:
        resolve(QUEUE_UNREACHABLE, "queue attributes readable again")
        if snapshot.dlq_visible + snapshot.dlq_in_flight > 0:
            fire(
                DLQ_DEPTH,
                AlertSeverity.HIGH,
                f"{snapshot.dlq_visible + snapshot.dlq_in_flight} message(s) in the dead-letter "
                "queue",
                {"visible": snapshot.dlq_visible, "in_flight": snapshot.dlq_in_flight},
            )
        else:
            resolve(DLQ_DEPTH, "dead-letter queue empty")

    if snapshot.open_dead_letters is not None:
        if snapshot.open_dead_letters > 0:
            fire(
                DEAD_LETTERS_OPEN,
                AlertSeverity.HIGH,
                f"{snapshot.open_dead_letters} dead letter(s) waiting for a decision in triage",
                {"open": snapshot.open_dead_letters},
            )
        else:
            resolve(DEAD_LETTERS_OPEN, "no open dead letters")

    backlog_reasons = []
    if (
        snapshot.main_visible is not None
        and snapshot.main_visible > triage_conf.ALERT_BACKLOG_VISIBLE_MESSAGES
    ):
        backlog_reasons.append(
            f"{snapshot.main_visible} visible messages "
            f"(threshold {triage_conf.ALERT_BACKLOG_VISIBLE_MESSAGES})"
        )
    threshold_age = triage_conf.ALERT_BACKLOG_OLDEST_AGE.total_seconds()
    if snapshot.oldest_unfinished_age is not None and snapshot.oldest_unfinished_age > (
        threshold_age
    ):
        backlog_reasons.append(
            f"oldest unfinished message is {snapshot.oldest_unfinished_age:.0f} s old "
            f"(threshold {threshold_age:.0f} s)"
        )
    if backlog_reasons:
        fire(
            BACKLOG,
            AlertSeverity.LOW,
            "queue backlog: " + "; ".join(backlog_reasons),
            {
                "visible": snapshot.main_visible,
                "oldest_unfinished_age_seconds": snapshot.oldest_unfinished_age,
            },
        )
    elif snapshot.main_visible is not None:
        resolve(BACKLOG, "backlog under thresholds")

    _evaluate_processor_breaker(fire, resolve)

    # One alert per dead letter (raised at ingestion): resolved once a human has decided.
    firing_dead_letters = {
        key: key.split(":", 1)[1]
        for key in Alert.objects.filter(
            status=AlertStatus.FIRING, key__startswith=DEAD_LETTER_PREFIX
        ).values_list("key", flat=True)
    }
    if firing_dead_letters:
        from triage.models import DeadLetter, DeadLetterStatus

        ids = [pk for pk in firing_dead_letters.values() if pk.isdigit()]
        decided = dict(
            DeadLetter.objects.filter(pk__in=ids)
            .exclude(status=DeadLetterStatus.OPEN)
            .values_list("pk", "status")
        )
        for key, pk in firing_dead_letters.items():
            if pk.isdigit() and int(pk) in decided:
                resolve(key, f"dead letter {pk} is {decided[int(pk)]}")

    # Merchants' return rates against the NACHA thresholds (one query over daily counters).
    from triage.return_rates import RETURN_RATE_PREFIX, return_rate_alerts_evaluate

    return_rates = return_rate_alerts_evaluate(now=now)
    fired.update(return_rates["fired"])
    resolved.extend(return_rates["resolved"])

    # Other one-off alerts (a rejected submission) resolve after a quiet period.
    quiet_since = now - triage_conf.ALERT_EVENT_QUIET_RESOLVE
    for key in (
        Alert.objects.filter(status=AlertStatus.FIRING, last_fired_at__lt=quiet_since)
        .exclude(key__in=CONDITION_KEYS)
        .exclude(key__startswith=DEAD_LETTER_PREFIX)
        .exclude(key__startswith=RETURN_RATE_PREFIX)
        .values_list("key", flat=True)
    ):
        resolve(key, f"no repeat for {triage_conf.ALERT_EVENT_QUIET_RESOLVE}")
    return EvaluationResult(fired, resolved)


def _evaluate_processor_breaker(fire, resolve) -> None:
    """While the breaker is open the alert keeps firing, so the reminder policy reminds about
    it with a fresh count of waiting payments; a closed breaker resolves a leftover alert (one
    whose clearing was lost with a crashed process)."""
    from payments.models import BreakerState, CircuitBreaker
    from payments.processor.breaker import (
        PROCESSOR,
        alert_unavailable_summary,
        payments_waiting_count,
    )

    breaker = CircuitBreaker.objects.filter(name=PROCESSOR).first()
    if breaker is None or breaker.state == BreakerState.CLOSED or breaker.opened_at is None:
        resolve(PROCESSOR_UNAVAILABLE, "processor breaker closed")
        return
    waiting = payments_waiting_count()
    fire(
        PROCESSOR_UNAVAILABLE,
        AlertSeverity.HIGH,
        alert_unavailable_summary(opened_at=breaker.opened_at, waiting=waiting),
        {
            "opened_at": breaker.opened_at.isoformat(),
            "payments_waiting": waiting,
            "state": breaker.state,
            "last_error": breaker.last_error[:500],
        },
    )
