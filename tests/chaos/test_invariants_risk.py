"""The risk-control invariants: a clean history with limits and holds passes both; each
corruption fails the check that names it, and no other."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from chaos.invariants import check_invariants
from payments.exposure_limits import Limits
from payments.models import Payment, ProcessorAttempt
from payments.services import payment_create
from payments.services.cancel import payment_cancel
from payments.services.limits import exposure_limit_set
from payments.services.review import payment_review_approve, payment_review_reject
from tests.chaos.histories import check, services_as_production
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

LIMITS = "limits_never_exceeded"
HELD = "held_payments_never_sent_unapproved"


@pytest.fixture
def risky(history, module_settings):
    """The clean history, plus a merchant with a daily debit cap of 100.00 and a single cap of
    80.00, its entries within them, one held past them, one held and approved, one rejected."""
    module_settings.OVER_LIMIT = "hold"
    with services_as_production():
        return _risky(history)


def _risky(history):
    admin = UserFactory(is_superuser=True)
    exposure_limit_set(
        merchant_id="m-risk",
        direction="debit",
        currency="USD",
        limits=Limits(single=Decimal("80.00"), daily=Decimal("100.00")),
        user=admin,
        note="chaos",
    )

    def debit(amount):
        return payment_create(
            merchant_id="m-risk", amount=Decimal(amount), source_token="tok_risk_acct_1"
        )

    within = [debit("60.00"), debit("40.00")]
    held = debit("30.00")
    approved, rejected = debit("90.00"), debit("85.00")
    payment_review_approve(payment_id=approved.id, user=admin, note="ok")
    payment_review_reject(payment_id=rejected.id, user=admin, note="no")
    return {**history, "within": within, "held": held, "approved": approved}


def _only(report, name: str) -> list:
    assert {v.check for v in report.violations} == {name}, report.render()
    return report.violations_of(name)


def _attempt(payment: Payment, started_at) -> None:
    ProcessorAttempt.objects.create(
        payment=payment,
        attempt_number=1,
        idempotency_key=payment.idempotency_key,
        outcome="accepted",
        latency_ms=1.0,
        started_at=started_at,
    )


def test_a_clean_history_with_limits_and_holds_passes_both(risky):
    report = check(risky)

    assert report.ok, report.render()
    # 60 + 40 on one banking day: the daily cap of 100.00 reached.
    assert report.checked[LIMITS] == {
        "entries with limits": 2,
        "banking days run into a daily cap": 1,
    }
    assert report.checked[HELD] == {
        "payments held for review": 3,
        "approved": 1,
        "approved and attempted": 0,
        "rejected": 1,
        "canceled by the merchant while held": 0,
        "still held": 1,
    }


def test_an_entry_grown_past_the_daily_cap_fails_the_limits_check(risky):
    first, second = risky["within"]
    Payment.objects.filter(pk=first.pk).update(amount=Decimal("70.00"))

    [violation] = _only(check(risky), LIMITS)

    assert "daily cap 100.00" in str(violation.ids)
    assert str(second.pk) in violation.ids[0]


def test_an_entry_past_the_single_cap_fails_the_limits_check(risky):
    first, _ = risky["within"]
    Payment.objects.filter(pk=first.pk).update(amount=Decimal("80.01"))

    [violation] = _only(check(risky), LIMITS)

    assert any("single-entry cap 80.00" in i for i in violation.ids), violation.ids


def test_a_held_entry_let_through_without_its_hold_fails_the_limits_check(risky):
    Payment.objects.filter(pk=risky["held"].pk).update(review_status="")

    [violation] = _only(check(risky), LIMITS)

    assert str(risky["held"].pk) in violation.ids[0]


def test_a_limit_raised_later_does_not_excuse_an_entry_made_before(risky):
    admin = UserFactory(is_superuser=True)
    first, _ = risky["within"]
    Payment.objects.filter(pk=first.pk).update(amount=Decimal("75.00"))
    exposure_limit_set(
        merchant_id="m-risk",
        direction="debit",
        currency="USD",
        limits=Limits(single=Decimal("80.00"), daily=Decimal("1000.00")),
        user=admin,
        note="raised",
    )

    assert _only(check(risky), LIMITS)


def test_a_held_payment_attempted_fails_the_held_check(risky):
    _attempt(risky["held"], timezone.now())

    [violation] = _only(check(risky), HELD)

    assert "with an attempt" in violation.ids[0]


def test_a_held_payments_key_at_the_processor_fails_the_held_check(risky):
    risky["stats"]["charges"][str(risky["held"].idempotency_key)] = 1

    violations = check(risky).violations_of(HELD)

    assert len(violations) == 1
    assert "its key at the processor" in violations[0].ids[0]


def test_an_approved_payment_attempted_before_its_approval_fails_the_held_check(risky):
    _attempt(risky["approved"], timezone.now() - timedelta(hours=1))

    [violation] = _only(check(risky), HELD)

    assert "attempted before its approval" in violation.ids[0]


def test_a_rejected_payment_with_a_processor_id_fails_the_held_check(risky):
    Payment.objects.filter(review_status="rejected").update(processor_id="pr_sent")

    [violation] = _only(check(risky), HELD)

    assert "with a processor id" in violation.ids[0]


def _expecting(history) -> object:
    return check_invariants(
        sandbox_stats=history["stats"],
        callbacks_sent=history["sent"],
        expect_limits=True,
        expect_holds=True,
    )


def test_a_run_configured_with_limits_and_holds_passes_when_it_checked_some(risky):
    report = _expecting(risky)

    assert report.ok, report.render()


def test_a_run_configured_with_limits_fails_when_no_entry_was_made_under_one(history):
    report = _expecting(history)

    [violation] = report.violations_of(LIMITS)
    assert "proved nothing" in violation.detail
    assert report.checked[LIMITS]["entries with limits"] == 0


def test_a_run_configured_with_holds_fails_when_nothing_was_held(history):
    report = _expecting(history)

    [violation] = report.violations_of(HELD)
    assert "no payment was held" in violation.detail
    assert report.checked[HELD]["payments held for review"] == 0


def test_a_run_not_configured_with_limits_or_holds_passes_having_checked_none(history):
    report = check(history)

    assert not report.violations_of(LIMITS) and not report.violations_of(HELD)
    assert report.checked[LIMITS]["entries with limits"] == 0


def test_a_banking_day_far_below_its_daily_cap_is_not_counted_as_reaching_it(risky):
    first, second = risky["within"]
    Payment.objects.filter(pk__in=[first.pk, second.pk]).update(amount=Decimal("10.00"))

    report = check(risky)

    assert report.ok, report.render()
    assert report.checked[LIMITS]["banking days run into a daily cap"] == 0


def test_an_approved_payment_attempted_after_its_approval_is_counted_and_passes(risky):
    _attempt(risky["approved"], timezone.now() + timedelta(seconds=1))

    report = check(risky)

    assert report.ok, report.render()
    assert report.checked[HELD]["approved and attempted"] == 1


def test_a_held_payment_the_merchant_canceled_is_counted_apart_and_passes(risky):
    payment_cancel(payment_id=risky["held"].id, caused_by="merchant")

    report = check(risky)

    assert report.ok, report.render()
    assert report.checked[HELD]["canceled by the merchant while held"] == 1
    assert report.checked[HELD]["still held"] == 0


def test_a_held_payment_the_merchant_canceled_then_attempted_fails_the_held_check(risky):
    payment_cancel(payment_id=risky["held"].id, caused_by="merchant")
    _attempt(risky["held"], timezone.now())

    [violation] = _only(check(risky), HELD)

    assert "with an attempt" in violation.ids[0]
