"""End to end through the sandbox processor: a settled debit comes back, the operator asks for
a dishonor, and the processor's answers (in its order, redelivered) move money once.

Real parts only: the sandbox over HTTP, signed callbacks to a live server's endpoint, the local
SQS server and the worker.
"""

from decimal import Decimal

import pytest

from callbacks.models import QueueMessage
from payments.models import LedgerEntry, MerchantReturnDay, Payment, PaymentState, ReturnDishonor
from payments.services import payment_create
from payments.services.dishonors import return_dishonor_request
from tests.callbacks.test_returns_end_to_end import _work_until
from tests.callbacks.test_returns_end_to_end import (
    sandbox_with_callbacks as sandbox_with_callbacks,  # noqa: F401 - the fixture
)
from tests.factories import UserFactory
from triage.models import DeadLetter

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("token", "kinds", "returns"),
    [
        ("tok_nsf_e2e_dh", {"credit", "reversal", "recredit"}, 0),
        (
            "tok_nsf_e2e_contestfirst",
            {"credit", "reversal", "recredit", "recredit_reversal"},
            1,
        ),
    ],
    ids=["dishonored", "contested-first"],
)
def test_a_dishonor_asked_for_and_answered_by_the_processor_moves_money_once(
    sqs_queues, sandbox_with_callbacks, token, kinds, returns
):
    sandbox_with_callbacks.plan = type(sandbox_with_callbacks.plan)(
        type(sandbox_with_callbacks.plan.config)(
            settle_after_seconds=0.05, return_after_seconds=0.3, p_duplicate_callback=1.0
        )
    )
    payment = payment_create(merchant_id="m-dh", amount=Decimal("25.50"), source_token=token)
    assert _work_until(lambda: Payment.objects.get(pk=payment.pk).state == PaymentState.RETURNED)

    result = return_dishonor_request(
        payment_id=payment.id, reason_code="R61", note="misrouted", user=UserFactory()
    )
    assert result.sent, result.error

    def answered() -> bool:
        dishonor = ReturnDishonor.objects.get(payment=payment)
        done = bool(dishonor.dishonored_event_id)
        if "recredit_reversal" in kinds:
            done = done and bool(dishonor.contested_event_id)
        return done and not QueueMessage.objects.exclude(status="done").exists()

    assert _work_until(answered)

    entries = dict(LedgerEntry.objects.filter(payment=payment).values_list("kind", "amount"))
    assert set(entries) == kinds
    assert sum(entries.values()) == (Decimal("25.50") if not returns else 0)
    assert MerchantReturnDay.objects.get(merchant_id="m-dh").returns == returns
    recorded = sorted(
        payment.events.filter(
            event_type__in=["return_dishonored", "dishonor_contested"], outcome="recorded"
        ).values_list("event_type", flat=True)
    )
    assert recorded == (
        ["dishonor_contested", "return_dishonored"] if returns else ["return_dishonored"]
    )
    # Every answer was delivered twice (SQS's deduplication dropped the repeats inside its
    # window; the dedup record catches any later one) and recorded once.
    delivered = [
        c["event_type"]
        for c in sandbox_with_callbacks.callbacks_delivered()
        if c["payment_id"] == str(payment.id) and c["event_type"] in recorded
    ]
    assert sorted(delivered) == sorted(recorded * 2)
    assert not DeadLetter.objects.exists()
