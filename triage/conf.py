"""The triage app's settings, each with its default kept here.

A host sets them in one dict, ``TRIAGE = {"ALERT_WEBHOOK_URL": ..., ...}``
(``payments.kernel.app_settings``); the code reads them as ``conf.NAME`` (at call time, so a changed
setting is seen): the host's value when it sets one, else the default below. Triage has no
required setting.
"""

from datetime import timedelta
from decimal import Decimal
from typing import Any

from payments.kernel.app_settings import AppSettings
from payments.kernel.setting_specs import (
    Duration,
    Keys,
    Number,
    Parsed,
    Seconds,
    Spec,
    Url,
    defaults,
)
from triage.settlement_windows import settlement_window_parse


def _settlement_window_parse(value: Any) -> Any:
    return settlement_window_parse(value)


# Each setting with its default and what it accepts: ``manage.py check`` refuses any other value
# (triage.checks), so a nonsense one stops start-up instead of breaking every alert later.
SPECS: dict[str, Spec] = {
    # None: alerts go to the log and to ADMINS by e-mail only.
    "ALERT_WEBHOOK_URL": Url(None),
    # An alert is sent inside the call that raised it: a long wait would hold up that call.
    "ALERT_WEBHOOK_TIMEOUT_SECONDS": Seconds(5.0, 60),
    # Backlog alerts are silent inside this window, when the processor's batch lands. Checked
    # with the parser alerting uses each time: a window it cannot read stops every alert.
    "SETTLEMENT_WINDOW": Parsed(
        "Mon-Fri 05:00-08:00 America/Chicago",
        parse=_settlement_window_parse,
        accepted="'<days> <HH:MM>-<HH:MM> <IANA zone>' such as "
        "'Mon-Fri 05:00-08:00 America/Chicago', or blank/None for no window",
    ),
    # A firing alert is re-sent at most once per interval of its severity (each severity needs
    # one: an alert of a severity without an interval could not fire).
    "ALERT_REMINDER_INTERVALS": Keys(
        values={
            severity: Duration(timedelta(minutes=minutes), maximum=timedelta(days=30))
            for severity, minutes in (("high", 15), ("medium", 60), ("low", 240))
        },
    ),
    "ALERT_BACKLOG_VISIBLE_MESSAGES": Number(
        1000, 1, 1_000_000_000, whole=True, unit="of messages"
    ),
    "ALERT_BACKLOG_OLDEST_AGE": Duration(timedelta(seconds=600), maximum=timedelta(days=14)),
    # One-off alerts (a rejected submission) resolve by themselves after this long.
    "ALERT_EVENT_QUIET_RESOLVE": Duration(timedelta(hours=24)),
    # Dead letters reach a human (and page) within this many seconds of reaching the DLQ; an
    # hour at most, so a dead letter never waits longer than that unseen.
    "DLQ_INGEST_INTERVAL_SECONDS": Seconds(60.0, 3600),
    # Resolved alerts and their notifications (the alert history page).
    "ALERT_RETENTION": Duration(timedelta(days=90)),
    # Items of finished bulk jobs; the job row itself is kept with the audit trail.
    "BULK_JOB_RETENTION": Duration(timedelta(days=30)),
    # Per-merchant return rates (triage.operations.return_rates, over the day counters payments
    # keeps): the rolling window in days, the NACHA thresholds in percent (a host may set only
    # some; the others keep these), the fraction of a threshold that warns, and the debits in
    # the window before a merchant is alerted on.
    "RETURN_RATE_WINDOW_DAYS": Number(60, 1, 3650, whole=True, unit="of days"),
    "RETURN_RATE_THRESHOLDS": Keys(
        values={
            kind: Number(Decimal(percent), 0, 100, above_minimum=True, unit="(percent)")
            for kind, percent in (
                ("unauthorized", "0.5"),
                ("administrative", "3.0"),
                ("overall", "15.0"),
            )
        },
        partial=True,
    ),
    "RETURN_RATE_WARNING_FRACTION": Number(0.8, 0, 1, above_minimum=True),
    "RETURN_RATE_MIN_DEBITS": Number(20, 1, 1_000_000_000, whole=True, unit="of debits"),
    # /metrics exports a series per merchant for this many merchants at most, the closest to a
    # threshold (the rest are counted, not named): every merchant a series would make
    # Prometheus's cost grow with the customer list. 0 exports the counts only.
    "RETURN_RATE_METRIC_MERCHANTS": Number(20, 0, 1000, whole=True, unit="of merchants"),
    # The gauges /metrics reads from SQS and the database are read at most once per this many
    # seconds in each process, whatever the scrape rate (0: on every scrape).
    "METRICS_SNAPSHOT_SECONDS": Seconds(15.0, 600, above_minimum=False),
    # A bulk triage job acts on at most this many dead letters per second (0 would never act:
    # the pacing divides by it), and looks for a cancel between batches of this size.
    "TRIAGE_BULK_RATE_PER_SECOND": Number(20.0, 0, 10_000, above_minimum=True, unit="per second"),
    "TRIAGE_BULK_BATCH_SIZE": Number(100, 1, 10_000, whole=True, unit="of dead letters"),
    # Beat's heartbeat (triage.operations.heartbeat) older than this fires the in-app alert;
    # two of its one-minute ticks at least, so one slow or lost tick does not page.
    "BEAT_HEARTBEAT_STALE_SECONDS": Number(300, 120, 86_400, unit="of seconds"),
    # Longer than a batch takes at the slowest sensible rate, so a live job is never taken for
    # dead (and if it were, its lock keeps the second copy out).
    "TRIAGE_BULK_STALE_SECONDS": Number(300, 1, 86_400, unit="of seconds"),
}

DEFAULTS: dict[str, Any] = defaults(SPECS)

triage_settings = AppSettings(app="triage", setting="TRIAGE", specs=SPECS)


def __getattr__(name: str) -> Any:
    return getattr(triage_settings, name)
