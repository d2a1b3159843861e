"""The creates on SQLite (the one-machine quick start and the demo): there the reads a create
makes are the ORM's own (``payments.kernel.reads``, the fraud rules' history), run one by one,
and its rows are saved one by one. A debit, a WEB debit, a refund and a payout go through the
API with an Idempotency-Key, each check refusing or holding as on PostgreSQL."""

import pytest

from tests.sqlite_quick_start import sqlite_script_answers

SCRIPT = """
import json, uuid
from decimal import Decimal

import django
django.setup()
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test.utils import override_settings

from payments.models import AccountBlock, AccountBlockScope, ExposureLimit, Payment
from payments.signals import outbox_committed
from tests import payment_life
from tests.factories import account_validated

assert connection.vendor == "sqlite", connection.vendor
call_command("migrate", verbosity=0)
# The queue is not part of this: the submit commands stay in the outbox for the relay.
outbox_committed.disconnect(dispatch_uid="callbacks.publish_committed_outbox")
payments = {
    **settings.PAYMENTS,
    "AVAILABLE_AFTER_BANKING_DAYS": 0,
    "FRAUD_RULES": {"velocity": {"enabled": False}, "first_large_debit": {"amount": "1000.00"}},
}
answers = {}


def post(client, name, path, body, key=None):
    response = client.post(
        path, json.dumps(body), content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=key or uuid.uuid4().hex,
    )
    data = response.json()
    answers[name] = {
        "status": response.status_code,
        "code": data.get("error", {}).get("code"),
        "review_status": data.get("review_status"),
        "warnings": [warning["code"] for warning in data.get("warnings", [])],
        "replayed": response.get("Idempotent-Replayed"),
        "id": data.get("id"),
    }


with override_settings(PAYMENTS=payments, ALLOWED_HOSTS=["testserver"]):
    client = payment_life.api_client_for()
    merchant, source = payment_life.MERCHANT, payment_life.SOURCE_TOKEN
    debit_id = payment_life.collected_debit("500.00")
    payment_life.accounts_known_for_weeks()
    body = {"merchant_id": merchant, "amount": "10.00", "source_token": source}
    post(client, "debit", "/api/payments/", body, key="k-debit")
    post(client, "debit_again", "/api/payments/", body, key="k-debit")
    post(client, "web_unvalidated", "/api/payments/", {**body, "sec_code": "WEB"})
    account_validated(source, merchant)
    post(client, "web", "/api/payments/", {**body, "sec_code": "WEB"})
    # The first large debit from an account: the fraud rules read the merchant's history.
    post(client, "first_large", "/api/payments/", {
        **body, "amount": "5000.00", "source_token": "tok_sqlite_new_0001"
    })
    post(client, "large_known", "/api/payments/", {**body, "amount": "5000.00"})
    post(client, "refund", f"/api/payments/{debit_id}/refunds/", {"amount": "5.00"})
    post(client, "refund_over", f"/api/payments/{debit_id}/refunds/", {"amount": "999.00"})
    post(client, "payout", "/api/payouts/", {
        "merchant_id": merchant, "amount": "5.00",
        "destination_token": payment_life.DESTINATION_TOKEN,
    })
    post(client, "payout_new_account", "/api/payouts/", {
        "merchant_id": merchant, "amount": "5.00", "destination_token": "tok_sqlite_new_0002",
    })
    # No day totals on SQLite: the payout's check sums the ledger, as the balances do.
    post(client, "payout_over", "/api/payouts/", {
        "merchant_id": merchant, "amount": "500.00",
        "destination_token": payment_life.DESTINATION_TOKEN,
    })
    ExposureLimit.objects.create(
        merchant_id=merchant, direction="debit", currency="USD", daily_limit=Decimal("20.00")
    )
    post(client, "over_limit", "/api/payments/", body)
    ExposureLimit.objects.all().delete()
    AccountBlock.objects.create(
        merchant_id=merchant, account_token=source, scope=AccountBlockScope.MERCHANT,
        reason="R10", return_code="R10",
    )
    post(client, "blocked", "/api/payments/", body)
for answer in answers.values():
    if answer["id"]:
        answer["review_status"] = Payment.objects.get(pk=answer["id"]).review_status
answers["debits"] = Payment.objects.filter(merchant_id=merchant, purpose="collection").count()
print(json.dumps(answers))
"""


@pytest.mark.subprocess
def test_the_creates_on_sqlite_check_hold_refuse_and_replay_as_on_postgresql(tmp_path):
    answers = sqlite_script_answers(SCRIPT, tmp_path)
    shown = {name: (a["status"], a["code"]) for name, a in answers.items() if name != "debits"}
    assert shown == {
        "debit": (201, None),
        "debit_again": (201, None),
        "web_unvalidated": (409, "account_not_validated"),
        "web": (201, None),
        "first_large": (201, None),
        "large_known": (201, None),
        "refund": (201, None),
        "refund_over": (409, "refund_exceeds_refundable"),
        "payout": (201, None),
        "payout_new_account": (201, None),
        "payout_over": (409, "insufficient_available_balance"),
        "over_limit": (409, "exposure_limit_exceeded"),
        "blocked": (409, "account_blocked"),
    }
    assert answers["debit_again"]["replayed"] == "true"
    assert answers["debit_again"]["id"] == answers["debit"]["id"]
    assert answers["first_large"]["warnings"] == ["held_for_review"]
    assert answers["payout_new_account"]["review_status"] == "held"
    assert answers["first_large"]["review_status"] == "held"
    assert answers["payout"]["warnings"] == answers["large_known"]["warnings"] == []
    assert answers["debit"]["warnings"] == []
    assert answers["payout"]["review_status"] == answers["large_known"]["review_status"] == ""
    # The two made before (collected, weeks old), the debit, the WEB debit, the large ones.
    assert answers["debits"] == 6
