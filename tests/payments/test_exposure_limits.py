"""Exposure limits per merchant: single-entry, daily and N-banking-day caps, debits and credits
apart, per currency; counted by effective banking day over what is not failed or canceled;
enforced under the merchant's exposure lock (twenty racing creates never pass a limit together);
refused with 409 ``exposure_limit_exceeded`` naming the limit; changed in the admin only with
the permission, a note and an audit row; shown to the merchant with what is left today."""

import json
import math
from datetime import datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import transaction

from payments.exceptions import ExposureLimitExceeded, ReinitiationRefused
from payments.exposure_limits import Limits, parse_exposure_limits
from payments.models import (
    ExposureLimit,
    ExposureLimitChange,
    LedgerEntry,
    LedgerEntryStatus,
    OutboxMessage,
    Payment,
    PaymentDirection,
    PaymentPurpose,
    PaymentState,
    ProcessorAttempt,
)
from payments.services import (
    SubmitOutcome,
    payment_apply_event,
    payment_cancel,
    payment_create,
    payment_reinitiate,
    payment_submit,
)
from payments.services.limits import (
    counted_since,
    effective_banking_day,
    exposure_check,
    exposure_limit_set,
    merchant_exposure,
)
from payments.services.payouts import payout_create
from payments.services.refunds import refund_create
from payments.services.review import ReviewRefused, payment_review_approve, payment_review_reject
from tests.factories import PaymentFactory, UserFactory, grant, processor_event
from tests.waiting import race

pytestmark = pytest.mark.django_db

NEW_YORK = ZoneInfo("America/New_York")
TOKEN = "tok_limits_acct_0001"
USD = "USD"


def _eastern(*args) -> datetime:
    return datetime(*args, tzinfo=NEW_YORK)


def _limits_user(**fields):
    user = UserFactory(is_staff=True, **fields)
    user.user_permissions.add(Permission.objects.get(codename="change_exposure_limits"))
    # The permission cache is filled on first use: a fresh object reads the grant.
    return type(user).objects.get(pk=user.pk)


def _set(merchant: str, direction: str = "debit", currency: str = USD, **caps) -> ExposureLimit:
    return exposure_limit_set(
        merchant_id=merchant,
        direction=direction,
        currency=currency,
        limits=Limits(**caps),
        user=_limits_user(),
        note="annual review",
    )


def _debit(merchant: str, amount: str) -> Payment:
    return payment_create(merchant_id=merchant, amount=Decimal(amount), source_token=TOKEN)


def _entry(merchant, amount, at, *, state=PaymentState.PENDING, currency=USD, **fields):
    payment = PaymentFactory(
        merchant_id=merchant, amount=Decimal(amount), currency=currency, state=state, **fields
    )
    Payment.objects.filter(pk=payment.pk).update(created_at=at)
    return payment


def _check(merchant, amount, now, *, direction="debit", currency=USD) -> None:
    with transaction.atomic():
        exposure_check(
            merchant_id=merchant,
            direction=direction,
            currency=currency,
            amount=Decimal(amount),
            now=now,
        )


# --- the setting and its parsing ----------------------------------------------------------------


