"""An outage of N payments costs O(N) rows and SQS sends, however often the processor flaps.

Real local SQS, the sandbox processor over HTTP, PostgreSQL; the worker through its command,
the breaker's tick called as the worker's loop calls it. Between a release and the workers
taking its copies, the processor fails again: each copy still on the queue is parked again and
must be sent once more. A release that sent the whole backlog at once (at its per-second cap)
paid that for nearly every payment at every reopening: sends were N times the reopenings.

Run with ``-s`` to see the counts.
"""

import time

import pytest

from callbacks import sqs
from callbacks.handlers import processor_breaker_tick
from callbacks.models import HoldKind, ParkedMessage, PaymentHold, QueueMessage
from callbacks.services.republish import RELEASE_MARK, RELEASE_ROOM_FLOOR, RELEASE_TAKEN_WINDOW
from payments.models import BreakerState, CircuitBreaker, Payment, PaymentState
from payments.processor.breaker import PROCESSOR
from tests.callbacks.worker_support import run_worker, send_body
from tests.factories import PaymentFactory, open_breaker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.scale]

PAYMENTS = 300
REOPENINGS = 8
TAKEN_BEFORE_EACH_REOPENING = 10  # what the workers submit between a release and the failure


def close_the_breaker() -> None:
    CircuitBreaker.objects.filter(name=PROCESSOR).update(
        state=BreakerState.CLOSED, opened_at=None, open_until=None
    )


def test_a_flapping_outage_of_hundreds_of_payments_costs_rows_and_sends_per_payment(
    sqs_queues, sandbox, module_settings
):
    # The pace is not what holds the release back here: 1,000 a second would send the whole
    # backlog at every close.
    module_settings.OUTAGE_RELEASE_PER_SECOND = 1000
    payments = PaymentFactory.create_batch(PAYMENTS, state=PaymentState.PENDING)
    for payment in payments:
        body = {"kind": "submit_payment", "payment_id": str(payment.id)}
        send_body(sqs_queues.client, sqs_queues.url, payment.id, body)
    open_breaker()
    run_worker()
    assert PaymentHold.objects.filter(kind=HoldKind.OUTAGE).count() == PAYMENTS

    sent: list[str] = []
    original_send = sqs.send_message_now

    def counting_send(**kwargs):
        if RELEASE_MARK in kwargs["deduplication_id"]:
            sent.append(kwargs["deduplication_id"])
        return original_send(**kwargs)

    began = time.monotonic()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sqs, "send_message_now", counting_send)
        for _ in range(REOPENINGS):
            close_the_breaker()
            processor_breaker_tick()  # calls may flow: the release sends what can go
            run_worker(max_messages=TAKEN_BEFORE_EACH_REOPENING, until_empty=False)
            open_breaker()  # failing again: what is still on the queue is parked again
            run_worker()
            # The workers' take is counted over a window; the next close comes after it.
            time.sleep(RELEASE_TAKEN_WINDOW.total_seconds() + 0.05)
        close_the_breaker()
        run_worker()  # until every hold is released and every submission made
    lasted = time.monotonic() - began

    assert Payment.objects.filter(state=PaymentState.SUBMITTED).count() == PAYMENTS
    assert sandbox.stats()["charges_by_payment"] == {str(p.id): 1 for p in payments}
    assert not PaymentHold.objects.filter(released_at__isnull=True).exists()
    holds = PaymentHold.objects.filter(kind=HoldKind.OUTAGE).count()
    rows = ParkedMessage.objects.count()
    parked_again = QueueMessage.objects.filter(
        deduplication_id__contains=RELEASE_MARK, status="parked"
    ).count()
    print(
        f"\n{PAYMENTS} payments, {REOPENINGS} reopenings ({lasted:.1f} s): {holds} outage holds, "
        f"{rows} parked rows, {len(sent)} release copies sent, {parked_again} parked again"
    )
    # One hold and one parked row per payment, whatever the reopenings.
    assert holds == PAYMENTS and rows == PAYMENTS
    # Each payment's copy sent once, and each reopening parks (to send again) no more than the
    # release's room: its floor and what the workers took since the release before.
    per_reopening = RELEASE_ROOM_FLOOR + TAKEN_BEFORE_EACH_REOPENING
    assert parked_again <= REOPENINGS * per_reopening
    assert len(sent) == PAYMENTS + parked_again
    assert len(sent) < 2 * PAYMENTS
