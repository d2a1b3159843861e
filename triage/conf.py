"""The triage app's settings, each with its default kept here.

Read them as ``conf.NAME`` (at call time, so a changed setting is seen): the host project's
value when it sets one, else the default below. Triage has no required setting.
"""

from datetime import timedelta
from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # None: alerts go to the log and to ADMINS by e-mail only.
    "ALERT_WEBHOOK_URL": None,
    "ALERT_WEBHOOK_TIMEOUT_SECONDS": 5.0,
    # Backlog alerts are silent inside this window, when the processor's batch lands.
    "SETTLEMENT_WINDOW": "Mon-Fri 05:00-08:00 America/Chicago",
    # A firing alert is re-sent at most once per interval of its severity.
    "ALERT_REMINDER_INTERVALS": {
        "high": timedelta(minutes=15),
        "medium": timedelta(minutes=60),
        "low": timedelta(minutes=240),
    },
    "ALERT_BACKLOG_VISIBLE_MESSAGES": 1000,
    "ALERT_BACKLOG_OLDEST_AGE": timedelta(seconds=600),
    # One-off alerts (a rejected submission) resolve by themselves after this long.
    "ALERT_EVENT_QUIET_RESOLVE": timedelta(hours=24),
    # Dead letters reach a human (and page) within this many seconds of reaching the DLQ.
    "DLQ_INGEST_INTERVAL_SECONDS": 60.0,
    # Resolved alerts and their notifications (the alert history page).
    "ALERT_RETENTION": timedelta(days=90),
    # Items of finished bulk jobs; the job row itself is kept with the audit trail.
    "BULK_JOB_RETENTION": timedelta(days=30),
    # A bulk triage job acts on at most this many dead letters per second, and looks for a
    # cancel between batches of this size.
    "TRIAGE_BULK_RATE_PER_SECOND": 20.0,
    "TRIAGE_BULK_BATCH_SIZE": 100,
    # Longer than a batch takes at the slowest sensible rate, so a live job is never taken for
    # dead (and if it were, its lock keeps the second copy out).
    "TRIAGE_BULK_STALE_SECONDS": 300,
}


def __getattr__(name: str) -> Any:
    if name in DEFAULTS:
        return getattr(settings, name, DEFAULTS[name])
    raise AttributeError(f"triage.conf has no setting {name}")
