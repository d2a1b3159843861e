"""Return-rate monitoring: alerts, Prometheus gauges and the dashboard panel.

The rates come from ``payments.return_rates`` (one aggregate query over the daily counters).
Alerts use the alert machinery of ``triage.alerting``: one firing row per merchant and rate
(key ``return_rate.<rate>:<merchant>``), medium (warning) at ``RETURN_RATE_WARNING_FRACTION``
of a threshold, high at the threshold, reminders by severity, resolved when the rate falls back
under the warning level or the merchant leaves the window.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from payments.return_rates import (
    MerchantReturnRates,
    RateKind,
    merchant_return_rates,
    return_rate_settings,
)
from triage import charts
from triage.alerting import AlertDecision, alert_fire, alert_resolve
from triage.models import Alert, AlertSeverity, AlertStatus

RETURN_RATE_PREFIX = "return_rate."
DASHBOARD_MERCHANTS = 25


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
    """Per-merchant return rates and the thresholds, computed at scrape time (one query)."""

    def describe(self):
        yield GaugeMetricFamily(
            "payments_merchant_return_rate_percent", "", labels=["merchant", "rate"]
        )
        yield GaugeMetricFamily("payments_merchant_window_debits", "", labels=["merchant"])
        yield GaugeMetricFamily("payments_return_rate_threshold_percent", "", labels=["rate"])

    def collect(self):
        config = return_rate_settings()
        rates = GaugeMetricFamily(
            "payments_merchant_return_rate_percent",
            f"Return rate per merchant over the last {config.window_days} days, in percent of "
            "its debits, by rate (unauthorized, administrative, overall).",
            labels=["merchant", "rate"],
        )
        debits = GaugeMetricFamily(
            "payments_merchant_window_debits",
            f"Debits per merchant in the return-rate window ({config.window_days} days).",
            labels=["merchant"],
        )
        for merchant in merchant_return_rates():
            debits.add_metric([merchant.merchant_id], merchant.debits)
            for rate in merchant.rates:
                rates.add_metric([merchant.merchant_id, rate.kind], rate.percent)
        yield rates
        yield debits
        thresholds = GaugeMetricFamily(
            "payments_return_rate_threshold_percent",
            "NACHA return-rate threshold, in percent, by rate.",
            labels=["rate"],
        )
        for kind in RateKind:
            thresholds.add_metric([kind], float(config.thresholds[kind]))
        yield thresholds


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
