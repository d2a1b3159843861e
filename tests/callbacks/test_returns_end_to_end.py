"""End to end through the sandbox processor: a debit settles, comes back, and is reversed.

Real parts only: the sandbox over HTTP sends signed callbacks to the callback endpoint of a
live server, which publishes them to the local SQS server; the worker applies them.
"""

import time
from decimal import Decimal

import pytest
from django.core.management import call_command

from callbacks.models import QueueMessage
from payments.models import LedgerEntry, Payment, PaymentReturn, PaymentState
from payments.services import payment_create
from tests.callbacks.sandbox_support import sandbox_posting_callbacks
from tests.factories import grant
from triage.models import DeadLetter

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sandbox_with_callbacks(module_settings, live_server):
    with sandbox_posting_callbacks(
        module_settings, live_server, return_after_seconds=0.5
    ) as server:
        yield server


def _work_until(predicate, timeout: float = 30.0) -> bool:
    """Run the worker (relay included) until the predicate holds: callbacks arrive over time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        call_command(
            "run_sqs_worker", until_empty=True, wait_time=0, visibility_timeout=30, relay=True
        )
        if predicate():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize(
    ("token", "code", "category"),
    [
        ("tok_nsf_e2e_0001", "R01", "nsf"),
        ("tok_unauth_e2e_0001", "R10", "unauthorized"),
    ],
)
def test_a_settled_debit_returned_by_the_processor_is_reversed_and_the_balance_nets_out(
    sqs_queues, sandbox_with_callbacks, api_client, user, token, code, category
):
    kept = payment_create(merchant_id="m-e2e", amount=Decimal("80.00"), source_token="tok_ok_e2e_1")
    returned = payment_create(merchant_id="m-e2e", amount=Decimal("25.50"), source_token=token)

    def done() -> bool:
        states = dict(Payment.objects.values_list("id", "state"))
        return states[kept.id] == PaymentState.CONFIRMED and states[returned.id] == "returned"

    assert _work_until(done), dict(Payment.objects.values_list("id", "state"))

    # Settled first, returned afterwards: both applied, in that order (the "submitted"
    # callback is stale: our 201 moved the payment already).
    applied = list(
        returned.events.filter(kind="processor_event", outcome="applied").values_list(
            "event_type", "to_state"
        )
    )
    assert applied == [("settled", "confirmed"), ("returned", "returned")]
    entries = dict(LedgerEntry.objects.filter(payment=returned).values_list("kind", "amount"))
    assert entries == {"credit": Decimal("25.50"), "reversal": Decimal("-25.50")}
    record = PaymentReturn.objects.get(payment=returned)
    assert (record.reason_code, record.category, record.after_settlement) == (code, category, True)
    assert not record.flags
    # Nothing went to a human, and the processor charged each payment once.
    assert not DeadLetter.objects.exists()
    assert not QueueMessage.objects.exclude(status="done").exists()
    assert sandbox_with_callbacks.stats()["charges_by_payment"] == {
        str(kept.id): 1,
        str(returned.id): 1,
    }

    grant(user, "m-e2e")
    balance = api_client.get("/api/merchants/m-e2e/balance/").json()

    assert balance["balances"] == [
        {
            "currency": "USD",
            "credits": "105.50",
            "reversals": "25.50",
            "recredits": "0.00",
            "net": "80.00",
            "confirmed_count": 1,
            "returned_count": 1,
            "balance": "80.00",
            "entries": 3,
            "confirmed_total": "80.00",
            "returned_total": "25.50",
            "pending": "80.00",
            "posted": "80.00",
            # Both settled just now: inside the return reserve, and so is the return.
            "available": "0.00",
            "money_out": "0.00",
        }
    ]
