"""Alert policy, history and sinks.

``payments.alerts.alert_raise`` announces an alert with the ``alert_raised`` signal; the
receiver here hands it to ``alert_fire`` after the caller's transaction commits.
``triage.operations.alert_conditions.alerts_evaluate`` (a periodic task) fires condition alerts (DLQ
depth, open dead letters, backlog) through ``alert_fire`` and resolves the ones whose condition
cleared through ``alert_resolve``.

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

import enum
import logging
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import requests
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.mail import mail_admins
from django.db import IntegrityError, transaction
from django.utils import timezone

from triage import conf as triage_conf
from triage.models import (
    Alert,
    AlertNotification,
    AlertSeverity,
    AlertStatus,
)
from triage.settlement_windows import settlement_window_parse

logger = logging.getLogger(__name__)

SEVERITY_RANK = {AlertSeverity.LOW: 0, AlertSeverity.MEDIUM: 1, AlertSeverity.HIGH: 2}
LOG_LEVEL = {
    AlertSeverity.HIGH: logging.ERROR,
    AlertSeverity.MEDIUM: logging.ERROR,
    AlertSeverity.LOW: logging.WARNING,
}


class AlertDecision(enum.StrEnum):
    """What firing or resolving an alert did; the ones sent are also a notification's kind."""

    FIRED = "fired"
    REMINDER = "reminder"
    REPEATED = "repeated"  # fired again within the reminder interval: nothing sent
    SUPPRESSED = "suppressed"  # low severity inside the settlement window: nothing sent
    RESOLVED = "resolved"


NOTIFIED = frozenset({AlertDecision.FIRED, AlertDecision.REMINDER})


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
    decision: AlertDecision  # fired, reminder, repeated (within the interval) or suppressed
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
    window = settlement_window_parse(triage_conf.SETTLEMENT_WINDOW)
    suppress = severity == AlertSeverity.LOW and window is not None and window.contains(now)
    details, payment_id = _payment_reference(dict(details or {}), payment_id)
    with transaction.atomic():
        alert = _firing_alert_lock_or_create(
            key=key, severity=severity, summary=summary, payment_id=payment_id, now=now
        )
        _alert_update(alert, severity=severity, summary=summary, details=details, now=now)
        if payment_id is not None:
            alert.payment_id = payment_id
        decision = _decide(alert, suppress=suppress, now=now)
        alert.save()
    if decision in NOTIFIED:
        return FireResult(alert, decision, _notify(alert, decision))
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
    return FireResult(alert, decision, [])


def _payment_reference(details: dict, payment_id) -> tuple[dict, uuid.UUID | None]:
    """The payment id as a UUID; anything else (a message group of a malformed message) is
    kept in the details, as text."""
    if payment_id is None:
        return details, None
    try:
        return details, uuid.UUID(str(payment_id))
    except ValueError:
        return {**details, "payment_ref": str(payment_id)}, None


def _alert_update(alert: Alert, *, severity: str, summary: str, details: dict, now) -> None:
    """One more occurrence: the latest summary and details; the severity only ever rises."""
    occurrences = int(alert.details.get("occurrences", 0)) + 1
    alert.details = {**details, "occurrences": occurrences}
    alert.summary = summary
    alert.last_fired_at = now
    if SEVERITY_RANK[severity] > SEVERITY_RANK[alert.severity]:
        alert.severity = severity


def _decide(alert: Alert, *, suppress: bool, now: datetime) -> AlertDecision:
    """Whether this occurrence is sent (first time, or a reminder once the interval passed);
    counts it on the alert. Called under the alert's row lock."""
    if suppress:
        alert.suppressed_count += 1
        return AlertDecision.SUPPRESSED
    if alert.last_notified_at is None:
        decision = AlertDecision.FIRED
    elif now - alert.last_notified_at >= reminder_interval(alert.severity):
        decision = AlertDecision.REMINDER
    else:
        return AlertDecision.REPEATED
    alert.last_notified_at = now
    alert.notify_count += 1
    return decision


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
        _notify(alert, AlertDecision.RESOLVED)
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


# Summaries, keys and details quote what came from outside (a processor's reason code or
# message, a queue message's fields): each is bounded, so no value can flood a channel or an
# inbox, and escaped for its sink, so none can format, link or mention on its own behalf.
MAX_KEY_CHARS = 200
MAX_SUMMARY_CHARS = 500
MAX_DETAIL_CHARS = 200
MAX_DETAILS = 20
MAX_SUBJECT_CHARS = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def clip(text: object, limit: int) -> str:
    """``text`` cut to ``limit`` characters, an ellipsis saying it was cut."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def plain_text(text: object, limit: int) -> str:
    """One line of plain text: control characters (CR, LF, tab, C1, the Unicode line and
    paragraph separators) written as escapes, so a value cannot start a line of its own."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), clip(text, limit))


