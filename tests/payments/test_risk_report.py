"""``manage.py risk_report``: per merchant and rule, checked, held, approved, rejected; returns by
category against NACHA's thresholds; limit changes; as CSV or JSON lines; bad options are a usage
error naming the option."""

import csv
import io
import json
from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from payments.exposure_limits import Limits
from payments.models import MerchantReturnDay, Payment
from payments.services import payment_create
from payments.services.limits import exposure_limit_set
from payments.services.review import payment_review_approve, payment_review_reject
from tests.factories import PaymentFactory, UserFactory

pytestmark = pytest.mark.django_db

OFF = {"enabled": False}


@pytest.fixture
def year(module_settings):
    """acme: four debits, three of them held by first_large_debit (one approved, one rejected,
    one still held); returns over the year; one limit change. other: a debit, nothing held."""
    module_settings.FRAUD_RULES = {
        "new_destination": OFF,
        "velocity": OFF,
        "first_large_debit": {"amount": "100.00"},
    }
    reviewer = UserFactory(is_staff=True, username="reviewer")
    reviewer.user_permissions.add(Permission.objects.get(codename="review_payment"))
    reviewer = type(reviewer).objects.get(pk=reviewer.pk)
    held = [
        payment_create(merchant_id="acme", amount=Decimal("500.00"), source_token=f"tok_rr_{n}_x")
        for n in range(3)
    ]
    payment_create(merchant_id="acme", amount=Decimal("5.00"), source_token="tok_rr_small_1")
    payment_create(merchant_id="other", amount=Decimal("5.00"), source_token="tok_rr_other_1")
    payment_review_approve(payment_id=held[0].id, user=reviewer, note="known")
    payment_review_reject(payment_id=held[1].id, user=reviewer, note="fraud")
    today = timezone.now().date()
    MerchantReturnDay.objects.create(
        merchant_id="acme",
        day=today,
        debits=1000,
        returns=40,
        unauthorized_returns=6,
        administrative_returns=10,
    )
    # Outside the period: not counted.
    MerchantReturnDay.objects.create(merchant_id="acme", day=today - timedelta(days=400), debits=5)
    admin = UserFactory(is_superuser=True, username="risk-admin")
    exposure_limit_set(
        merchant_id="acme",
        direction="debit",
        currency="USD",
        limits=Limits(daily=Decimal("1000.00")),
        user=admin,
        note="annual review",
    )
    return today


def _report(*args) -> str:
    out = io.StringIO()
    call_command("risk_report", *args, stdout=out)
    return out.getvalue()


def _period(today: date) -> list[str]:
    return ["--from", str(today - timedelta(days=30)), "--to", str(today)]


def test_the_json_lines_give_each_merchant_its_rules_returns_and_limit_changes(year):
    records = [
        json.loads(line)
        for line in _report(*_period(year), "--format", "jsonl").split("\n")
        if line
    ]

    rules = {(r["merchant_id"], r["rule"]): r for r in records if r["record"] == "rule"}
    assert rules[("acme", "first_large_debit")] == {
        "record": "rule",
        "merchant_id": "acme",
        "rule": "first_large_debit",
        "checked": 4,
        "held": 3,
        "approved": 1,
        "rejected": 1,
        "still_held": 1,
    }
    assert rules[("acme", "exposure_limit")]["held"] == 0
    assert rules[("other", "first_large_debit")]["checked"] == 1
    returns = {r["category"]: r for r in records if r["record"] == "returns"}
    assert returns["unauthorized"]["rate_percent"] == "0.60"
    assert returns["unauthorized"]["over_threshold"] is True
    assert returns["administrative"]["rate_percent"] == "1.00"
    assert returns["administrative"]["over_threshold"] is False
    assert (returns["overall"]["debits"], returns["overall"]["threshold_percent"]) == (1000, "15.0")
    [change] = [r for r in records if r["record"] == "limit_change"]
    assert (change["changed_by"], change["note"]) == ("risk-admin", "annual review")
    assert change["new"]["daily"] == "1000.00"


def test_the_csv_has_one_header_and_a_record_column(year):
    rows = list(csv.DictReader(io.StringIO(_report(*_period(year)))))

    assert {row["record"] for row in rows} == {"rule", "returns", "limit_change"}
    large = next(r for r in rows if r["merchant_id"] == "acme" and r["rule"] == "first_large_debit")
    assert (large["held"], large["approved"], large["rejected"]) == ("3", "1", "1")
    change = next(r for r in rows if r["record"] == "limit_change")
    assert json.loads(change["new"])["daily"] == "1000.00"


def test_a_period_before_anything_happened_is_empty(year):
    out = _report("--from", "2020-01-01", "--to", "2020-12-31", "--format", "jsonl")

    assert out == ""


@pytest.mark.parametrize(
    ("args", "names"),
    [
        ([], "--from"),
        (["--from", "2026-01-01"], "--to"),
        (["--from", "2026-13-01", "--to", "2026-12-31"], "--from"),
        (["--from", "2026-01-01", "--to", "yesterday"], "--to"),
        (["--from", "２０２６-01-01", "--to", "2026-12-31"], "--from"),
        (["--from", "2026-01-01\x00", "--to", "2026-12-31"], "--from"),
        (["--from", "9" * 5000, "--to", "2026-12-31"], "--from"),
        (["--from", "2026-01-01", "--to", "2026-12-31", "--format", "xml"], "--format"),
        (["--from", "2026-12-31", "--to", "2026-01-01"], "--to"),
        (["--from", "2000-01-01", "--to", "2026-01-01"], "at most 3660 days"),
    ],
)
def test_a_bad_option_is_a_usage_error_naming_it(args, names):
    with pytest.raises(CommandError) as refused:
        call_command("risk_report", *args)

    assert names in str(refused.value)
    assert not Payment.objects.exists()


def test_a_hold_from_before_rules_were_named_counts_as_an_exposure_limit():
    PaymentFactory(merchant_id="acme", review_status="held", review_rule="")
    today = timezone.now().date()

    out = _report("--from", str(today), "--to", str(today), "--format", "jsonl")

    rule = next(json.loads(line) for line in out.splitlines() if '"exposure_limit"' in line)
    assert (rule["held"], rule["still_held"]) == (1, 1)


def test_a_note_a_spreadsheet_would_run_as_a_formula_is_quoted_in_the_csv(year):
    admin = UserFactory(is_superuser=True, username="=cmd|'/c calc'!A1")
    exposure_limit_set(
        merchant_id="acme",
        direction="credit",
        currency="USD",
        limits=Limits(daily=Decimal("50.00")),
        user=admin,
        note='=HYPERLINK("http://evil.example","x")',
    )

    rows = list(csv.DictReader(io.StringIO(_report(*_period(year)))))
    jsonl = _report(*_period(year), "--format", "jsonl")

    change = next(r for r in rows if r["record"] == "limit_change" and r["direction"] == "credit")
    assert change["note"] == '\'=HYPERLINK("http://evil.example","x")'
    assert change["changed_by"].startswith("'=cmd")
    assert '"note": "=HYPERLINK' in jsonl  # JSON lines keep the text as it was
