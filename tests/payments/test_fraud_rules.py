"""Fraud monitoring rules at create: a payout or refund to a new account, a day far above the
merchant's baseline, a first large debit from an account, and a host's own rule by dotted path,
each holding the payment for a person with the figures that tripped it and the merchant's
baseline; bad settings refused by ``manage.py check`` naming the problem; racing creates judged
one after the other under the merchant's lock."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.utils import timezone

from payments.fraud_rules import (
    Entry,
    FirstLargeDebit,
    NewDestination,
    Velocity,
    parse_fraud_rules,
)
from payments.models import OutboxMessage, Payment, PaymentState
from payments.services import payment_apply_event, payment_create
from payments.services.fraud import fraud_rules, hold_decide
from payments.services.payouts import payout_create
from payments.services.refunds import refund_create
from tests.factories import PaymentFactory, grant, processor_event
from tests.waiting import race

pytestmark = pytest.mark.django_db

TOKEN = "tok_fraud_acct_0001"
OFF = {"enabled": False}


@pytest.fixture
def rules_on(module_settings):
    """Every built-in rule on with its defaults (the app's own default)."""
    module_settings.FRAUD_RULES = None
    module_settings.AVAILABLE_AFTER_BANKING_DAYS = 0


def _rules(module_settings, **rules):
    module_settings.FRAUD_RULES = {
        "new_destination": OFF,
        "velocity": OFF,
        "first_large_debit": OFF,
        **rules,
    }
    module_settings.AVAILABLE_AFTER_BANKING_DAYS = 0


def _aged(payment: Payment, days: int) -> Payment:
    Payment.objects.filter(pk=payment.pk).update(created_at=timezone.now() - timedelta(days=days))
    return payment


def _collected(merchant: str, amount: str, token: str = "tok_fraud_source_01") -> Payment:
    debit = PaymentFactory(
        merchant_id=merchant,
        state=PaymentState.SUBMITTED,
        amount=Decimal(amount),
        source_token=token,
    )
    payment_apply_event(event=processor_event(debit, "settled"))
    return debit


def _debit(merchant: str, amount: str, token: str = TOKEN) -> Payment:
    return payment_create(merchant_id=merchant, amount=Decimal(amount), source_token=token)


def _submit_commands(payment: Payment) -> int:
    return OutboxMessage.objects.filter(group_id=str(payment.id), kind="submit_payment").count()


# --- the setting ---------------------------------------------------------------------------------


def test_every_built_in_rule_is_on_by_default_with_a_conservative_threshold():
    rules = {rule.name: rule for rule in parse_fraud_rules(None)}

    assert set(rules) == {"new_destination", "velocity", "first_large_debit"}
    assert rules["new_destination"].days == 7
    assert (rules["velocity"].multiple, rules["velocity"].floor) == (
        Decimal("5"),
        Decimal("25000.00"),
    )
    assert rules["first_large_debit"].amount == Decimal("10000.00")


def test_a_host_turns_a_rule_off_or_changes_one_option_keeping_the_others():
    rules = parse_fraud_rules({"velocity": {"floor": "500"}, "first_large_debit": OFF})

    velocity = next(rule for rule in rules if rule.name == "velocity")
    assert [rule.name for rule in rules] == ["new_destination", "velocity"]
    assert (velocity.multiple, velocity.floor) == (Decimal("5"), Decimal("500.00"))


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([], "must be None or a dict"),
        ({"velocity": "off"}, "must be a dict of options"),
        ({"velocity": {"enabled": "no"}}, "enabled: true or false"),
        ({"velocity": {"multiple": "0.5"}}, "multiple: must be a number from 1 to 1000"),
        ({"velocity": {"multiple": 2.5}}, "multiple: give a number"),
        ({"velocity": {"multiple": "NaN"}}, "multiple: must be a number"),
        ({"velocity": {"multiple": "５"}}, "multiple: must be a number"),
        ({"velocity": {"floor": "-1"}}, "floor: must be greater than zero"),
        ({"velocity": {"floor": "1e400"}}, "floor: must be at most"),
        ({"velocity": {"flor": "1"}}, "unknown option(s) ['flor']"),
        ({"new_destination": {"days": 0}}, "days: must be a whole number from 1 to 365"),
        ({"new_destination": {"days": True}}, "days: must be a whole number"),
        ({"new_destination": {"purposes": ["collection"]}}, "purposes: a list of 'payout'"),
        ({"first_large_debit": {"amount": "x\x00"}}, "amount: 'x\\x00' is not a decimal"),
        ({"mine": {}}, "no built-in rule of that name"),
        ({"Mine\ud800": {"path": "x.Y"}}, "a rule name is lower-case letters"),
        ({"m" * 49: {}}, "a rule name is 1-48 characters"),
        ({"velocity": {"path": "x.Y"}}, "a built-in rule takes no 'path'"),
        ({"mine": {"path": 7}}, "path: a dotted path"),
        ({"mine": {"path": "nowhere.at_all.Rule"}}, "cannot be imported"),
        ({"mine": {"path": "payments.models.Payment"}}, "is not a subclass of"),
        ({"mine": {"path": "tests.payments.fraud_example.Misnamed"}}, "names its rule"),
        (
            {"round_amount": {"path": "tests.payments.fraud_example.RoundAmount", "x": 1}},
            "unknown option(s) ['x']",
        ),
    ],
)
def test_a_bad_setting_is_refused_naming_the_problem(value, problem):
    with pytest.raises(ValueError) as refused:
        parse_fraud_rules(value)

    assert problem in str(refused.value)


