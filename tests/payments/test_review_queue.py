"""The review queue in the admin: the held payments by rule and merchant for a user with
``payments.review_payment``, approved or rejected one by one or in bulk for one rule with a
note, each decision an audit row and a count per rule; racing decisions and the merchant's
cancel have one winner."""

from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from prometheus_client import REGISTRY

from payments.models import OutboxMessage, Payment, PaymentState
from payments.services import payment_cancel, payment_create
from payments.services.review import payment_review_approve, payment_review_reject
from tests.factories import UserFactory
from tests.waiting import race

pytestmark = pytest.mark.django_db

QUEUE = "/admin/payments/heldpayment/"
OFF = {"enabled": False}


@pytest.fixture(autouse=True)
def rules(module_settings):
    """Two rules that hold on amount alone: first_large_debit above 2500.00 from a new account,
    and a host's round-amount rule (from 1000.00)."""
    module_settings.FRAUD_RULES = {
        "new_destination": OFF,
        "velocity": OFF,
        "first_large_debit": {"amount": "2500.00"},
        "round_amount": {"path": "tests.payments.fraud_example.RoundAmount", "amount": "1000"},
    }


def _held(merchant: str, amount: str, n: int = 0) -> Payment:
    payment = payment_create(
        merchant_id=merchant,
        amount=Decimal(amount),
        source_token=f"tok_queue_{merchant}_{amount.replace('.', '_')}_{n}",
    )
    assert payment.review_status == "held"
    return payment


def _reviewer(**fields):
    user = UserFactory(is_staff=True, **fields)
    user.user_permissions.add(Permission.objects.get(codename="review_payment"))
    return type(user).objects.get(pk=user.pk)


def _submit_commands(payment: Payment) -> int:
    return OutboxMessage.objects.filter(group_id=str(payment.id), kind="submit_payment").count()


def _count(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _bulk(client, action: str, payments, note: str | None = None):
    data = {"action": action, "_selected_action": [str(p.pk) for p in payments]}
    if note is not None:
        data.update(confirmed="yes", note=note)
    return client.post(QUEUE, data)


def test_the_queue_lists_held_payments_by_rule_and_merchant(client):
    large = _held("acme", "3000.01")
    round_ = _held("other", "2000.00")
    payment_create(merchant_id="acme", amount=Decimal("5.00"), source_token="tok_queue_fine_01")
    client.force_login(_reviewer())

    everything = client.get(QUEUE)
    by_rule = client.get(QUEUE, {"review_rule": "round_amount"})
    by_merchant = client.get(QUEUE, {"merchant_id": "acme"})

    assert everything.status_code == 200
    assert list(everything.context["cl"].queryset) == [large, round_]
    assert list(by_rule.context["cl"].queryset) == [round_]
    assert list(by_merchant.context["cl"].queryset) == [large]
    assert b"first_large_debit" in everything.content


def test_the_queue_and_its_actions_need_the_permission(client):
    held = _held("acme", "3000.01")
    client.force_login(UserFactory(is_staff=True))

    page = client.get(QUEUE)
    posted = _bulk(client, "approve_selected", [held], note="ok")

    assert (page.status_code, posted.status_code) == (403, 403)
    held.refresh_from_db()
    assert (held.review_status, _submit_commands(held)) == ("held", 0)


def test_the_review_page_shows_the_figures_and_the_baseline(client):
    held = _held("acme", "3000.01")
    client.force_login(_reviewer())

    page = client.get(f"/admin/payments/payment/{held.pk}/review/")

    assert page.status_code == 200
    assert b"first_large_debit" in page.content
    assert b"&quot;threshold&quot;: &quot;2500.00&quot;" in page.content
    assert b"baseline_banking_days" in page.content


def test_a_bulk_approval_of_one_rule_asks_for_a_note_then_sends_each_once(
    client, django_capture_on_commit_callbacks
):
    held = [_held("acme", "3000.01", n) for n in range(3)]
    client.force_login(_reviewer(username="reviewer"))
    before = _count(
        "payments_review_decisions_total", rule="first_large_debit", decision="approved"
    )

    confirm = _bulk(client, "approve_selected", held)
    no_note = _bulk(client, "approve_selected", held, note="")
    with django_capture_on_commit_callbacks(execute=True):
        decided = _bulk(
            client, "approve_selected", held, note="all three checked with the merchant"
        )

    assert confirm.status_code == 200 and b"Approve 3" in confirm.content
    assert no_note.status_code == 200 and b"This field is required" in no_note.content
    assert decided.status_code == 302
    for payment in held:
        payment.refresh_from_db()
        assert (payment.review_status, _submit_commands(payment)) == ("approved", 1)
        audit = payment.events.get(kind="review")
        assert (audit.event_type, audit.caused_by) == ("approved", "review:reviewer")
        assert audit.payload["note"] == "all three checked with the merchant"
        assert audit.payload["rule"] == "first_large_debit"
    after = _count("payments_review_decisions_total", rule="first_large_debit", decision="approved")
    assert after - before == 3


def test_a_bulk_decision_across_rules_is_refused_and_decides_nothing(client):
    mixed = [_held("acme", "3000.01"), _held("acme", "2000.00")]
    client.force_login(_reviewer())

    answer = _bulk(client, "reject_selected", mixed, note="no")

    assert answer.status_code == 302
    messages = [str(m) for m in answer.wsgi_request._messages]
    assert any("held by one rule" in m for m in messages), messages
    assert {p.review_status for p in Payment.objects.filter(pk__in=[p.pk for p in mixed])} == {
        "held"
    }


def test_a_bulk_rejection_reports_a_payment_the_merchant_canceled_meanwhile(client):
    first, second = _held("acme", "3000.01", 1), _held("acme", "3000.01", 2)
    client.force_login(_reviewer())
    confirm = _bulk(client, "reject_selected", [first, second])
    payment_cancel(payment_id=second.id)

    decided = _bulk(client, "reject_selected", [first, second], note="fraud ring")

    assert confirm.status_code == 200
    messages = [str(m) for m in decided.wsgi_request._messages]
    assert "1 payment(s) rejected." in messages
    assert any(f"Not rejected, {second.pk}" in m for m in messages), messages
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.state, first.review_status) == ("canceled", "rejected")
    assert (second.state, second.review_status) == ("canceled", "held")