def test_the_setting_parses_into_limits_by_direction_and_currency():
    parsed = parse_exposure_limits(
        {
            "USD": {
                "debit": {
                    "single": "500.00",
                    "daily": 2000,
                    "window": "5000",
                    "window_banking_days": 5,
                },
                "credit": {"daily": "1000.50"},
            },
            "EUR": {"debit": {}},
        }
    )

    assert parsed == {
        ("debit", USD): Limits(
            single=Decimal("500.00"),
            daily=Decimal("2000.00"),
            window=Decimal("5000.00"),
            window_banking_days=5,
        ),
        ("credit", USD): Limits(daily=Decimal("1000.50")),
    }


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"USD": {"debit": {"daily": "-1.00"}}}, "greater than zero"),
        ({"USD": {"debit": {"daily": "0"}}}, "greater than zero"),
        ({"USD": {"debit": {"daily": "NaN"}}}, "finite"),
        ({"USD": {"debit": {"daily": "sNaN"}}}, "finite"),
        ({"USD": {"debit": {"daily": "Infinity"}}}, "finite"),
        ({"USD": {"debit": {"daily": float("nan")}}}, "float is not an amount"),
        ({"USD": {"debit": {"daily": 100.5}}}, "float is not an amount"),
        ({"USD": {"debit": {"daily": True}}}, "bool is not an amount"),
        ({"USD": {"debit": {"daily": "1e30"}}}, "at most 999999999999.99"),
        ({"USD": {"debit": {"daily": 10**400}}}, "at most 999999999999.99"),
        ({"USD": {"debit": {"daily": "10.005"}}}, "two decimals"),
        ({"USD": {"debit": {"daily": "ten"}}}, "not a decimal amount"),
        ({"USD": {"debit": {"daily": "1\x00"}}}, "not a decimal amount"),
        ({"USD": {"debit": {"daily": "1\ud800"}}}, "ASCII"),
        ({"USD": {"debit": {"daily": "١٠٠"}}}, "ASCII"),
        ({"USD": {"debit": {"window": "10.00"}}}, "go together"),
        ({"USD": {"debit": {"window": "10", "window_banking_days": 0}}}, "1 to 60"),
        ({"USD": {"debit": {"window": "10", "window_banking_days": 61}}}, "1 to 60"),
        ({"USD": {"debit": {"window": "10", "window_banking_days": 2.5}}}, "whole number"),
        ({"USD": {"debit": {"monthly": "10"}}}, "unknown key(s) ['monthly']"),
        ({"USD": {"sideways": {}}}, "unknown direction(s) ['sideways']"),
        ({"usd": {"debit": {}}}, "not a currency code"),
        ({"US\x00": {"debit": {}}}, "not a currency code"),
        ({"USD": ["debit"]}, "must be a dict"),
        (["USD"], "must be None or a dict"),
    ],
)
def test_a_bad_setting_is_refused_naming_the_problem(value, problem):
    with pytest.raises(ValueError) as refused:
        parse_exposure_limits(value)

    assert problem in str(refused.value)


def test_manage_py_check_refuses_a_bad_default_naming_the_setting(module_settings):
    module_settings.EXPOSURE_LIMITS = {"USD": {"debit": {"daily": "-5"}}}

    with pytest.raises(SystemCheckError) as refused:
        call_command("check")

    assert "EXPOSURE_LIMITS" in str(refused.value)
    assert "greater than zero" in str(refused.value)


# --- effective banking days ---------------------------------------------------------------------


def test_an_entry_made_on_a_weekend_or_holiday_counts_on_the_next_banking_day():
    # Christmas 2026 is a Friday: the Reserve Banks reopen on Monday the 28th.
    assert effective_banking_day(_eastern(2026, 12, 24, 23, 59)).isoformat() == "2026-12-24"
    assert effective_banking_day(_eastern(2026, 12, 25, 9)).isoformat() == "2026-12-28"
    assert effective_banking_day(_eastern(2026, 12, 27, 23)).isoformat() == "2026-12-28"
    # 02:00 UTC on the 29th is still the 28th in New York.
    moment = datetime(2026, 12, 29, 2, tzinfo=ZoneInfo("UTC"))
    assert effective_banking_day(moment).isoformat() == "2026-12-28"
    # The window of two banking days up to the 28th begins after the 23rd ends.
    assert counted_since(effective_banking_day(moment), 2) == _eastern(
        2026, 12, 23, 23, 59, 59, 999999
    )


def test_the_daily_limit_counts_the_holiday_and_weekend_entries_with_the_day_after():
    _set("acme", daily=Decimal("100.00"))
    _entry("acme", "60.00", _eastern(2026, 12, 24, 15))  # Thursday: its own day
    _entry("acme", "30.00", _eastern(2026, 12, 25, 10))  # Christmas: counts on Monday
    _entry("acme", "30.00", _eastern(2026, 12, 26, 10))  # Saturday: counts on Monday

    monday = _eastern(2026, 12, 28, 9)
    with pytest.raises(ExposureLimitExceeded) as refused:
        _check("acme", "40.01", monday)
    _check("acme", "40.00", monday)
    # Seen from the Thursday, the weekend's entries are a later day's.
    _check("acme", "40.00", _eastern(2026, 12, 24, 16))

    assert refused.value.limit == "debit_daily_limit"
    assert refused.value.over == Decimal("0.01")


