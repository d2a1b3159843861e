"""Histories the invariant checker is tested on: a clean run in the database, built through the
product's own services, and the helpers the tests corrupt it with."""

import itertools
import uuid
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal

from django.test import TestCase
from django.utils import timezone

from callbacks.models import (
    ParkedMessage,
    PaymentHold,
    ProcessingError,
    QueueMessage,
    QueueMessageStatus,
)
from chaos.invariants import check_invariants
from payments.models import LedgerEntry, Payment
from payments.services import payment_apply_event, payment_cancel, payment_create
from payments.services.payouts import payout_create
from payments.services.refunds import refund_create
from tests.factories import processor_event
from tests.history import history_rewritten
from triage.models import DeadLetter, DeadLetterSource

_ACCOUNTS = itertools.count(1)


def new_payment(merchant: str = "m-1", amount: str = "10.00") -> Payment:
    # An account of its own each: an unauthorized return blocks its account's next debits.
    token = f"tok_history_{next(_ACCOUNTS):06d}"
    return payment_create(merchant_id=merchant, amount=Decimal(amount), source_token=token)


def deliver(history: dict, payment: Payment, event_type: str, **overrides) -> str:
    """Apply one processor event, as the worker would, and record it as delivered."""
    event = processor_event(payment, event_type, **overrides)
    payment_apply_event(event=event, caused_by="test")
    history["sent"].append(
        {
            "payment_id": str(payment.id),
            "event_type": event_type,
            "processor_event_id": event.processor_event_id,
            "amount": f"{payment.amount:.2f}",
            "timestamp": event.timestamp.isoformat(),
        }
    )
    return event.processor_event_id


def redeliver(history: dict, payment: Payment, event_type: str, event_id: str, **overrides):
    """The processor delivers an event again, with the same id: dropped as a duplicate."""
    payment_apply_event(
        event=processor_event(payment, event_type, processor_event_id=event_id, **overrides),
        caused_by="test",
    )
    history["sent"].append({"processor_event_id": event_id})


def queue_message(payment: Payment, event_id: str, status: str) -> QueueMessage:
    now = timezone.now()
    return QueueMessage.objects.create(
        message_id=f"msg-{uuid.uuid4()}",
        kind="processor_event",
        group_id=str(payment.id),
        payment_id=str(payment.id),
        deduplication_id=event_id,
        body={"kind": "processor_event", "processor_event_id": event_id},
        first_started_at=now,
        last_started_at=now,
        attempts=1,
        status=status,
    )


def clean_history() -> dict:
    """A clean run: confirmed, returned, duplicated, stale, parked and dead-lettered events."""
    history: dict = {"sent": [], "payments": {}}
    confirmed = new_payment("m-1", "10.00")
    deliver(history, confirmed, "submitted")
    settled = deliver(history, confirmed, "settled")
    # The processor delivered "settled" twice: the second is dropped as a duplicate.
    redeliver(history, confirmed, "settled", settled)
    # A late "submitted" with a new id for a confirmed payment: stale.
    deliver(history, confirmed, "submitted")

    returned = new_payment("m-1", "7.25")
    deliver(history, returned, "submitted")
    deliver(history, returned, "returned", reason_code="R01")

    second_merchant = new_payment("m-2", "3.10")
    deliver(history, second_merchant, "submitted")
    deliver(history, second_merchant, "settled")

    # Settled, then returned (R10): credited, then reversed. Its return is delivered twice.
    settled_returned = new_payment("m-2", "4.40")
    deliver(history, settled_returned, "submitted")
    deliver(history, settled_returned, "settled")
    returned_after = deliver(history, settled_returned, "returned", reason_code="R10")
    redeliver(history, settled_returned, "returned", returned_after, reason_code="R10")

    # Canceled before origination: never charged, nothing in the ledger.
    canceled = new_payment("m-1", "2.50")
    payment_cancel(payment_id=canceled.pk)

    held = _held_behind_a_dead_letter(history)
    refunded, double_loss, credits = _money_out(history)
    paid_out, payout = _paid_out(history)
    payments = [
        *(confirmed, returned, second_merchant, settled_returned, held),
        *(refunded, double_loss, paid_out),
    ]
    history["stats"] = {
        "charges": {str(p.idempotency_key): 1 for p in payments},
        "charges_by_payment": {str(p.id): 1 for p in payments},
        "debits": len(payments),
        "callbacks_sent": len(history["sent"]),
        "credits_sent": {str(c.idempotency_key): 1 for c in credits},
        "credits_sent_by_payment": {str(c.id): 1 for c in credits},
    }
    history["payments"] = {
        "confirmed": confirmed,
        "returned": returned,
        "second_merchant": second_merchant,
        "settled_returned": settled_returned,
        "held": held,
        "canceled": canceled,
        "refunded": refunded,
        "refund": credits[0],
        "double_loss": double_loss,
        "sent_refund": credits[1],
        "payout": payout,
    }
    return history


