"""Return rates per merchant over the rolling window, from the counters the transitions keep."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from payments.models import MerchantReturnDay, PaymentState
from payments.services import payment_apply_event
from tests.factories import MerchantReturnDayFactory, PaymentFactory, processor_event
from triage.operations.return_rates import merchant_return_rates, return_rate_settings

pytestmark = pytest.mark.django_db


def _settle(merchant: str) -> object:
    payment = PaymentFactory(state=PaymentState.SUBMITTED, merchant_id=merchant)
    payment_apply_event(event=processor_event(payment, "settled"))
    return payment


def _day(merchant: str, days_ago: int, **counts) -> None:
    MerchantReturnDayFactory(merchant_id=merchant, days_ago=days_ago, **counts)


@pytest.fixture
def history():
    """m-a through the services: 40 settled, 1 R10 and 3 R01 returned after settlement, 2 R02
    returned before settlement; plus a day inside the window's first day and one just outside.
    m-b and m-c as counters only."""
    settled = [_settle("m-a") for _ in range(40)]
    payment_apply_event(event=processor_event(settled[0], "returned", reason_code="R10"))
    for payment in settled[1:4]:
        payment_apply_event(event=processor_event(payment, "returned", reason_code="R01"))
    for _ in range(2):
        early = PaymentFactory(state=PaymentState.SUBMITTED, merchant_id="m-a")
        payment_apply_event(event=processor_event(early, "returned", reason_code="R02"))
    _day("m-a", 59, debits=8)  # the first day of a 60-day window: counted
    _day("m-a", 60, debits=100, returns=50, unauthorized_returns=50)  # one day too old
    _day("m-b", 3, debits=1000, returns=10, unauthorized_returns=4)
    _day("m-c", 10, debits=10)


def test_the_rates_match_hand_computed_figures_and_rank_by_closeness(history):
    rates = merchant_return_rates()

    assert [m.merchant_id for m in rates] == ["m-a", "m-b", "m-c"]
    a, b, c = rates
    # m-a: 40 settled + 2 returned before settlement + 8 on the window's first day = 50 debits.
    assert (a.debits, a.returns, a.unauthorized_returns, a.administrative_returns) == (50, 6, 1, 2)
    by_kind = {r.kind: r for r in a.rates}
    assert by_kind["unauthorized"].percent == pytest.approx(2.0)  # 1 / 50
    assert by_kind["administrative"].percent == pytest.approx(4.0)  # 2 / 50
    assert by_kind["overall"].percent == pytest.approx(12.0)  # 6 / 50
    assert by_kind["unauthorized"].closeness == pytest.approx(4.0)  # 2.0 % / 0.5 %
    assert by_kind["administrative"].closeness == pytest.approx(4.0 / 3)
    assert by_kind["overall"].closeness == pytest.approx(0.8)
    assert a.closeness == pytest.approx(4.0) and a.worst.kind == "unauthorized"
    assert b.closeness == pytest.approx(0.8)  # 4 / 1000 = 0.4 %, 80 % of 0.5 %
    assert {r.kind: r.percent for r in b.rates}["overall"] == pytest.approx(1.0)
    assert c.closeness == 0 and c.returns == 0


def test_a_limit_keeps_the_closest_merchants_and_settings_change_the_window(
    history, module_settings
):
    assert [m.merchant_id for m in merchant_return_rates(limit=1)] == ["m-a"]

    module_settings.RETURN_RATE_WINDOW_DAYS = 5
    module_settings.RETURN_RATE_THRESHOLDS = {"unauthorized": 1.0}
    rates = {m.merchant_id: m for m in merchant_return_rates()}

    assert set(rates) == {"m-a", "m-b"}  # m-c's day is 10 days old
    assert rates["m-a"].debits == 42
    assert rates["m-b"].closeness == pytest.approx(0.4)  # 0.4 % of a 1.0 % threshold


def test_the_rates_are_one_query_however_long_the_history(django_assert_num_queries):
    MerchantReturnDay.objects.bulk_create(
        MerchantReturnDay(
            merchant_id=f"m-{m}",
            day=timezone.now().date() - timedelta(days=d),
            debits=50,
            returns=m % 7,
            unauthorized_returns=m % 2,
        )
        for m in range(40)
        for d in range(60)
    )

    with django_assert_num_queries(1):
        rates = merchant_return_rates()

    assert len(rates) == 40
    assert rates[0].closeness >= rates[-1].closeness


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RETURN_RATE_WINDOW_DAYS", 0, "RETURN_RATE_WINDOW_DAYS"),
        ("RETURN_RATE_THRESHOLDS", {"nsf": 1}, "unknown rate"),
        ("RETURN_RATE_THRESHOLDS", {"overall": 0}, "percentage above 0"),
        ("RETURN_RATE_WARNING_FRACTION", 1.5, "RETURN_RATE_WARNING_FRACTION"),
        ("RETURN_RATE_MIN_DEBITS", 0, "RETURN_RATE_MIN_DEBITS"),
    ],
)
def test_a_bad_setting_is_refused_with_its_name(module_settings, name, value, message):
    setattr(module_settings, name, value)
    with pytest.raises(ImproperlyConfigured, match=message):
        return_rate_settings()


def test_the_defaults_are_the_nacha_thresholds():
    config = return_rate_settings()
    assert config.window_days == 60
    assert {k: v for k, v in config.thresholds.items()} == {
        "unauthorized": Decimal("0.5"),
        "administrative": Decimal("3.0"),
        "overall": Decimal("15.0"),
    }
    assert config.warning_fraction == 0.8


def test_the_upgrade_backfills_debits_settled_before_the_counters_existed():
    import importlib

    from django.apps import apps

    backfill = importlib.import_module(
        "payments.migrations.0003_backfill_merchant_return_days"
    ).backfill
    for _ in range(3):
        PaymentFactory(state=PaymentState.CONFIRMED, merchant_id="m-old")
    PaymentFactory(state=PaymentState.SUBMITTED, merchant_id="m-old")

    backfill(apps, None)

    [day] = MerchantReturnDay.objects.filter(merchant_id="m-old")
    assert (day.day, day.debits, day.returns) == (timezone.now().date(), 3, 0)
    backfill(apps, None)  # counters exist now: nothing is counted twice
    assert MerchantReturnDay.objects.get(merchant_id="m-old").debits == 3