def test_the_window_limit_counts_its_banking_days_and_not_the_one_before():
    _set("acme", window=Decimal("100.00"), window_banking_days=2)
    _entry("acme", "50.00", _eastern(2026, 12, 23, 12))  # Wednesday: outside 2 days from Monday
    _entry("acme", "40.00", _eastern(2026, 12, 24, 12))  # Thursday
    _entry("acme", "40.00", _eastern(2026, 12, 27, 12))  # Sunday, counts on Monday

    monday = _eastern(2026, 12, 28, 12)
    with pytest.raises(ExposureLimitExceeded) as refused:
        _check("acme", "20.01", monday)
    _check("acme", "20.00", monday)

    assert refused.value.limit == "debit_window_limit"
    assert "0.01 USD over its debit window limit of 100.00 USD" in str(refused.value)


# --- what counts -------------------------------------------------------------------------------


def test_the_single_entry_limit_refuses_one_entry_over_it_and_writes_nothing():
    _set("acme", single=Decimal("250.00"))

    with pytest.raises(ExposureLimitExceeded) as refused:
        _debit("acme", "250.01")
    made = _debit("acme", "250.00")

    assert refused.value.limit == "debit_single_limit"
    assert "0.01 USD over its debit single limit of 250.00 USD" in str(refused.value)
    assert list(Payment.objects.filter(merchant_id="acme")) == [made]


def test_failed_and_canceled_entries_do_not_count_and_returned_ones_do():
    _set("acme", daily=Decimal("100.00"))
    now = _eastern(2026, 12, 28, 12)
    _entry("acme", "90.00", now, state=PaymentState.FAILED)
    _entry("acme", "90.00", now, state=PaymentState.CANCELED)
    _entry("acme", "60.00", now, state=PaymentState.RETURNED)

    _check("acme", "40.00", now)
    with pytest.raises(ExposureLimitExceeded):
        _check("acme", "40.01", now)


def test_debits_and_credits_and_each_currency_are_counted_apart():
    _set("acme", "debit", USD, daily=Decimal("100.00"))
    _set("acme", "credit", USD, daily=Decimal("50.00"))
    _set("acme", "debit", "EUR", daily=Decimal("10.00"))
    now = _eastern(2026, 12, 28, 12)
    _entry("acme", "100.00", now)  # a USD debit: the debit limit is used up
    _entry("acme", "10.00", now, currency="EUR")
    _entry("other", "100.00", now, direction="credit", purpose="payout")  # another merchant

    _check("acme", "50.00", now, direction="credit")
    with pytest.raises(ExposureLimitExceeded) as debit:
        _check("acme", "0.01", now)
    with pytest.raises(ExposureLimitExceeded) as eur:
        _check("acme", "0.01", now, currency="EUR")
    _check("acme", "1000.00", now, currency="CAD")  # no limit in CAD

    assert debit.value.limit == "debit_daily_limit"
    assert "EUR" in str(eur.value)


def test_the_default_applies_until_the_merchant_has_its_own_and_an_empty_cap_caps_nothing(
    module_settings,
):
    module_settings.EXPOSURE_LIMITS = {"USD": {"debit": {"single": "10.00"}}}

    with pytest.raises(ExposureLimitExceeded):
        _debit("acme", "10.01")
    _set("acme", daily=Decimal("1000.00"))  # its own: no single cap at all
    made = _debit("acme", "500.00")
    _set("acme")  # every cap empty: nothing capped, and the default no longer applies
    more = _debit("acme", "5000.00")

    assert (made.amount, more.amount) == (Decimal("500.00"), Decimal("5000.00"))


def test_a_lowered_limit_refuses_the_next_create_and_leaves_the_entries_made():
    _set("acme", daily=Decimal("100.00"))
    first = _debit("acme", "80.00")
    _set("acme", daily=Decimal("50.00"))

    with pytest.raises(ExposureLimitExceeded) as refused:
        _debit("acme", "1.00")

    assert refused.value.over == Decimal("31.00")
    first.refresh_from_db()
    assert first.state == PaymentState.PENDING


# --- races on PostgreSQL ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_debits_never_pass_the_daily_limit_together():
    _set("acme", daily=Decimal("100.00"))

    results = race(*(lambda: _debit("acme", "7.00") for _ in range(20)))

    made = [r for r in results if isinstance(r, Payment)]
    refused = [r for r in results if isinstance(r, ExposureLimitExceeded)]
    assert len(made) + len(refused) == 20, results
    assert len(made) == 14  # 14 x 7.00 = 98.00; a 15th would be 105.00
    assert {r.limit for r in refused} == {"debit_daily_limit"}
    total = sum(p.amount for p in Payment.objects.filter(merchant_id="acme"))
    assert total == Decimal("98.00")


