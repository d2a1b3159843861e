"""One way to raise an alert, whatever later routes it (webhook, pager, history table).

For now an alert is a log line (ERROR for high and medium, WARNING for low) carrying the payment
id in ``extra``, plus the ``payments.signals.alert_raised`` signal for sinks to connect to.
"""

import enum
import hashlib
import logging

from payments.signals import alert_cleared, alert_raised

logger = logging.getLogger(__name__)


class AlertSeverity(enum.StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


SEVERITIES = tuple(AlertSeverity)
# The width of an alert's key where alerts are stored (triage's ``Alert.key``).
ALERT_KEY_MAX = 255
_KEY_DIGEST = 16


def alert_key_bounded(key: str) -> str:
    """``key`` when it fits ``ALERT_KEY_MAX`` characters, else its start and a hash of the whole
    (``...~<16 hex>``): a key built from foreign input (a bank's file name) always fits its
    column, and two long names that share a start stay two alerts. ``alert_raise`` bounds every
    key this way and keeps the whole one in the alert's details (``key``)."""
    if len(key) <= ALERT_KEY_MAX:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:_KEY_DIGEST]
    return f"{key[: ALERT_KEY_MAX - _KEY_DIGEST - 1]}~{digest}"


def alert_raise(
    *,
    severity: AlertSeverity | str,
    key: str,
    summary: str,
    details: dict | None = None,
    payment_id=None,
) -> None:
    """Log the alert and announce it; a failing receiver is logged, never loses the log line."""
    if severity not in SEVERITIES:
        raise ValueError(f"unknown alert severity {severity!r}; use one of {', '.join(SEVERITIES)}")
    severity = AlertSeverity(severity).value  # receivers and logs get the plain word
    if not key:
        raise ValueError("an alert needs a key (what kind of problem it is) to be grouped by")
    if len(key) > ALERT_KEY_MAX:
        details = {**(details or {}), "key": key}
        key = alert_key_bounded(key)
    payment_ref = str(payment_id) if payment_id is not None else None
    level = logging.WARNING if severity == AlertSeverity.LOW else logging.ERROR
    logger.log(
        level,
        "ALERT %s [%s] %s",
        severity,
        key,
        summary,
        extra={
            "payment_id": payment_ref,
            "alert_key": key,
            "alert_severity": severity,
            "alert_details": details or {},
        },
    )
    # send_robust: one broken sink must not stop the others, nor the caller's work.
    for receiver, response in alert_raised.send_robust(
        sender=alert_raise,
        severity=severity,
        key=key,
        summary=summary,
        details=details or {},
        payment_id=payment_ref,
    ):
        if isinstance(response, Exception):
            logger.error(
                "alert receiver %r failed for alert %s: %r",
                receiver,
                key,
                response,
                exc_info=response,
                extra={"payment_id": payment_ref},
            )


def alert_clear(*, key: str, reason: str = "") -> None:
    """Announce that the condition behind alert ``key`` has ended (the sinks resolve it)."""
    if not key:
        raise ValueError("an alert key is required")
    logger.info("ALERT cleared [%s] %s", key, reason, extra={"alert_key": key})
    for receiver, response in alert_cleared.send_robust(sender=alert_clear, key=key, reason=reason):
        if isinstance(response, Exception):
            logger.error(
                "alert receiver %r failed clearing alert %s: %r",
                receiver,
                key,
                response,
                exc_info=response,
            )
