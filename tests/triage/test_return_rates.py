"""Return-rate alerts, gauges and the dashboard panel."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from payments.models import MerchantReturnDay
from tests.factories import MerchantReturnDayFactory
from tests.triage.deadletters import viewer
from triage.models import Alert, AlertStatus
from triage.operations import charts
from triage.operations.alert_conditions import alerts_evaluate
from triage.operations.return_rates import (
    ReturnRateCollector,
    return_rate_alerts_evaluate,
    return_rates_panel,
)

pytestmark = pytest.mark.django_db
DASHBOARD = "admin:triage_triagedashboard_changelist"


def _day(merchant: str, days_ago: int = 1, **counts) -> MerchantReturnDay:
    return MerchantReturnDayFactory(merchant_id=merchant, days_ago=days_ago, **counts)


@pytest.fixture
def merchants(module_settings):
    module_settings.RETURN_RATE_MIN_DEBITS = 20
    return {
        # 0.4 % unauthorized: 80 % of 0.5 %, the warning level.
        "warn": _day("m-warn", debits=1000, returns=4, unauthorized_returns=4),
        # 1 % unauthorized and 16 % overall: both over their thresholds.
        "high": _day("m-high", debits=100, returns=16, unauthorized_returns=1),
        "ok": _day("m-ok", debits=1000, returns=1, unauthorized_returns=1),
        "few": _day("m-few", debits=5, returns=5, unauthorized_returns=5),  # under 20 debits
    }


def _firing() -> dict[str, str]:
    return dict(Alert.objects.filter(status=AlertStatus.FIRING).values_list("key", "severity"))


def test_rates_at_80_percent_warn_and_at_the_threshold_page(merchants):
    result = return_rate_alerts_evaluate()

    assert _firing() == {
        "return_rate.unauthorized:m-warn": "medium",
        "return_rate.unauthorized:m-high": "high",
        "return_rate.overall:m-high": "high",
    }
    assert result["fired"] == dict.fromkeys(_firing(), "fired")
    alert = Alert.objects.get(key="return_rate.overall:m-high")
    assert "16.00%" in alert.summary and "15.00% threshold" in alert.summary
    assert alert.details["returns"] == 16 and alert.details["debits"] == 100


def test_a_second_evaluation_keeps_one_firing_row_per_merchant_and_rate(merchants):
    return_rate_alerts_evaluate()
    return_rate_alerts_evaluate()

    assert Alert.objects.filter(key="return_rate.unauthorized:m-warn").count() == 1
    alert = Alert.objects.get(key="return_rate.unauthorized:m-warn")
    assert alert.details["occurrences"] == 2 and alert.notify_count == 1


def test_a_rate_back_under_the_warning_level_resolves_and_a_fall_to_it_downgrades(merchants):
    return_rate_alerts_evaluate()
    MerchantReturnDay.objects.filter(pk=merchants["warn"].pk).update(unauthorized_returns=1)
    # m-high: 1 unauthorized of 250 debits = 0.4 %, the warning level; overall 16/250 = 6.4 %.
    MerchantReturnDay.objects.filter(pk=merchants["high"].pk).update(debits=250)

    result = return_rate_alerts_evaluate()

    assert _firing() == {"return_rate.unauthorized:m-high": "medium"}
    assert set(result["resolved"]) == {
        "return_rate.unauthorized:m-warn",
        "return_rate.overall:m-high",
        "return_rate.unauthorized:m-high",  # as high, fired again as medium
    }
    resolved = Alert.objects.get(key="return_rate.unauthorized:m-warn")
    assert resolved.status == AlertStatus.RESOLVED and resolved.resolved_at is not None


def test_a_merchant_leaving_the_window_resolves_its_alerts(merchants):
    return_rate_alerts_evaluate()
    MerchantReturnDay.objects.filter(merchant_id="m-high").update(
        day=timezone.now().date() - timedelta(days=61)
    )

    return_rate_alerts_evaluate()

    assert set(_firing()) == {"return_rate.unauthorized:m-warn"}


def test_the_periodic_evaluation_includes_return_rates_and_never_quiet_resolves_them(
    merchants, sqs_queues, module_settings
):
    module_settings.ALERT_EVENT_QUIET_RESOLVE = timedelta(seconds=0)
    alerts_evaluate()
    result = alerts_evaluate(now=timezone.now() + timedelta(hours=1))

    assert "return_rate.unauthorized:m-warn" in result.fired
    assert "return_rate.unauthorized:m-warn" not in result.resolved
    assert "return_rate.overall:m-high" in _firing()


def _families() -> dict:
    return {f.name: f for f in ReturnRateCollector().collect()}


def test_the_gauges_export_each_merchants_rates_as_ratios_and_the_thresholds(merchants):
    families = _families()

    rates = {
        (s.labels["merchant"], s.labels["rate"]): s.value
        for s in families["payments_merchant_return_rate_ratio"].samples
    }
    assert rates[("m-high", "unauthorized")] == pytest.approx(0.01)
    assert rates[("m-high", "overall")] == pytest.approx(0.16)
    assert rates[("m-warn", "unauthorized")] == pytest.approx(0.004)
    # Under RETURN_RATE_MIN_DEBITS debits: never alerted on, so not named either.
    assert "m-few" not in {merchant for merchant, _ in rates}
    debits = {
        s.labels["merchant"]: s.value for s in families["payments_merchant_window_debits"].samples
    }
    assert debits == {"m-high": 100, "m-warn": 1000, "m-ok": 1000}
    thresholds = {
        s.labels["rate"]: s.value for s in families["payments_return_rate_threshold_ratio"].samples
    }
    assert thresholds == pytest.approx(
        {"unauthorized": 0.005, "administrative": 0.03, "overall": 0.15}
    )


def test_only_the_merchants_closest_to_a_threshold_are_named_and_all_are_counted(
    merchants, module_settings, django_assert_num_queries
):
    module_settings.RETURN_RATE_METRIC_MERCHANTS = 1
    for m in range(30):  # 30 more merchants, each at 0.6 % unauthorized: over the threshold
        _day(f"m-{m:02d}", debits=1000, returns=6, unauthorized_returns=6)

    with django_assert_num_queries(2):
        families = _families()

    named = {s.labels["merchant"] for s in families["payments_merchant_return_rate_ratio"].samples}
    assert named == {"m-high"}  # closest: 1 % unauthorized is twice its threshold
    over = {
        (s.labels["rate"], s.labels["level"]): s.value
        for s in families["payments_merchants_return_rate_over_level"].samples
    }
    assert over[("unauthorized", "threshold")] == 31  # m-high and the 30
    assert over[("unauthorized", "warning")] == 32  # and m-warn at 80 %
    assert over[("overall", "threshold")] == 1
    assert over[("administrative", "warning")] == 0
    [total] = families["payments_return_rate_merchants"].samples
    assert total.value == 33  # every merchant with 20 debits or more; m-few has 5


def test_the_gauges_are_served_on_metrics(merchants, client):
    text = client.get("/metrics").content.decode()
    assert 'payments_merchant_return_rate_ratio{merchant="m-high",rate="overall"} 0.16' in text
    assert 'payments_return_rate_threshold_ratio{rate="unauthorized"} 0.005' in text


def test_the_panel_ranks_merchants_by_closeness_in_one_query(merchants, django_assert_num_queries):
    with django_assert_num_queries(1):
        panel = return_rates_panel(now=timezone.now())

    rows = panel["return_rates"]
    assert [r["merchant"].merchant_id for r in rows] == ["m-few", "m-high", "m-warn", "m-ok"]
    assert rows[0]["severity"] is None  # too few debits to alert on
    assert rows[1]["severity"] == "high" and rows[2]["severity"] == "medium"
    assert 'role="img"' in rows[1]["bar"] and "#ba2121" in rows[1]["bar"]
    assert "#ff9900" in rows[2]["bar"]


def test_the_dashboard_shows_the_panel_and_its_query_count_does_not_grow_with_history(
    client, module_settings
):
    # SQS is unreachable here (a closed port): the page still renders, without queue depths.
    module_settings.RETURN_RATE_MIN_DEBITS = 1
    _day("m-1", debits=10, returns=1)
    client.force_login(viewer())
    with CaptureQueriesContext(connection) as small:
        response = client.get(reverse(DASHBOARD))
    assert response.status_code == 200
    MerchantReturnDay.objects.bulk_create(
        MerchantReturnDay(
            merchant_id=f"m-{m}",
            day=timezone.now().date() - timedelta(days=d),
            debits=100,
            returns=m % 5,
            unauthorized_returns=m % 3,
        )
        for m in range(2, 60)
        for d in range(60)
    )

    with CaptureQueriesContext(connection) as large:
        response = client.get(reverse(DASHBOARD))

    assert len(large.captured_queries) == len(small.captured_queries)
    page = response.content.decode()
    assert 'id="return-rates"' in page
    assert "Return rates, last 60 days" in page
    assert page.count('class="return-rate') == 25  # the 25 closest of 59 merchants


def test_threshold_bar_marks_the_warning_and_the_threshold_and_escapes_the_title():
    svg = charts.threshold_bar(0.5, warning=0.8, title="<m> & co")
    assert "&lt;m&gt; &amp; co" in svg
    assert svg.count("<line") == 2
    assert 'fill="#417690"' in svg
    assert 'fill="#ba2121"' in charts.threshold_bar(3.0, warning=0.8, title="t")
