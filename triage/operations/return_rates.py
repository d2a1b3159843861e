"""Return rates per merchant over a rolling window, against the NACHA thresholds: the rates,
their alerts, their Prometheus gauges and the dashboard's panel.

Triage owns return rates because everything done with them is operations: an alert for a human,
a gauge, a dashboard panel, and the alerts need triage's ``Alert`` rows (payments must not import
triage). What payments keeps is the counters: ``MerchantReturnDay``, written by the event write in
the same transaction as the transition (so a return is counted exactly once), read here. A rate
is then one aggregate query over at most window-days rows per merchant.

Rates, each against the merchant's debits in the window (settled, or returned before they
settled: every debit the ACH network answered):

- ``unauthorized``: returns with codes R05, R07, R10, R11, R29, R51 (threshold 0.5 %);
- ``administrative``: R02, R03, R04 (3.0 %);
- ``overall``: every return, whatever its code, unknown codes included (15.0 %).

Alerts use the alert machinery of ``triage.operations.alerting``: one firing row per merchant
and rate (key ``return_rate.<rate>:<merchant>``), medium (warning) at
``RETURN_RATE_WARNING_FRACTION`` of a threshold, high at the threshold, reminders by severity,
resolved when the rate falls back under the warning level or the merchant leaves the window.

Settings (each with its default in ``triage.conf``, so a host project sets only what it
changes): ``RETURN_RATE_WINDOW_DAYS`` (60), ``RETURN_RATE_THRESHOLDS`` (percent per rate),
``RETURN_RATE_WARNING_FRACTION`` (0.8: a warning at 80 % of a threshold),
``RETURN_RATE_MIN_DEBITS`` (20: below that many debits in the window a rate is shown but never
alerted on; one return out of two debits says nothing about a merchant),
``RETURN_RATE_METRIC_MERCHANTS`` (20: the merchants ``/metrics`` names; see
``ReturnRateCollector``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from enum import StrEnum

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Count, F, FloatField, Q, QuerySet, Sum, Value
from django.db.models.functions import Cast, Greatest, NullIf
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from payments.models import MerchantReturnDay
from triage import conf as triage_conf
from triage.models import Alert, AlertSeverity, AlertStatus
from triage.operations import charts
from triage.operations.alerting import AlertDecision, alert_fire, alert_resolve


class RateKind(StrEnum):
    UNAUTHORIZED = "unauthorized"
    ADMINISTRATIVE = "administrative"
    OVERALL = "overall"


# The counter each rate divides by the merchant's debits.
RATE_COUNTER = {
    RateKind.UNAUTHORIZED: "unauthorized_returns",
    RateKind.ADMINISTRATIVE: "administrative_returns",
    RateKind.OVERALL: "returns",
}
RETURN_RATE_PREFIX = "return_rate."
DASHBOARD_MERCHANTS = 25


@dataclass(frozen=True)
class ReturnRateSettings:
    window_days: int
    thresholds: dict[RateKind, Decimal]  # percent
    warning_fraction: float
    min_debits: int


def return_rate_settings() -> ReturnRateSettings:
    """The settings, checked: a bad value stops with its name, not a wrong alert later."""
    window = triage_conf.RETURN_RATE_WINDOW_DAYS
    raw = triage_conf.RETURN_RATE_THRESHOLDS
    warning = triage_conf.RETURN_RATE_WARNING_FRACTION
    min_debits = triage_conf.RETURN_RATE_MIN_DEBITS
    if not isinstance(window, int) or window < 1:
        raise ImproperlyConfigured(
            f"RETURN_RATE_WINDOW_DAYS must be a whole number >= 1: {window!r}"
        )
    unknown = set(raw) - set(RateKind)
    if unknown:
        raise ImproperlyConfigured(
            f"RETURN_RATE_THRESHOLDS has unknown rate(s) {sorted(unknown)}; use "
            f"{', '.join(RateKind)}"
        )
    # A host setting only some thresholds keeps the defaults of the others.
    given = {**triage_conf.DEFAULTS["RETURN_RATE_THRESHOLDS"], **raw}
    thresholds = {}
    for kind in RateKind:
        value = Decimal(str(given[kind]))
        if not 0 < value <= 100:
            raise ImproperlyConfigured(
                f"RETURN_RATE_THRESHOLDS[{kind!r}] must be a percentage above 0: {value}"
            )
        thresholds[kind] = value
    if not 0 < warning <= 1:
        raise ImproperlyConfigured(f"RETURN_RATE_WARNING_FRACTION must be in (0, 1]: {warning!r}")
    if not isinstance(min_debits, int) or min_debits < 1:
        raise ImproperlyConfigured(
            f"RETURN_RATE_MIN_DEBITS must be a whole number >= 1: {min_debits!r}"
        )
    return ReturnRateSettings(window, thresholds, float(warning), min_debits)


@dataclass(frozen=True)
class Rate:
    kind: RateKind
    returns: int
    percent: float
    threshold: float  # percent
    closeness: float  # percent / threshold: 0.8 is the warning, 1.0 the threshold


@dataclass(frozen=True)
class MerchantReturnRates:
    merchant_id: str
    debits: int
    returns: int
    unauthorized_returns: int
    administrative_returns: int
    rates: tuple[Rate, ...]
    closeness: float  # the largest of the three
    alertable: bool  # enough debits in the window to alert on

    @property
    def worst(self) -> Rate:
        return max(self.rates, key=lambda r: r.closeness)


def window_start(*, now: datetime, window_days: int) -> date:
    """The first day in the window: today (UTC) and the ``window_days - 1`` days before it."""
    return now.astimezone(UTC).date() - timedelta(days=window_days - 1)


def merchant_return_rates(
    *, now: datetime | None = None, limit: int | None = None, merchant_ids=None
) -> list[MerchantReturnRates]:
    """Every merchant with debits or returns in the window, closest to a threshold first.

    One query: the window's counters summed per merchant, the closeness computed and ordered by
    the database, so ``limit`` cuts the ranking without reading every merchant.
    """
    config = return_rate_settings()
    query = _window_totals(config, now=now or timezone.now(), merchant_ids=merchant_ids)
    if limit is not None:
        query = query[:limit]
    return [_merchant_rates(row, config) for row in query]


def _window_totals(config: ReturnRateSettings, *, now: datetime, merchant_ids) -> QuerySet:
    """Per merchant, the window's counters (``w_<counter>``) and its closeness, closest first."""
    rows = MerchantReturnDay.objects.filter(
        day__gte=window_start(now=now, window_days=config.window_days)
    )
    if merchant_ids is not None:
        rows = rows.filter(merchant_id__in=list(merchant_ids))
    closeness = [_closeness(kind, config) for kind in RateKind]
    return (
        rows.values("merchant_id")
        .annotate(
            w_debits=Sum("debits"),
            w_returns=Sum("returns"),
            w_unauthorized_returns=Sum("unauthorized_returns"),
            w_administrative_returns=Sum("administrative_returns"),
        )
        .annotate(closeness=Greatest(*closeness))
        .order_by(F("closeness").desc(nulls_last=True), "merchant_id")
    )