def test_a_forged_bulk_post_is_refused_and_another_payments_id_is_ignored(client):
    held = _held("acme", "3000.01")
    sent = payment_create(merchant_id="other", amount=Decimal("5.00"), source_token="tok_q_other1")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(_reviewer())
    client.force_login(_reviewer())

    forged = _bulk(strict, "approve_selected", [held], note="ok")
    smuggled = _bulk(client, "reject_selected", [sent], note="not held")
    hostile = client.post(
        QUEUE,
        {"action": "approve_selected", "_selected_action": ["not-a-uuid\x00", "9" * 10_000]},
    )

    assert forged.status_code == 403
    assert smuggled.status_code == 302
    assert hostile.status_code == 302
    messages = [str(m) for m in hostile.wsgi_request._messages]
    assert "The selection holds something that is not a payment id." in messages
    held.refresh_from_db()
    sent.refresh_from_db()
    assert (held.review_status, sent.review_status, sent.state) == ("held", "", "pending")


def test_held_approved_and_rejected_are_counted_per_rule(django_capture_on_commit_callbacks):
    reviewer = _reviewer()
    labels = {"rule": "round_amount"}
    held_before = _count("payments_review_holds_total", **labels)
    rejected_before = _count("payments_review_decisions_total", decision="rejected", **labels)

    with django_capture_on_commit_callbacks(execute=True):
        held = _held("acme", "2000.00")
        payment_review_reject(payment_id=held.id, user=reviewer, note="no")

    assert _count("payments_review_holds_total", **labels) - held_before == 1
    rejected = _count("payments_review_decisions_total", decision="rejected", **labels)
    assert rejected - rejected_before == 1


@pytest.mark.django_db(transaction=True)
def test_two_reviewers_and_the_merchants_cancel_racing_have_one_winner():
    """Two reviewers deciding the same payment (one approving, one rejecting), a second approval
    and the merchant's cancel, on PostgreSQL in threads: at most one decision stands, and a
    payment is sent only when approved."""
    first, second = _reviewer(username="first"), _reviewer(username="second")
    for n in range(6):
        held = _held("acme", "3000.01", n)

        approve, approve_again, reject, cancel = race(
            lambda p=held: payment_review_approve(payment_id=p.id, user=first, note="ok"),
            lambda p=held: payment_review_approve(payment_id=p.id, user=second, note="ok"),
            lambda p=held: payment_review_reject(payment_id=p.id, user=second, note="no"),
            lambda p=held: payment_cancel(payment_id=p.id),
        )

        decided = [r for r in (approve, approve_again, reject) if isinstance(r, Payment)]
        assert len(decided) <= 1, (approve, approve_again, reject, cancel)
        held.refresh_from_db()
        audits = held.events.filter(kind="review").count()
        assert audits == len(decided)
        if held.review_status == "approved":
            assert _submit_commands(held) == 1
        else:
            assert held.state == PaymentState.CANCELED
            assert _submit_commands(held) == 0


@pytest.fixture
def alerts():
    from payments.signals import alert_cleared, alert_raised

    calls = []

    def raised(sender, **kwargs):
        calls.append(("raised", kwargs["key"], kwargs))

    def cleared(sender, **kwargs):
        calls.append(("cleared", kwargs["key"], kwargs))

    alert_raised.connect(raised, weak=False)
    alert_cleared.connect(cleared, weak=False)
    yield calls
    alert_raised.disconnect(raised)
    alert_cleared.disconnect(cleared)


def test_a_hold_older_than_the_setting_alerts_until_it_is_decided(
    alerts, module_settings, django_capture_on_commit_callbacks
):
    from datetime import timedelta

    from django.utils import timezone

    from payments.tasks import review_holds_check

    module_settings.REVIEW_HOLD_ALERT_HOURS = 4
    old, fresh, canceled = (_held("acme", "3000.01", n) for n in range(3))
    payment_cancel(payment_id=canceled.id)
    Payment.objects.filter(pk__in=[old.pk, canceled.pk]).update(
        created_at=timezone.now() - timedelta(hours=5)
    )
    key = f"payments.review_hold_overdue:{old.id}"

    overdue = review_holds_check()
    with django_capture_on_commit_callbacks(execute=True):
        payment_review_approve(payment_id=old.id, user=_reviewer(), note="checked")
    after = review_holds_check()

    assert (overdue, after) == (1, 0)
    [(kind, raised_key, raised)] = [c for c in alerts if c[0] == "raised"]
    assert (raised_key, raised["severity"]) == (key, "medium")
    assert "first_large_debit" in raised["summary"] and "over 4 hours" in raised["summary"]
    assert ("cleared", key) in [(c[0], c[1]) for c in alerts]
    assert fresh.id not in [c[2].get("payment_id") for c in alerts]


@pytest.mark.parametrize("hours", [0, -1, 24 * 31, "24", True])
def test_a_bad_alert_age_is_refused_naming_the_setting(module_settings, hours):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    module_settings.REVIEW_HOLD_ALERT_HOURS = hours

    with pytest.raises(SystemCheckError) as refused:
        call_command("check")

    assert "REVIEW_HOLD_ALERT_HOURS" in str(refused.value)
