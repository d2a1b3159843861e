"""A refund end to end through the sandbox processor: the debit settles, the refund is sent as
an ACH credit once per key, its callback (stating ``direction: credit``) settles it, and the
ledger posts it; a refund to a closed account comes back and puts the money back once.

Real parts only: the sandbox over HTTP sends signed callbacks to the callback endpoint of a
live server, which publishes them to the local SQS server; the worker applies them.
"""

from decimal import Decimal

import pytest
import requests

from payments.models import LedgerEntry, LedgerEntryKind, LedgerEntryStatus, Payment, PaymentState
from tests.callbacks.test_noc_and_reinitiation_end_to_end import sandbox_with_callbacks  # noqa: F401
from tests.callbacks.test_returns_end_to_end import _work_until
from tests.factories import grant

pytestmark = pytest.mark.django_db(transaction=True)


def _state(payment_id) -> str:
    return Payment.objects.get(pk=payment_id).state


def _settled_debit(api_client, token: str, amount: str = "50.00") -> str:
    created = api_client.post(
        "/api/payments/",
        {"merchant_id": "m-refund", "amount": amount, "source_token": token},
        format="json",
    )
    assert created.status_code == 201, created.json()
    payment_id = created.json()["id"]
    assert _work_until(lambda: _state(payment_id) == PaymentState.CONFIRMED)
    return payment_id


def test_a_refund_is_sent_once_and_settles_into_a_posted_entry(
    sqs_queues,
    sandbox_with_callbacks,  # noqa: F811
    api_client,
    user,
):
    grant(user, "m-refund")
    debit_id = _settled_debit(api_client, "tok_ok_refund_e2e_1")

    made = api_client.post(
        f"/api/payments/{debit_id}/refunds/",
        {"amount": "20.00", "reason": "partial"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="refund-e2e-1",
    )
    assert made.status_code == 201, made.json()
    refund_id = made.json()["id"]
    assert _work_until(lambda: _state(refund_id) == PaymentState.CONFIRMED)

    entry = LedgerEntry.objects.get(payment_id=refund_id, kind=LedgerEntryKind.REFUND)
    assert (entry.amount, entry.status) == (Decimal("-20.00"), LedgerEntryStatus.POSTED)
    stats = requests.get(f"{sandbox_with_callbacks.base_url}/_sandbox/stats", timeout=5).json()
    assert stats["credits_sent_by_payment"] == {refund_id: 1}
    assert set(stats["credits_sent"].values()) == {1}
    assert api_client.get(f"/api/payments/{debit_id}/").json()["refundable_amount"] == "30.00"


def test_a_refund_to_a_closed_account_comes_back_and_the_money_is_booked_back_once(
    sqs_queues,
    sandbox_with_callbacks,  # noqa: F811
    api_client,
    user,
):
    grant(user, "m-refund")
    debit_id = _settled_debit(api_client, "tok_ok_refund_R03_e2e")

    made = api_client.post(f"/api/payments/{debit_id}/refunds/", {"amount": "50.00"}, format="json")
    assert made.status_code == 201, made.json()
    refund_id = made.json()["id"]
    assert _work_until(lambda: _state(refund_id) == PaymentState.RETURNED)

    kinds = dict(LedgerEntry.objects.filter(payment_id=refund_id).values_list("kind", "amount"))
    assert kinds == {
        LedgerEntryKind.REFUND: Decimal("-50.00"),
        LedgerEntryKind.REFUND_RETURN: Decimal("50.00"),
    }
    assert _state(debit_id) == PaymentState.CONFIRMED  # the debit itself stands
    assert api_client.get(f"/api/payments/{debit_id}/").json()["refundable_amount"] == "50.00"