def _closeness(kind: RateKind, config: ReturnRateSettings):
    """A merchant's ``kind`` rate over its threshold, from its window totals (``w_<counter>``);
    NULL without debits."""
    debits = NullIf(Cast(F("w_debits"), FloatField()), Value(0.0))
    return (
        Cast(F(f"w_{RATE_COUNTER[kind]}"), FloatField())
        * Value(100.0)
        / debits
        / Value(float(config.thresholds[kind]))
    )


def _merchant_rates(row: dict, config: ReturnRateSettings) -> MerchantReturnRates:
    """One merchant's rates from its row of window totals."""
    counts = {
        "returns": row["w_returns"],
        "unauthorized_returns": row["w_unauthorized_returns"],
        "administrative_returns": row["w_administrative_returns"],
    }
    rates = []
    for kind in RateKind:
        returns = counts[RATE_COUNTER[kind]]
        percent = returns * 100 / row["w_debits"] if row["w_debits"] else 0.0
        threshold = float(config.thresholds[kind])
        rates.append(Rate(kind, returns, percent, threshold, percent / threshold))
    return MerchantReturnRates(
        merchant_id=row["merchant_id"],
        debits=row["w_debits"],
        rates=tuple(rates),
        closeness=max(r.closeness for r in rates),
        alertable=row["w_debits"] >= config.min_debits,
        **counts,
    )


