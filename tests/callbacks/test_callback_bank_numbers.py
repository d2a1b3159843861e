"""The callback edge after a hostile run: bank numbers a processor put in free text, in members
beyond the contract, in their names and nested in them, are masked in every table and admin
page, whether the event was applied, conflicted or was dead-lettered for a person."""

import pytest

from payments.models import PaymentState
from tests.bank_number_scan import bank_number_scan
from tests.callbacks.test_endpoint import event_body, post_json
from tests.callbacks.worker_support import run_worker_until
from tests.factories import PaymentFactory
from triage.ingestion import dead_letters_ingest
from triage.models import DeadLetter

pytestmark = pytest.mark.django_db(transaction=True)

ACCOUNT = "4455667788991"
GROUPED = "7766-8056-8693"
FULL_WIDTH = "\uff13\uff13\uff14\uff14\uff15\uff15\uff16\uff16\uff17"


def hostile(payment, **fields) -> dict:
    return event_body(
        payment_id=str(payment.id),
        amount=f"{payment.amount:.2f}",
        message=f"paid from acct {ACCOUNT}, routing {GROUPED}",
        payer={"account": FULL_WIDTH, "notes": [f"acct {ACCOUNT}"]},
        **fields,
    )


def test_callbacks_applied_conflicting_and_dead_lettered_store_no_bank_number_whole(
    sqs_queues, fast_retries
):
    applied = PaymentFactory(state=PaymentState.SUBMITTED)
    pending = PaymentFactory(state=PaymentState.PENDING)
    first = hostile(applied, event_type="settled")
    conflicting = {**first, "amount": f"{applied.amount + 1:.2f}", "extra": GROUPED}
    invalid = hostile(pending, event_type="settled")  # settled for a pending payment: an error

    answers = [post_json(body).status_code for body in (first, conflicting, invalid)]
    run_worker_until(lambda: dead_letters_ingest() >= 1, timeout=30)

    assert answers == [202, 202, 202]
    applied.refresh_from_db()
    assert applied.state == PaymentState.CONFIRMED
    assert DeadLetter.objects.filter(payment_id=pending.id).exists()
    assert bank_number_scan([ACCOUNT, GROUPED, FULL_WIDTH]) == []