@pytest.mark.django_db(transaction=True)
def test_a_refund_and_a_payout_racing_for_one_credit_limit_never_both_pass(module_settings):
    module_settings.AVAILABLE_AFTER_BANKING_DAYS = 0
    outcomes = []
    for round_ in range(5):
        merchant = f"race-{round_}"
        _set(merchant, "credit", daily=Decimal("100.00"))
        debit = PaymentFactory(
            merchant_id=merchant, state=PaymentState.SUBMITTED, amount=Decimal("500.00")
        )
        payment_apply_event(event=processor_event(debit, "settled"))

        results = race(
            lambda d=debit: refund_create(payment_id=d.id, amount=Decimal("60.00")),
            lambda m=merchant: payout_create(
                merchant_id=m, amount=Decimal("60.00"), destination_token=TOKEN
            ),
        )

        made = [r for r in results if isinstance(r, Payment)]
        refused = [r for r in results if isinstance(r, ExposureLimitExceeded)]
        assert (len(made), len(refused)) == (1, 1), results
        assert refused[0].limit == "credit_daily_limit"
        credits = Payment.objects.filter(merchant_id=merchant, direction="credit")
        assert sum(p.amount for p in credits) == Decimal("60.00")
        outcomes.append(made[0].purpose)
    assert set(outcomes) <= {PaymentPurpose.REFUND, PaymentPurpose.PAYOUT}


# --- changes: the permission, the note, the audit row ----------------------------------------


def test_a_change_needs_the_permission_and_a_note():
    plain = UserFactory(is_staff=True)
    allowed = _limits_user()

    with pytest.raises(PermissionDenied):
        exposure_limit_set(
            merchant_id="acme",
            direction="debit",
            currency=USD,
            limits=Limits(daily=Decimal("1.00")),
            user=plain,
            note="why",
        )
    with pytest.raises(ValidationError) as no_note:
        exposure_limit_set(
            merchant_id="acme",
            direction="debit",
            currency=USD,
            limits=Limits(daily=Decimal("1.00")),
            user=allowed,
            note="   ",
        )

    assert "note" in no_note.value.message_dict
    assert not ExposureLimit.objects.exists()
    assert not ExposureLimitChange.objects.exists()


def test_each_change_writes_an_audit_row_with_who_what_before_and_after(module_settings):
    module_settings.EXPOSURE_LIMITS = {"USD": {"debit": {"single": "10.00"}}}
    user = _limits_user(username="risk-officer")

    exposure_limit_set(
        merchant_id="acme",
        direction="debit",
        currency=USD,
        limits=Limits(daily=Decimal("100.00")),
        user=user,
        note="onboarding",
    )
    exposure_limit_set(
        merchant_id="acme",
        direction="debit",
        currency=USD,
        limits=Limits(daily=Decimal("50.00")),
        user=user,
        note="review: lowered",
    )

    first, second = ExposureLimitChange.objects.order_by("id")
    assert (first.changed_by, first.note) == (user, "onboarding")
    assert first.old["source"] == "default" and first.old["single"] == "10.00"
    assert first.new["daily"] == "100.00"
    assert (second.old["daily"], second.new["daily"]) == ("100.00", "50.00")
    assert ExposureLimit.objects.get(merchant_id="acme").daily_limit == Decimal("50.00")


ADD_URL = "/admin/payments/exposurelimit/add/"


def _form(**fields) -> dict:
    return {
        "merchant_id": "acme",
        "direction": "debit",
        "currency": "USD",
        "single_limit": "",
        "daily_limit": "",
        "window_limit": "",
        "window_banking_days": "",
        "note": "annual review",
        **fields,
    }


def test_the_admin_refuses_a_staff_user_without_the_permission(client):
    client.force_login(UserFactory(is_staff=True))

    page = client.get(ADD_URL)
    posted = client.post(ADD_URL, _form(daily_limit="100.00"))

    assert (page.status_code, posted.status_code) == (403, 403)
    assert not ExposureLimit.objects.exists()


