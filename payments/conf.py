"""The payments app's settings, each with its default kept here.

Read them as ``conf.NAME`` (at call time, so a changed setting is seen): the host project's
value when it sets one, else the default below. A host sets only ``REQUIRED``.
"""

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

REQUIRED = ("PROCESSOR_BASE_URL", "PROCESSOR_API_KEY")

DEFAULTS: dict[str, Any] = {
    "PROCESSOR_TIMEOUT_SECONDS": 10.0,
    "PROCESSOR_CONNECT_TIMEOUT_SECONDS": 3.05,
    # Dedup records of processed events outlive SQS's 5-minute window by far.
    "PROCESSED_EVENT_RETENTION": timedelta(days=30),
    "API_IDEMPOTENCY_RETENTION": timedelta(hours=24),
    # The largest request body the payments API reads (bytes): a create is a few hundred bytes;
    # a larger body is answered 413 after reading at most one byte past it.
    "PAYMENTS_API_MAX_BODY_BYTES": 64 * 1024,
    # Published outbox rows: the queue message and the event log carry what they said; a week
    # is for looking into a publish that went wrong.
    "OUTBOX_RETENTION": timedelta(days=7),
    # Breaker transitions: an incident's history, read when it is reviewed.
    "BREAKER_TRANSITION_RETENTION": timedelta(days=90),
    # Rows per DELETE (each its own transaction) of every retention purge (payments.retention).
    "RETENTION_PURGE_BATCH_SIZE": 1000,
    # Per-merchant return rates (payments.return_rates): the rolling window in days, the NACHA
    # thresholds in percent (a host may set only some; the others keep these), the fraction of
    # a threshold that warns, and the debits in the window before a merchant is alerted on.
    "RETURN_RATE_WINDOW_DAYS": 60,
    "RETURN_RATE_THRESHOLDS": {
        "unauthorized": Decimal("0.5"),
        "administrative": Decimal("3.0"),
        "overall": Decimal("15.0"),
    },
    "RETURN_RATE_WARNING_FRACTION": 0.8,
    "RETURN_RATE_MIN_DEBITS": 20,
    # Dotted path of a callable ``(user, merchant_id) -> bool``: may this API user act for this
    # merchant? The default reads the MerchantAccess grants edited in the admin.
    "PAYMENTS_MERCHANT_ACCESS_POLICY": "payments.access.merchant_access_granted",
    # The processor's circuit breaker (payments.processor.breaker): open after this many
    # failures in a row, or when this share of the last WINDOW_CALLS first submissions (none
    # older than WINDOW_SECONDS) failed; after the pause, TRIAL_CALLS real submissions are let
    # through and it closes once they all succeed; every reopening doubles the pause up to the
    # cap; a reopening within INCIDENT_COOLDOWN_SECONDS of a close is the same incident.
    "PROCESSOR_BREAKER_FAILURES": 5,
    "PROCESSOR_BREAKER_FAILURE_RATE": 0.5,
    "PROCESSOR_BREAKER_WINDOW_CALLS": 10,
    "PROCESSOR_BREAKER_WINDOW_SECONDS": 60.0,
    "PROCESSOR_BREAKER_PAUSE_SECONDS": 15.0,
    "PROCESSOR_BREAKER_MAX_PAUSE_SECONDS": 300.0,
    "PROCESSOR_BREAKER_TRIAL_CALLS": 3,
    "PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS": 300.0,
}


def __getattr__(name: str) -> Any:
    if name in DEFAULTS:
        return getattr(settings, name, DEFAULTS[name])
    if name in REQUIRED:
        value = getattr(settings, name, None)
        if not value:
            raise ImproperlyConfigured(f"{name} is required by the payments app and is not set")
        return value
    raise AttributeError(f"payments.conf has no setting {name}")