def return_rate_alert_key(kind: str, merchant_id: str) -> str:
    return f"{RETURN_RATE_PREFIX}{kind}:{merchant_id}"


def _severity(closeness: float, warning_fraction: float) -> str | None:
    if closeness >= 1:
        return AlertSeverity.HIGH
    if closeness >= warning_fraction:
        return AlertSeverity.MEDIUM
    return None


def return_rate_alerts_evaluate(*, now: datetime | None = None) -> dict:
    """Fire the return-rate alerts that hold and resolve the ones that cleared.

    Returns ``{"fired": {key: decision}, "resolved": [keys]}``. A rate that fell from the
    threshold to the warning level is resolved as high and fired again as medium: the alert
    row's severity only ever rises while it fires, and a stale "high" would page for a rate
    that improved.
    """
    now = now or timezone.now()
    config = return_rate_settings()
    firing = dict(
        Alert.objects.filter(
            status=AlertStatus.FIRING, key__startswith=RETURN_RATE_PREFIX
        ).values_list("key", "severity")
    )
    fired: dict[str, AlertDecision] = {}
    resolved: list[str] = []
    should_fire: set[str] = set()
    for merchant in merchant_return_rates(now=now):
        if not merchant.alertable:
            continue
        for rate in merchant.rates:
            severity = _severity(rate.closeness, config.warning_fraction)
            if severity is None:
                continue
            key = return_rate_alert_key(rate.kind, merchant.merchant_id)
            should_fire.add(key)
            if firing.get(key) == AlertSeverity.HIGH and severity != AlertSeverity.HIGH:
                alert_resolve(key=key, now=now, reason="rate fell under the threshold")
                resolved.append(key)
            level = "threshold" if severity == AlertSeverity.HIGH else "warning level"
            fired[key] = alert_fire(
                key=key,
                severity=severity,
                summary=(
                    f"merchant {merchant.merchant_id}: {rate.kind} return rate "
                    f"{rate.percent:.2f}% over {config.window_days} days ({rate.returns} of "
                    f"{merchant.debits} debits) is at or above the {level} "
                    f"({rate.threshold:.2f}% threshold)"
                ),
                details={
                    "merchant_id": merchant.merchant_id,
                    "rate": rate.kind,
                    "percent": round(rate.percent, 4),
                    "threshold_percent": rate.threshold,
                    "returns": rate.returns,
                    "debits": merchant.debits,
                    "window_days": config.window_days,
                },
                now=now,
            ).decision
    for key in sorted(set(firing) - should_fire):
        if alert_resolve(key=key, now=now, reason="rate under the warning level") is not None:
            resolved.append(key)
    return {"fired": fired, "resolved": resolved}


class ReturnRateCollector(Collector):
    """Return rates as gauges, bounded: a series per merchant for the
    ``RETURN_RATE_METRIC_MERCHANTS`` merchants closest to a threshold, and for all of them,
    how many are at or over each rate's warning level and threshold (two queries).

    Only merchants with ``RETURN_RATE_MIN_DEBITS`` debits in the window count, the ones the
    in-app alerts watch, so a rule written on these series sees what those alerts see (and a
    merchant with three debits and one return does not take a place in the top N). The rates
    are fractions (``_ratio``), as Prometheus names them.
    """

    def describe(self):
        for name, labels in (
            ("payments_merchant_return_rate_ratio", ["merchant", "rate"]),
            ("payments_merchant_window_debits", ["merchant"]),
            ("payments_return_rate_threshold_ratio", ["rate"]),
            ("payments_merchants_return_rate_over_level", ["rate", "level"]),
            ("payments_return_rate_merchants", None),
        ):
            yield GaugeMetricFamily(name, "", labels=labels)

    def collect(self):
        config = return_rate_settings()
        now = timezone.now()
        yield from _merchant_gauges(config, now=now)
        yield from _aggregate_gauges(config, now=now)
        thresholds = GaugeMetricFamily(
            "payments_return_rate_threshold_ratio",
            "NACHA return-rate threshold, as a fraction of the debits, by rate.",
            labels=["rate"],
        )
        for kind in RateKind:
            thresholds.add_metric([kind], float(config.thresholds[kind]) / 100)
        yield thresholds