def test_manage_py_check_refuses_a_bad_rule_setting_naming_it(module_settings):
    module_settings.FRAUD_RULES = {"velocity": {"multiple": "0"}}

    with pytest.raises(SystemCheckError) as refused:
        call_command("check")

    assert "FRAUD_RULES" in str(refused.value)
    assert "multiple: must be a number from 1 to 1000" in str(refused.value)


def test_a_changed_setting_is_seen_at_once(module_settings):
    module_settings.FRAUD_RULES = {"velocity": OFF}
    first = [rule.name for rule in fraud_rules()]
    module_settings.FRAUD_RULES = {"velocity": {"floor": "1.00"}}

    assert "velocity" not in first
    assert "velocity" in [rule.name for rule in fraud_rules()]


# --- new destination -----------------------------------------------------------------------------


def test_a_payout_to_a_new_account_is_held_with_the_rule_and_its_figures(rules_on):
    _aged(_collected("acme", "500.00"), 40)

    payout = payout_create(merchant_id="acme", amount=Decimal("60.00"), destination_token=TOKEN)

    assert (payout.state, payout.review_status, payout.review_rule) == (
        "pending",
        "held",
        "new_destination",
    )
    assert _submit_commands(payout) == 0
    [flag] = payout.review_evidence["flags"]
    assert flag["figures"] == {"days": 7, "account_first_seen": None, "amount": "60.00"}
    assert payout.review_evidence["baseline"]["account_first_seen"] is None
    assert payout.review_reason.startswith("new_destination: payout to an account first seen now")
    created = payout.events.get(kind="created")
    assert created.payload["review_rule"] == "new_destination"


def test_a_payout_to_an_account_used_for_weeks_is_sent(rules_on):
    _collected("acme", "500.00")
    _aged(PaymentFactory(merchant_id="acme", source_token=TOKEN, amount=Decimal("1.00")), 30)

    payout = payout_create(merchant_id="acme", amount=Decimal("60.00"), destination_token=TOKEN)

    assert (payout.review_status, _submit_commands(payout)) == ("", 1)


def test_another_merchants_use_of_the_account_does_not_make_it_known(rules_on):
    _collected("acme", "500.00")
    _aged(PaymentFactory(merchant_id="other", source_token=TOKEN), 30)

    payout = payout_create(merchant_id="acme", amount=Decimal("60.00"), destination_token=TOKEN)

    assert payout.review_rule == "new_destination"


def test_a_refund_of_this_weeks_debit_goes_back_unheld_by_default(rules_on):
    """A refund returns money to the account its debit drew from: not a new destination."""
    fresh = _collected("acme", "100.00", token="tok_fraud_fresh_01")

    refund = refund_create(payment_id=fresh.id, amount=Decimal("10.00"))

    assert (refund.review_status, _submit_commands(refund)) == ("", 1)


def test_with_refunds_named_a_refund_of_a_debit_made_this_week_is_held_and_an_older_ones_is_not(
    module_settings,
):
    module_settings.AVAILABLE_AFTER_BANKING_DAYS = 0
    _rules(module_settings, new_destination={"purposes": ["payout", "refund"]})
    fresh = _collected("acme", "100.00", token="tok_fraud_fresh_01")
    old = _aged(_collected("acme", "100.00", token="tok_fraud_old_0001"), 20)

    held = refund_create(payment_id=fresh.id, amount=Decimal("10.00"))
    sent = refund_create(payment_id=old.id, amount=Decimal("10.00"))

    assert (held.review_rule, sent.review_status) == ("new_destination", "")