def test_the_admin_sets_limits_with_a_note_and_an_audit_row(client):
    user = _limits_user(username="risk-officer")
    client.force_login(user)

    added = client.post(
        ADD_URL, _form(daily_limit="100.00", window_limit="300", window_banking_days="5")
    )
    row = ExposureLimit.objects.get()
    changed = client.post(
        f"/admin/payments/exposurelimit/{row.pk}/change/",
        _form(daily_limit="80.00", window_limit="300", window_banking_days="5", note="lowered"),
    )
    audit = client.get("/admin/payments/exposurelimitchange/")

    assert added.status_code == 302 and changed.status_code == 302, changed.content[:2000]
    row.refresh_from_db()
    assert (row.daily_limit, row.window_limit, row.window_banking_days) == (
        Decimal("80.00"),
        Decimal("300.00"),
        5,
    )
    changes = list(ExposureLimitChange.objects.order_by("id"))
    assert [c.note for c in changes] == ["annual review", "lowered"]
    assert {c.changed_by for c in changes} == {user}
    assert audit.status_code == 200 and b"lowered" in audit.content
    assert (
        client.post(f"/admin/payments/exposurelimitchange/{changes[0].pk}/delete/").status_code
        == 403
    )


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"daily_limit": "-5.00"}, b"greater than zero"),
        ({"daily_limit": "0"}, b"greater than zero"),
        ({"daily_limit": "NaN"}, b"Enter a number"),
        ({"daily_limit": "Infinity"}, b"Enter a number"),
        ({"daily_limit": "10.005"}, b"decimal places"),
        ({"daily_limit": "1" * 40}, b"digits in total"),
        ({"daily_limit": "ten"}, b"Enter a number"),
        ({"window_limit": "100.00"}, b"go together"),
        ({"window_limit": "100", "window_banking_days": "61"}, b"1 to 60"),
        ({"window_limit": "100", "window_banking_days": "99999999999"}, b"less than or equal"),
        ({"daily_limit": "100", "note": ""}, b"This field is required"),
        ({"daily_limit": "100", "note": "why\x00"}, b"Null characters are not allowed"),
        ({"daily_limit": "100", "merchant_id": "acme\x00"}, b"Null characters are not allowed"),
        ({"daily_limit": "100", "merchant_id": "ac me"}, b"1-64 characters"),
        ({"daily_limit": "100", "direction": "sideways"}, b"Select a valid choice"),
        ({"daily_limit": "100", "currency": "U$D"}, b"not a currency code"),
        ({"daily_limit": "100", "currency": "usd"}, b"not a currency code"),
    ],
)
def test_the_admin_refuses_hostile_limits_naming_the_problem_and_saves_nothing(
    client, fields, problem
):
    client.force_login(_limits_user())

    response = client.post(ADD_URL, _form(**fields))

    assert response.status_code == 200  # the form again, with its errors
    assert problem in response.content, response.content.decode(errors="replace")[-3000:]
    assert not ExposureLimit.objects.exists()
    assert not ExposureLimitChange.objects.exists()


# --- the API -----------------------------------------------------------------------------------


def test_a_debit_over_a_limit_answers_409_naming_the_limit_and_releases_the_key(api_client, user):
    grant(user, "acme")
    _set("acme", daily=Decimal("100.00"))
    _debit("acme", "90.00")
    body = {"merchant_id": "acme", "amount": "20.00", "source_token": TOKEN}

    refused = api_client.post(
        "/api/payments/", body, format="json", headers={"Idempotency-Key": "k1"}
    )
    _set("acme", daily=Decimal("200.00"))
    again = api_client.post(
        "/api/payments/", body, format="json", headers={"Idempotency-Key": "k1"}
    )

    error = refused.json()["error"]
    assert refused.status_code == 409
    assert (error["code"], error["param"]) == ("exposure_limit_exceeded", "debit_daily_limit")
    assert "10.00 USD over its debit daily limit of 100.00 USD" in error["message"]
    assert again.status_code == 201, again.json()


def test_a_refund_and_a_payout_over_the_credit_limit_answer_409(api_client, user, module_settings):
    module_settings.AVAILABLE_AFTER_BANKING_DAYS = 0
    grant(user, "acme")
    debit = PaymentFactory(merchant_id="acme", state=PaymentState.SUBMITTED, amount=Decimal("500"))
    payment_apply_event(event=processor_event(debit, "settled"))
    _set("acme", "credit", single=Decimal("50.00"))

    refund = api_client.post(
        f"/api/payments/{debit.id}/refunds/", {"amount": "50.01"}, format="json"
    )
    payout = api_client.post(
        "/api/payouts/",
        {"merchant_id": "acme", "amount": "75.00", "destination_token": TOKEN},
        format="json",
    )

    for answer, over in ((refund, "0.01"), (payout, "25.00")):
        error = answer.json()["error"]
        assert answer.status_code == 409
        assert (error["code"], error["param"]) == ("exposure_limit_exceeded", "credit_single_limit")
        assert f"{over} USD over" in error["message"]
    assert not Payment.objects.filter(direction=PaymentDirection.CREDIT).exists()