def _paid_out(history: dict) -> tuple[Payment, Payment]:
    """m-5's debit settled long ago (past the return reserve), 3.00 of its 3.10 paid out."""
    debit = new_payment("m-5", "3.10")
    deliver(history, debit, "submitted")
    deliver(history, debit, "settled")
    with history_rewritten():  # booked a month ago
        LedgerEntry.objects.filter(payment=debit).update(
            created_at=timezone.now() - timedelta(days=30)
        )
    payout = payout_create(
        merchant_id="m-5", amount=Decimal("3.00"), destination_token="tok_po_m5x"
    )
    return debit, payout


def _sent(refund: Payment) -> None:
    """What the worker's submission marks before its call: the credit may be at the processor."""
    Payment.objects.filter(pk=refund.pk).update(submission_started_at=timezone.now())


def _money_out(history: dict) -> tuple[Payment, Payment, list[Payment]]:
    """A partial refund sent and settled; a debit refunded twice, one refund sent and one not,
    then returned R10: the one sent is a double loss (booked and alerted), the other canceled."""
    refunded = new_payment("m-4", "20.00")
    deliver(history, refunded, "submitted")
    deliver(history, refunded, "settled")
    refund = refund_create(payment_id=refunded.id, amount=Decimal("8.00"))
    _sent(refund)
    deliver(history, refund, "submitted", direction="credit")
    deliver(history, refund, "settled", direction="credit")

    double_loss = new_payment("m-4", "12.00")
    deliver(history, double_loss, "submitted")
    deliver(history, double_loss, "settled")
    sent = refund_create(payment_id=double_loss.id, amount=Decimal("6.00"))
    _sent(sent)
    deliver(history, sent, "submitted", direction="credit")
    refund_create(payment_id=double_loss.id, amount=Decimal("6.00"))  # never sent: canceled
    with TestCase.captureOnCommitCallbacks(execute=True):  # the double loss's alert
        deliver(history, double_loss, "returned", reason_code="R10")
    return refunded, double_loss, [refund, sent]


def _held_behind_a_dead_letter(history: dict) -> Payment:
    """A "settled" for a pending payment cannot apply: it failed, was dead-lettered, its
    payment put on hold, and a later event of the same payment was parked behind the hold."""
    held = new_payment("m-3", "5.00")
    early = processor_event(held, "settled")
    failed = queue_message(held, early.processor_event_id, QueueMessageStatus.DEAD_LETTERED)
    ProcessingError.objects.create(
        queue_message=failed,
        payment_id=str(held.id),
        message_id=failed.message_id,
        attempt_number=1,
        error_class="payments.exceptions.InvalidTransition",
        message="settled event cannot move payment from pending to confirmed",
        retryable=True,
        delay_seconds=1.0,
    )
    DeadLetter.objects.create(
        original_message_id=failed.message_id,
        dlq_message_id=f"dlq-{uuid.uuid4()}",
        payment_id=held.id,
        kind="processor_event",
        group_id=str(held.id),
        processor_event_id=early.processor_event_id,
        body={"kind": "processor_event", "processor_event_id": early.processor_event_id},
        source=DeadLetterSource.WORKER,
        attempts=6,
        last_error_class="payments.exceptions.InvalidTransition",
    )
    history["sent"].append({"processor_event_id": early.processor_event_id})
    hold = PaymentHold.objects.create(
        payment_id=str(held.id), reason="dead-lettered", caused_by=failed
    )
    later = f"evt_{uuid.uuid4().hex}"
    ParkedMessage.objects.create(
        hold=hold,
        payment_id=str(held.id),
        message_id=f"msg-{uuid.uuid4()}",
        kind="processor_event",
        body={"kind": "processor_event", "processor_event_id": later},
    )
    history["sent"].append({"processor_event_id": later})
    return held


def check(history: dict, *, totals_rebuilt: bool = True):
    """The checker's report on ``history``. A corruption is written as maintenance writes, with
    no trigger firing, so the totals the database keeps (the day totals the limits read, the
    available totals a payout reads) are first rebuilt as that maintenance must (``manage.py
    totals_rebuild``): the corruption then trips its own check only. ``totals_rebuilt=False``
    for a test that corrupts the totals."""
    if totals_rebuilt:
        totals_rebuild()
    return check_invariants(sandbox_stats=history["stats"], callbacks_sent=history["sent"])


def totals_rebuild() -> None:
    """The totals the database keeps by trigger, rebuilt after a history written as maintenance
    writes (no trigger fired), as ``manage.py totals_rebuild`` does."""
    from payments.services.available import available_totals_rebuild
    from payments.services.limits import day_totals_rebuild

    day_totals_rebuild()
    available_totals_rebuild()


def failed_checks(report) -> set[str]:
    return {v.check for v in report.violations}


@contextmanager
def services_as_production():
    """Inside a test of the ``history`` fixture (whose session runs as a maintenance session,
    ``session_replication_role = replica``, where triggers do not fire): the product's services
    run with the database's triggers on, as in production (the day totals the limits read, the
    history guard), then the test's maintenance session goes on."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("RESET session_replication_role")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET session_replication_role = replica")