def test_an_account_whose_details_changed_lately_is_new_again():
    rule = NewDestination()
    now = timezone.now()
    entry = Entry(
        merchant_id="acme",
        direction="credit",
        purpose="payout",
        amount=Decimal("60.00"),
        currency="USD",
        account_token=TOKEN,
        now=now,
        account_changed_at=now - timedelta(hours=1),
    )

    class Known:
        account_first_seen = now - timedelta(days=90)

    flag = rule.check(entry, Known())

    assert flag.rule == "new_destination"
    assert "whose details changed" in flag.summary
    assert flag.figures["account_changed_at"] == (now - timedelta(hours=1)).isoformat()


# --- velocity ------------------------------------------------------------------------------------


def test_a_day_far_above_the_merchants_baseline_is_held_with_the_baseline(module_settings):
    _rules(module_settings, velocity={"multiple": "5", "floor": "200.00"})
    for days in (5, 8, 12):  # 3000.00 over the trailing 30 banking days: a mean of 100.00
        _aged(PaymentFactory(merchant_id="acme", amount=Decimal("1000.00")), days)

    within = _debit("acme", "450.00")
    held = _debit("acme", "100.00")

    assert within.review_status == ""
    assert (held.review_status, held.review_rule) == ("held", "velocity")
    [flag] = held.review_evidence["flags"]
    assert flag["figures"]["today_with_this"] == "550.00"
    assert flag["figures"]["daily_mean"] == "100.00"
    assert flag["figures"]["threshold"] == "500.00"
    assert held.review_evidence["baseline"]["today_total"] == "450.00"
    assert held.review_evidence["baseline"]["baseline_banking_days"] == 30


def test_a_new_merchant_is_not_held_below_the_floor(module_settings):
    _rules(module_settings, velocity={"floor": "1000.00"})

    made = [_debit("newco", "90.00") for _ in range(11)]
    over = _debit("newco", "20.00")

    assert {p.review_status for p in made} == {""}
    assert over.review_rule == "velocity"


def test_failed_and_canceled_entries_do_not_count_towards_today(module_settings):
    _rules(module_settings, velocity={"floor": "100.00"})
    PaymentFactory(merchant_id="acme", amount=Decimal("90.00"), state=PaymentState.FAILED)
    PaymentFactory(merchant_id="acme", amount=Decimal("90.00"), state=PaymentState.CANCELED)

    assert _debit("acme", "100.00").review_status == ""


def test_credits_are_measured_against_credits_only(module_settings):
    _rules(module_settings, velocity={"floor": "100.00"})
    _collected("acme", "5000.00")

    payout = payout_create(merchant_id="acme", amount=Decimal("100.00"), destination_token=TOKEN)
    second = payout_create(merchant_id="acme", amount=Decimal("0.01"), destination_token=TOKEN)

    assert payout.review_status == ""  # the 5000.00 debit is not a credit
    assert second.review_rule == "velocity"


@pytest.mark.django_db(transaction=True)
def test_racing_creates_are_judged_one_after_the_other(module_settings):
    _rules(module_settings, velocity={"floor": "100.00"})

    results = race(*(lambda: _debit("acme", "20.00") for _ in range(12)))

    assert all(isinstance(r, Payment) for r in results), results
    sent = [r for r in results if r.review_status == ""]
    # 5 x 20.00 reach the floor; every later one finds them (and the held ones) counted.
    assert len(sent) == 5
    assert sum(p.amount for p in sent) == Decimal("100.00")
    assert Payment.objects.filter(merchant_id="acme", review_status="held").count() == 7


# --- first large debit ---------------------------------------------------------------------------


def test_the_first_large_debit_from_an_account_is_held_and_a_later_one_is_not(module_settings):
    _rules(module_settings, first_large_debit={"amount": "500.00"})

    small = _debit("acme", "500.00", token="tok_fraud_first_01")
    first = _debit("acme", "500.01", token="tok_fraud_first_02")
    later = _debit("acme", "900.00", token="tok_fraud_first_01")

    assert (small.review_status, later.review_status) == ("", "")
    assert first.review_rule == "first_large_debit"
    assert first.review_evidence["flags"][0]["figures"] == {
        "amount": "500.01",
        "threshold": "500.00",
    }


def test_a_failed_debit_does_not_make_the_account_known(module_settings):
    _rules(module_settings, first_large_debit={"amount": "500.00"})
    PaymentFactory(merchant_id="acme", source_token=TOKEN, state=PaymentState.FAILED)

    assert _debit("acme", "600.00").review_rule == "first_large_debit"