def slack_escape(text: object, limit: int) -> str:
    """Text for Slack's mrkdwn: ``&``, ``<`` and ``>`` escaped as Slack asks, so
    ``<!channel>`` or ``<https://...|label>`` from a processor is shown, not obeyed."""
    clipped = plain_text(text, limit)
    return clipped.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def alert_text(alert: Alert, kind: AlertDecision, *, escape=plain_text) -> str:
    """The alert in one line; ``escape`` makes each outside value safe for the sink."""
    prefix = {
        AlertDecision.FIRED: "FIRING",
        AlertDecision.REMINDER: "STILL FIRING",
        AlertDecision.RESOLVED: "RESOLVED",
    }[kind]
    key = escape(alert.key, MAX_KEY_CHARS)
    summary = escape(alert.summary, MAX_SUMMARY_CHARS)
    text = f"[{prefix}] [{alert.severity}] {key}: {summary}"
    if kind == AlertDecision.REMINDER:
        text += f" (since {alert.first_fired_at:%Y-%m-%d %H:%M} UTC)"
    return text


def webhook_payload(alert: Alert, kind: AlertDecision) -> dict:
    """Slack-compatible body: ``text`` for any consumer, ``attachments`` for the details."""
    color = {"high": "#d00000", "medium": "#ff9900", "low": "#439fe0"}[alert.severity]
    if kind == AlertDecision.RESOLVED:
        color = "#2eb886"
    fields = [
        {"title": "Severity", "value": alert.severity, "short": True},
        {"title": "Key", "value": slack_escape(alert.key, MAX_KEY_CHARS), "short": True},
        {"title": "First fired", "value": alert.first_fired_at.isoformat(), "short": True},
    ]
    if alert.payment_id:
        fields.append({"title": "Payment", "value": str(alert.payment_id), "short": True})
    if alert.suppressed_count:
        fields.append({"title": "Suppressed", "value": str(alert.suppressed_count), "short": True})
    text = alert_text(alert, kind, escape=slack_escape)
    return {
        "text": text,
        "attachments": [
            {
                "color": color,
                "fallback": text,
                "fields": fields,
                "footer": f"payments alert ({kind})",
            }
        ],
    }


def _send_log(alert: Alert, kind: AlertDecision) -> None:
    level = logging.INFO if kind == AlertDecision.RESOLVED else LOG_LEVEL[alert.severity]
    logger.log(level, "%s", alert_text(alert, kind), extra=_log_extra(alert))


def _send_webhook(alert: Alert, kind: AlertDecision) -> None:
    response = requests.post(
        triage_conf.ALERT_WEBHOOK_URL,
        json=webhook_payload(alert, kind),
        timeout=triage_conf.ALERT_WEBHOOK_TIMEOUT_SECONDS,
    )
    if not 200 <= response.status_code < 300:
        raise RuntimeError(f"HTTP {response.status_code}: {response.text[:500]}")


def email_subject(alert: Alert, kind: AlertDecision) -> str:
    """One line, no CR or LF (a header cannot be injected, and Django would refuse the mail,
    silencing the alert), bounded."""
    return clip(alert_text(alert, kind), MAX_SUBJECT_CHARS)


def email_body(alert: Alert, kind: AlertDecision) -> str:
    """Plain text, one line per detail: a value cannot add a line that looks like another
    detail, and each is bounded and quoted."""
    details = sorted(alert.details.items())
    lines = [
        f'{plain_text(k, 64)}: "{plain_text(v, MAX_DETAIL_CHARS)}"'
        if isinstance(v, str)
        else f"{plain_text(k, 64)}: {plain_text(v, MAX_DETAIL_CHARS)}"
        for k, v in details[:MAX_DETAILS]
    ]
    if len(details) > MAX_DETAILS:
        lines.append(f"... and {len(details) - MAX_DETAILS} more details, in the admin")
    return alert_text(alert, kind) + "\n\n" + "\n".join(lines)


def _send_email(alert: Alert, kind: AlertDecision) -> None:
    mail_admins(email_subject(alert, kind), email_body(alert, kind), fail_silently=False)


def _sinks(alert: Alert) -> list[tuple[str, object]]:
    sinks: list[tuple[str, object]] = [("log", _send_log)]
    if triage_conf.ALERT_WEBHOOK_URL:
        sinks.append(("webhook", _send_webhook))
    if alert.severity == AlertSeverity.HIGH and settings.ADMINS:
        sinks.append(("email", _send_email))
    return sinks


def _notify(alert: Alert, kind: AlertDecision) -> list[AlertNotification]:
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