def test_a_reinitiation_over_a_limit_is_refused_under_the_reinitiation_rules(api_client, user):
    grant(user, "acme")
    original = PaymentFactory(
        merchant_id="acme",
        state=PaymentState.SUBMITTED,
        amount=Decimal("42.00"),
        source_token=TOKEN,
    )
    payment_apply_event(event=processor_event(original, "settled"))
    payment_apply_event(event=processor_event(original, "returned", reason_code="R01"))
    _set("acme", single=Decimal("40.00"))

    with pytest.raises(ReinitiationRefused) as refused:
        payment_reinitiate(payment_id=original.id)
    answer = api_client.post(f"/api/payments/{original.id}/reinitiate/", {}, format="json")

    assert refused.value.rule == "exposure_limit_exceeded"
    error = answer.json()["error"]
    assert answer.status_code == 409
    assert (error["code"], error["param"]) == ("exposure_limit_exceeded", "debit_single_limit")
    assert not original.reinitiations.exists()


def test_the_merchant_sees_its_limits_and_what_is_left_today(api_client, user, module_settings):
    module_settings.EXPOSURE_LIMITS = {"USD": {"credit": {"daily": "500.00"}}}
    grant(user, "acme")
    _set("acme", daily=Decimal("100.00"), window=Decimal("300.00"), window_banking_days=5)
    _debit("acme", "30.00")
    _debit("acme", "25.50")

    answer = api_client.get("/api/merchants/acme/limits/")

    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert (body["object"], body["merchant_id"]) == ("exposure_limits", "acme")
    debit, credit = sorted(body["limits"], key=lambda item: item["direction"], reverse=True)
    assert debit["source"] == "merchant"
    assert (debit["daily_limit"], debit["used_today"], debit["remaining_today"]) == (
        "100.00",
        "55.50",
        "44.50",
    )
    assert (debit["window_limit"], debit["window_banking_days"], debit["remaining_window"]) == (
        "300.00",
        5,
        "244.50",
    )
    assert debit["single_limit"] is None
    assert (credit["source"], credit["daily_limit"], credit["remaining_today"]) == (
        "default",
        "500.00",
        "500.00",
    )


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/api/merchants/globex/limits/", 404, "resource_missing"),
        ("/api/merchants/nobody/limits/", 404, "resource_missing"),
        ("/api/merchants/ac%20me/limits/", 400, "parameter_invalid"),
        ("/api/merchants/acme%00/limits/", 400, "parameter_invalid"),
        ("/api/merchants/%ED%A0%80/limits/", 400, "parameter_invalid"),
        (f"/api/merchants/{'a' * 65}/limits/", 400, "parameter_invalid"),
    ],
)
def test_another_merchants_limits_answer_404_and_a_bad_id_400(api_client, user, path, status, code):
    grant(user, "acme")
    _set("globex", daily=Decimal("100.00"))

    answer = api_client.get(path)

    assert answer.status_code == status, answer.content
    assert answer.json()["error"]["code"] == code


def test_the_limits_answer_needs_credentials(client):
    answer = client.get("/api/merchants/acme/limits/")

    assert answer.status_code == 401
    assert json.loads(answer.content)["error"]["type"] == "authentication_error"


def test_merchant_exposure_lists_every_direction_of_every_currency_it_pays_in():
    exposure = merchant_exposure(merchant_id="acme", currencies=(USD,))

    assert [(e.direction, e.currency, e.limits.empty) for e in exposure] == [
        ("credit", USD, True),
        ("debit", USD, True),
    ]
    assert all(e.remaining_today is None and not math.isnan(e.used_today) for e in exposure)


# --- PAYMENTS["OVER_LIMIT"] = "hold": created, and held for a person's review ------------------


@pytest.fixture
def hold_mode(module_settings):
    module_settings.OVER_LIMIT = "hold"
    module_settings.AVAILABLE_AFTER_BANKING_DAYS = 0


def _reviewer(**fields):
    user = UserFactory(is_staff=True, **fields)
    user.user_permissions.add(Permission.objects.get(codename="review_payment"))
    return type(user).objects.get(pk=user.pk)


def _submit_commands(payment: Payment) -> int:
    return OutboxMessage.objects.filter(group_id=str(payment.id), kind="submit_payment").count()