def test_the_built_in_rules_as_units():
    now = timezone.now()

    def entry(direction="debit", amount="100.00"):
        return Entry("acme", direction, "collection", Decimal(amount), "USD", TOKEN, now)

    class History:
        today_total = Decimal("0.00")
        daily_mean = Decimal("0.00")
        baseline_days = 30
        account_first_seen = None
        account_debits = 0

    assert FirstLargeDebit(amount="50").check(entry("credit"), History()) is None
    assert Velocity(floor="100").check(entry(amount="100.00"), History()) is None
    assert Velocity(floor="100").check(entry(amount="100.01"), History()).rule == "velocity"
    assert NewDestination().check(entry(), History()) is None  # a debit is not a destination


# --- a host's own rule, and one that fails ------------------------------------------------------


def test_a_host_rule_by_dotted_path_holds_what_it_flags(module_settings):
    _rules(
        module_settings,
        round_amount={"path": "tests.payments.fraud_example.RoundAmount", "amount": "1000"},
    )

    held = _debit("acme", "2000.00", token="tok_fraud_round_01")
    odd = _debit("acme", "2000.01", token="tok_fraud_round_02")

    assert (held.review_rule, odd.review_status) == ("round_amount", "")
    assert held.review_evidence["flags"][0]["figures"] == {
        "amount": "2000.00",
        "at_least": "1000.00",
    }


def test_a_rule_that_fails_holds_the_payment_for_a_person(module_settings):
    _rules(module_settings, broken={"path": "tests.payments.fraud_example.Broken"})

    held = _debit("acme", "10.00")

    assert (held.review_status, held.review_rule, _submit_commands(held)) == ("held", "broken", 0)
    assert held.review_evidence["flags"][0]["figures"] == {"error": "RuntimeError"}


def test_every_flag_is_kept_and_the_first_names_the_hold(module_settings):
    _rules(
        module_settings,
        velocity={"floor": "100.00"},
        first_large_debit={"amount": "100.00"},
    )

    held = _debit("acme", "150.00")

    assert held.review_rule == "velocity"
    assert [f["rule"] for f in held.review_evidence["flags"]] == ["velocity", "first_large_debit"]
    assert "velocity: " in held.review_reason and "; first_large_debit: " in held.review_reason


def test_an_exposure_limit_hold_and_a_rule_hold_are_stored_alike(module_settings):
    from payments.exposure_limits import Limits
    from payments.services.limits import exposure_limit_set
    from tests.factories import UserFactory

    _rules(module_settings, first_large_debit={"amount": "100.00"})
    module_settings.OVER_LIMIT = "hold"
    admin = UserFactory(is_superuser=True)
    limits = Limits(single=Decimal("100.00"))
    exposure_limit_set(
        merchant_id="acme", direction="debit", currency="USD", limits=limits, user=admin, note="x"
    )

    hold = hold_decide(
        merchant_id="acme",
        direction="debit",
        purpose="collection",
        currency="USD",
        amount=Decimal("150.00"),
        account_token=TOKEN,
    )

    assert [flag.rule for flag in hold.flags] == ["exposure_limit", "first_large_debit"]
    assert hold.reason.startswith("debit_single_limit: 150.00 USD would take merchant acme")
    assert hold.evidence["flags"][0]["figures"]["over"] == "50.00"


def test_the_api_answer_names_the_rule_that_held_the_payment(api_client, user, module_settings):
    _rules(module_settings, first_large_debit={"amount": "100.00"})
    grant(user, "acme")

    answer = api_client.post(
        "/api/payments/",
        {"merchant_id": "acme", "amount": "100.01", "source_token": TOKEN},
        format="json",
    )

    assert answer.status_code == 201, answer.json()
    [warning] = answer.json()["warnings"]
    assert warning["code"] == "held_for_review"
    assert warning["message"].startswith("first_large_debit: first debit from this account")


def test_the_history_read_finds_the_account_through_the_merchant_account_index(module_settings):
    """A merchant with thousands of payments months old: the read takes its recent ones and its
    payments with the account from two indexes, never every payment of the merchant."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _rules(module_settings, first_large_debit={"amount": "100.00"})
    Payment.objects.bulk_create(
        Payment(merchant_id="acme", amount=Decimal("1.00"), source_token=f"tok_old_{n:06d}")
        for n in range(3000)
    )
    Payment.objects.filter(merchant_id="acme").update(
        created_at=timezone.now() - timedelta(days=200)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE payments_payment")
    with CaptureQueriesContext(connection) as queries:
        _debit("acme", "500.00")  # above the amount: the rule reads the account's history
    [history] = [q["sql"] for q in queries.captured_queries if "MIN(" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {history}")
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "payment_merchant_account" in plan, plan
