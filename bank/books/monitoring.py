"""How far the books are behind the bank, as gauges and alerts.

- ``payments_books_oldest_unmatched_entry_age_seconds``: since its settlement (the end of its
  effective entry date, Eastern), the oldest entry we sent whose batch the bank has not settled
  in full, and that no person has explained; 0 when there is none.
- ``payments_books_oldest_unmatched_line_age_seconds``: since it was imported, the oldest bank
  line that is not matched and has an open variance; 0 when there is none.
- ``payments_books_open_variances``, ``payments_books_oldest_open_variance_banking_days`` and
  the setting it is held to, ``payments_books_variance_alert_banking_days``.
- ``payments_books_days_not_closed``: banking days with activity whose close is overdue (the
  ``CLOSE_BY_HOUR_EASTERN`` hour of the next banking day has passed) and that are not green: the
  bank has not reported them, or they have open variances.

The gauges are read from the database and served through the operations snapshot (triage's
``SnapshotCollector``: at most one read per interval per process). ``books_alerts_check`` raises
the same two conditions through ``alert_raise`` (a high alert per overdue day, one per variance
older than ``VARIANCE_ALERT_BANKING_DAYS``) and clears them once they hold no more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta

from django.db.models import Exists, Min, OuterRef, Q
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from bank import conf
from bank.books.models import (
    BooksVariance,
    MatchKind,
    MatchStatus,
    StatementLine,
    StatementMatch,
    VarianceStatus,
)
from bank.books.selectors import day_reported
from bank.nacha.models import NachaEntry, NachaFile
from payments.alerts import AlertSeverity, alert_clear, alert_raise
from payments.banking_days import (
    ACH_TIME_ZONE,
    ach_date,
    add_banking_days,
    banking_days_between,
    end_of_banking_day,
    is_banking_day,
)

LOOKBACK_DAYS = 14  # calendar days an unclosed day is looked for (older ones: its variances)


@dataclass
class BooksSnapshot:
    oldest_unmatched_entry_age: float = 0.0
    oldest_unmatched_line_age: float = 0.0
    open_variances: int = 0
    oldest_open_variance_banking_days: int = 0
    days_not_closed: list[date] = field(default_factory=list)
    aged_variances: list[BooksVariance] = field(default_factory=list)


def close_deadline(day: date) -> datetime:
    """When ``day`` should be closed green: the set hour (Eastern) of the next banking day."""
    next_day = ach_date(add_banking_days(end_of_banking_day(day), 1))
    hour = int(conf.BOOKS_CLOSE_BY_HOUR_EASTERN)
    return datetime.combine(next_day, time(hour), tzinfo=ACH_TIME_ZONE)


def _unmatched_entries(today: date):
    # The entry's batch: its file's match or variance of the same batch number, or one with no
    # number at all (an entry written before numbers were recorded, matched per SEC code). A
    # file's entries are all numbered or none, so the second never answers for a numbered one.
    same_batch = Q(batch_number=OuterRef("batch_number")) | Q(batch_number__isnull=True)
    settled_in_full = StatementMatch.objects.filter(
        same_batch,
        kind=MatchKind.BATCH,
        nacha_file=OuterRef("file"),
        sec_code=OuterRef("sec_code"),
        line__match_status=MatchStatus.MATCHED,
    )
    explained = BooksVariance.objects.filter(
        same_batch,
        nacha_file=OuterRef("file"),
        sec_code=OuterRef("sec_code"),
        status__in=[VarianceStatus.EXPLAINED, VarianceStatus.CLEARED],
    )
    return NachaEntry.objects.filter(
        file__delivered_at__isnull=False, file__effective_entry_date__lt=today, refused_reason=""
    ).exclude(Exists(settled_in_full) | Exists(explained))


def _active_days(since: date, today: date) -> set[date]:
    days = set(
        NachaFile.objects.filter(
            delivered_at__isnull=False, effective_entry_date__range=(since, today)
        ).values_list("effective_entry_date", flat=True)
    )
    days |= set(
        StatementLine.objects.filter(as_of_date__range=(since, today)).values_list(
            "as_of_date", flat=True
        )
    )
    return days


def books_snapshot(*, now: datetime | None = None) -> BooksSnapshot:
    now = now or timezone.now()
    today = ach_date(now)
    snapshot = BooksSnapshot()
    oldest = (
        _unmatched_entries(today)
        .order_by("file__effective_entry_date")
        .values_list("file__effective_entry_date", flat=True)
        .first()
    )
    if oldest is not None:
        snapshot.oldest_unmatched_entry_age = max(
            (now - end_of_banking_day(oldest)).total_seconds(), 0.0
        )
    oldest_line = (
        StatementLine.objects.exclude(match_status=MatchStatus.MATCHED)
        .filter(variances__status=VarianceStatus.OPEN)
        .aggregate(at=Min("created_at"))["at"]
    )
    if oldest_line is not None:
        snapshot.oldest_unmatched_line_age = max((now - oldest_line).total_seconds(), 0.0)
    open_ = BooksVariance.objects.filter(status=VarianceStatus.OPEN)
    snapshot.open_variances = open_.count()
    limit = int(conf.BOOKS_VARIANCE_ALERT_BANKING_DAYS)
    for variance in open_.order_by("day"):
        age = banking_days_between(variance.day, today)
        snapshot.oldest_open_variance_banking_days = max(
            snapshot.oldest_open_variance_banking_days, age
        )
        if age > limit:
            snapshot.aged_variances.append(variance)
    open_days = set(open_.values_list("day", flat=True))
    for day in sorted(_active_days(today - timedelta(days=LOOKBACK_DAYS), today)):
        if not is_banking_day(day) or now < close_deadline(day):
            continue
        if not day_reported(day) or day in open_days:
            snapshot.days_not_closed.append(day)
    return snapshot


def day_not_closed_key(day: date) -> str:
    return f"books.day_not_closed:{day.isoformat()}"


def variance_aged_key(variance_id: int) -> str:
    return f"books.variance_aged:{variance_id}"


def books_alerts_check(*, now: datetime | None = None) -> BooksSnapshot:
    """Raise what is overdue now; clear the alerts of days and variances that are no more.
    Raised each evaluation while the condition holds (triage groups them by key)."""
    now = now or timezone.now()
    snapshot = books_snapshot(now=now)
    for day in snapshot.days_not_closed:
        reported = day_reported(day)
        alert_raise(
            severity=AlertSeverity.HIGH,
            key=day_not_closed_key(day),
            summary=(
                f"banking day {day} is not closed by {close_deadline(day):%Y-%m-%d %H:%M} "
                f"Eastern: "
                + (
                    "it has unexplained variances (books_close --date to list them)"
                    if reported
                    else "the bank's statement of the day has not been imported"
                )
            ),
            details={"day": day.isoformat(), "reported_by_bank": reported},
        )
    for variance in snapshot.aged_variances:
        alert_raise(
            severity=AlertSeverity.HIGH,
            key=variance_aged_key(variance.pk),
            summary=(
                f"books variance {variance.pk} of {variance.day} ({variance.kind}) is still "
                f"unexplained after {banking_days_between(variance.day, ach_date(now))} banking "
                f"days: {variance.summary}"
            ),
            details={"variance_id": variance.pk, "day": variance.day.isoformat()},
        )
    today = ach_date(now)
    overdue = set(snapshot.days_not_closed)
    for day in _active_days(today - timedelta(days=LOOKBACK_DAYS), today) - overdue:
        if is_banking_day(day) and now >= close_deadline(day):
            alert_clear(key=day_not_closed_key(day), reason="closed green")
    aged = {v.pk for v in snapshot.aged_variances}
    for variance_id in BooksVariance.objects.exclude(status=VarianceStatus.OPEN).values_list(
        "pk", flat=True
    ):
        if variance_id not in aged:
            alert_clear(key=variance_aged_key(variance_id), reason="explained or cleared")
    return snapshot


class BooksCollector(Collector):
    """The books' gauges (served through a snapshot by the operations registry)."""

    def describe(self):
        for name in (
            "payments_books_oldest_unmatched_entry_age_seconds",
            "payments_books_oldest_unmatched_line_age_seconds",
            "payments_books_open_variances",
            "payments_books_oldest_open_variance_banking_days",
            "payments_books_days_not_closed",
            "payments_books_variance_alert_banking_days",
        ):
            yield GaugeMetricFamily(name, "")

    def collect(self):
        snapshot = books_snapshot()
        yield GaugeMetricFamily(
            "payments_books_oldest_unmatched_entry_age_seconds",
            "Seconds since its settlement of the oldest entry sent whose batch the bank has "
            "not settled in full and no person has explained; 0 when there is none.",
            value=snapshot.oldest_unmatched_entry_age,
        )
        yield GaugeMetricFamily(
            "payments_books_oldest_unmatched_line_age_seconds",
            "Seconds since import of the oldest bank line not matched, with an open variance; "
            "0 when there is none.",
            value=snapshot.oldest_unmatched_line_age,
        )
        yield GaugeMetricFamily(
            "payments_books_open_variances",
            "Variances between the bank and the books no person has explained yet.",
            value=snapshot.open_variances,
        )
        yield GaugeMetricFamily(
            "payments_books_oldest_open_variance_banking_days",
            "Banking days since the day of the oldest open variance; 0 when there is none.",
            value=snapshot.oldest_open_variance_banking_days,
        )
        yield GaugeMetricFamily(
            "payments_books_days_not_closed",
            "Banking days past their close-by hour (Eastern, the next banking day) that the "
            "bank has not reported or that have open variances.",
            value=len(snapshot.days_not_closed),
        )
        yield GaugeMetricFamily(
            "payments_books_variance_alert_banking_days",
            "BANK['BOOKS_VARIANCE_ALERT_BANKING_DAYS']: an open variance older than this "
            "many banking days alerts.",
            value=int(conf.BOOKS_VARIANCE_ALERT_BANKING_DAYS),
        )