def test_manage_py_check_refuses_an_over_limit_mode_it_does_not_know(module_settings):
    module_settings.OVER_LIMIT = "ignore"

    with pytest.raises(SystemCheckError) as refused:
        call_command("check")

    assert "OVER_LIMIT" in str(refused.value)
    assert "'refuse' or 'hold'" in str(refused.value)


def test_in_hold_mode_a_debit_past_a_limit_is_created_held_without_its_submit_command(hold_mode):
    _set("acme", daily=Decimal("100.00"))
    within = _debit("acme", "90.00")
    held = _debit("acme", "20.00")

    assert (within.review_status, _submit_commands(within)) == ("", 1)
    assert (held.state, held.review_status, _submit_commands(held)) == ("pending", "held", 0)
    assert held.review_reason.startswith("debit_daily_limit: 20.00 USD would take merchant acme")
    created = held.events.get(kind="created")
    assert created.payload["review_status"] == "held"
    # A held payment counts until it is rejected: the next one is held too.
    assert _debit("acme", "1.00").review_status == "held"


def test_a_stray_submit_command_for_a_held_payment_is_skipped_without_a_call(hold_mode):
    _set("acme", single=Decimal("10.00"))
    held = _debit("acme", "20.00")

    result = payment_submit(payment_id=held.id)

    assert result.outcome == SubmitOutcome.SKIPPED
    assert not ProcessorAttempt.objects.filter(payment=held).exists()
    held.refresh_from_db()
    assert (held.state, held.submission_started_at) == ("pending", None)


def test_approval_needs_the_permission_and_a_note_and_sends_the_payment_once(hold_mode):
    _set("acme", single=Decimal("10.00"))
    held = _debit("acme", "20.00")
    reviewer = _reviewer(username="reviewer")

    with pytest.raises(PermissionDenied):
        payment_review_approve(payment_id=held.id, user=UserFactory(is_staff=True), note="ok")
    with pytest.raises(ValidationError):
        payment_review_approve(payment_id=held.id, user=reviewer, note=" ")
    assert _submit_commands(held) == 0
    approved = payment_review_approve(payment_id=held.id, user=reviewer, note="known customer")
    with pytest.raises(ReviewRefused) as twice:
        payment_review_approve(payment_id=held.id, user=reviewer, note="again")
    with pytest.raises(ReviewRefused):
        payment_review_reject(payment_id=held.id, user=reviewer, note="too late")

    assert approved.review_status == "approved"
    assert _submit_commands(held) == 1
    assert twice.value.rule == "payment_not_held"
    decision = held.events.get(kind="review")
    assert (decision.event_type, decision.payload["note"], decision.caused_by) == (
        "approved",
        "known customer",
        "review:reviewer",
    )


def test_a_rejected_payout_is_canceled_its_money_freed_and_never_sent(hold_mode):
    debit = PaymentFactory(merchant_id="acme", state=PaymentState.SUBMITTED, amount=Decimal("500"))
    payment_apply_event(event=processor_event(debit, "settled"))
    _set("acme", "credit", daily=Decimal("50.00"))

    payout = payout_create(merchant_id="acme", amount=Decimal("75.00"), destination_token=TOKEN)
    refund = refund_create(payment_id=debit.id, amount=Decimal("60.00"))
    rejected = payment_review_reject(payment_id=payout.id, user=_reviewer(), note="new account")

    assert (payout.review_status, refund.review_status) == ("held", "held")
    assert (_submit_commands(payout), _submit_commands(refund)) == (0, 0)
    assert (rejected.state, rejected.review_status) == ("canceled", "rejected")
    assert LedgerEntry.objects.get(payment=payout).status == LedgerEntryStatus.ARCHIVED
    assert _submit_commands(payout) == 0


def test_the_merchants_cancel_first_leaves_nothing_to_approve(hold_mode):
    _set("acme", single=Decimal("10.00"))
    held = _debit("acme", "20.00")

    payment_cancel(payment_id=held.id)
    with pytest.raises(ReviewRefused) as refused:
        payment_review_approve(payment_id=held.id, user=_reviewer(), note="ok")

    assert refused.value.rule == "payment_not_pending"
    assert _submit_commands(held) == 0


def test_the_create_answer_says_the_payment_is_held(api_client, user, hold_mode):
    grant(user, "acme")
    _set("acme", single=Decimal("10.00"))

    answer = api_client.post(
        "/api/payments/",
        {"merchant_id": "acme", "amount": "10.01", "source_token": TOKEN},
        format="json",
    )

    assert answer.status_code == 201, answer.json()
    assert answer.json()["state"] == "pending"
    [warning] = answer.json()["warnings"]
    assert warning["code"] == "held_for_review"
    assert "0.01 USD over its debit single limit" in warning["message"]