def _alertable_totals(config: ReturnRateSettings, *, now: datetime) -> QuerySet:
    return _window_totals(config, now=now, merchant_ids=None).filter(
        w_debits__gte=config.min_debits
    )


def _merchant_gauges(config: ReturnRateSettings, *, now: datetime):
    """The named merchants' rates and debits: the closest to a threshold first, at most
    ``RETURN_RATE_METRIC_MERCHANTS`` of them."""
    rates = GaugeMetricFamily(
        "payments_merchant_return_rate_ratio",
        f"Return rate over the last {config.window_days} days, as a fraction of the merchant's "
        "debits, by rate (unauthorized, administrative, overall); only the "
        "RETURN_RATE_METRIC_MERCHANTS merchants closest to a threshold.",
        labels=["merchant", "rate"],
    )
    debits = GaugeMetricFamily(
        "payments_merchant_window_debits",
        f"Debits in the return-rate window ({config.window_days} days), for the merchants "
        "payments_merchant_return_rate_ratio names.",
        labels=["merchant"],
    )
    limit = triage_conf.RETURN_RATE_METRIC_MERCHANTS
    rows = _alertable_totals(config, now=now)[:limit] if limit else []
    for row in rows:
        merchant = _merchant_rates(row, config)
        debits.add_metric([merchant.merchant_id], merchant.debits)
        for rate in merchant.rates:
            rates.add_metric([merchant.merchant_id, rate.kind], rate.percent / 100)
    yield rates
    yield debits


def _aggregate_gauges(config: ReturnRateSettings, *, now: datetime):
    """Every alertable merchant, named or not, counted by rate and level: one query."""
    levels = {"warning": config.warning_fraction, "threshold": 1.0}
    rows = _alertable_totals(config, now=now).order_by()
    rows = rows.annotate(**{f"c_{kind}": _closeness(kind, config) for kind in RateKind})
    counts = rows.aggregate(
        merchants=Count("merchant_id"),
        **{
            f"{kind}_{level}": Count("merchant_id", filter=Q(**{f"c_{kind}__gte": fraction}))
            for kind in RateKind
            for level, fraction in levels.items()
        },
    )
    over = GaugeMetricFamily(
        "payments_merchants_return_rate_over_level",
        "Merchants whose rate is at or over a level of its threshold (warning: "
        "RETURN_RATE_WARNING_FRACTION of it; threshold), by rate, named in "
        "payments_merchant_return_rate_ratio or not.",
        labels=["rate", "level"],
    )
    for kind in RateKind:
        for level in levels:
            over.add_metric([kind, level], counts[f"{kind}_{level}"])
    yield over
    yield GaugeMetricFamily(
        "payments_return_rate_merchants",
        f"Merchants with at least RETURN_RATE_MIN_DEBITS debits in the {config.window_days}-day "
        "window (those the return-rate alerts watch).",
        value=counts["merchants"],
    )


def _row(merchant: MerchantReturnRates, warning_fraction: float) -> dict:
    worst = merchant.worst
    return {
        "merchant": merchant,
        "rates": {rate.kind: rate for rate in merchant.rates},
        "worst": worst,
        "severity": _severity(merchant.closeness, warning_fraction) if merchant.alertable else None,
        "bar": charts.threshold_bar(
            merchant.closeness,
            warning=warning_fraction,
            title=(
                f"{merchant.merchant_id}: {worst.kind} return rate {worst.percent:.2f}% is "
                f"{merchant.closeness * 100:.0f}% of its {worst.threshold:.2f}% threshold"
            ),
        ),
    }


def return_rates_panel(*, now: datetime, limit: int = DASHBOARD_MERCHANTS) -> dict:
    """The dashboard's context for the return-rate panel: one query, whatever the history."""
    config = return_rate_settings()
    merchants = merchant_return_rates(now=now, limit=limit)
    return {
        "return_rates": [_row(m, config.warning_fraction) for m in merchants],
        "return_rate_settings": config,
        "return_rate_kinds": list(RateKind),
    }