@pytest.mark.django_db(transaction=True)
def test_approve_reject_and_the_merchants_cancel_racing_decide_once_and_send_only_approved(
    module_settings,
):
    """One review decision wins; the merchant's cancel first leaves none to take. An approved
    payment stays cancelable until its submission starts, as any pending one: then its submit
    command finds it canceled and sends nothing."""
    module_settings.OVER_LIMIT = "hold"
    _set("acme", single=Decimal("10.00"))
    reviewer = _reviewer()
    for _ in range(6):
        held = _debit("acme", "20.00")

        approve, reject, cancel = race(
            lambda p=held: payment_review_approve(payment_id=p.id, user=reviewer, note="ok"),
            lambda p=held: payment_review_reject(payment_id=p.id, user=reviewer, note="no"),
            lambda p=held: payment_cancel(payment_id=p.id),
        )

        decided = [r for r in (approve, reject) if isinstance(r, Payment)]
        assert len(decided) <= 1, (approve, reject)
        held.refresh_from_db()
        if isinstance(approve, Payment):
            assert held.review_status == "approved" and _submit_commands(held) == 1
        elif isinstance(reject, Payment):
            assert (held.state, held.review_status, _submit_commands(held)) == (
                "canceled",
                "rejected",
                0,
            )
        else:
            assert (held.state, held.review_status, _submit_commands(held)) == (
                "canceled",
                "held",
                0,
            )
            assert {approve.rule, reject.rule} == {"payment_not_pending"}
        sent = payment_submit(payment_id=held.id) if held.state == "canceled" else None
        assert sent is None or sent.outcome == SubmitOutcome.SKIPPED
        assert not ProcessorAttempt.objects.filter(payment=held).exists()


def _review_url(payment) -> str:
    return f"/admin/payments/payment/{payment.pk}/review/"


def test_the_review_page_needs_the_permission(client, hold_mode):
    _set("acme", single=Decimal("10.00"))
    held = _debit("acme", "20.00")
    client.force_login(UserFactory(is_staff=True))

    page = client.get(_review_url(held))
    posted = client.post(_review_url(held), {"decision": "approve", "note": "ok"})

    assert (page.status_code, posted.status_code) == (403, 403)
    assert _submit_commands(held) == 0


def test_a_reviewer_approves_in_the_admin_with_a_note_and_a_second_decision_is_refused(
    client, hold_mode
):
    _set("acme", single=Decimal("10.00"))
    held = _debit("acme", "20.00")
    client.force_login(_reviewer())

    page = client.get(_review_url(held))
    no_note = client.post(_review_url(held), {"decision": "approve", "note": ""})
    forged = client.post(_review_url(held), {"decision": "send-twice", "note": "x"})
    approved = client.post(_review_url(held), {"decision": "approve", "note": "checked"})
    again = client.post(_review_url(held), {"decision": "reject", "note": "changed my mind"})
    change = client.get(f"/admin/payments/payment/{held.pk}/change/")

    assert page.status_code == 200 and b"debit_single_limit" in page.content
    assert no_note.status_code == 200 and b"This field is required" in no_note.content
    assert forged.status_code == 200 and b"Select a valid choice" in forged.content
    assert approved.status_code == 302
    assert again.status_code == 200 and b"not held for review" in again.content
    assert change.status_code == 200 and b"Approved" in change.content
    held.refresh_from_db()
    assert (held.state, held.review_status, _submit_commands(held)) == ("pending", "approved", 1)


def test_the_review_page_refuses_a_forged_post_and_an_unknown_payment(hold_mode):
    from django.test import Client

    _set("acme", single=Decimal("10.00"))
    held = _debit("acme", "20.00")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(_reviewer())

    forged = strict.post(_review_url(held), {"decision": "approve", "note": "ok"})
    unknown = strict.get("/admin/payments/payment/00000000-0000-0000-0000-000000000000/review/")
    not_uuid = strict.get("/admin/payments/payment/not-a-uuid/review/")

    assert forged.status_code == 403  # no CSRF token
    assert unknown.status_code == 404
    assert not_uuid.status_code in (302, 404)  # the admin's own answer to an unknown object
    held.refresh_from_db()
    assert (held.review_status, _submit_commands(held)) == ("held", 0)
