"""The peer's task: apply one processor event with the ORM, in ``transaction.atomic()`` with
the payment's row locked by ``select_for_update()``, deduplicated by the processor's event id.

Late acknowledgement (``acks_late``), as Celery's documentation advises for a task that must not
be lost with its worker, and idempotent, as it then must be: a redelivered event finds its
``ProcessedEvent`` and changes nothing. It writes the rows the product's worker writes for a
``settled`` event: the dedup record, the event log row, the state, the ledger credit.
"""

from celery import shared_task
from django.db import transaction

from bench.consumers import fingerprint
from payments.models import (
    EventKind,
    EventOutcome,
    LedgerEntry,
    LedgerEntryKind,
    Payment,
    PaymentEvent,
    PaymentState,
    ProcessedEvent,
)

# The transition each event type takes, by the model's own FSM methods.
TRANSITIONS = {"settled": "confirm", "failed": "fail"}


@shared_task(acks_late=True, ignore_result=True)
def apply_processor_event(event: dict) -> str:
    with transaction.atomic():
        payment = Payment.objects.select_for_update().get(pk=event["payment_id"])
        if ProcessedEvent.objects.filter(pk=event["processor_event_id"]).exists():
            return "duplicate"
        from_state = payment.state
        transition = TRANSITIONS.get(event["event_type"])
        applied = transition is not None and payment.state == PaymentState.SUBMITTED
        if applied:
            getattr(payment, transition)()
            payment.save(update_fields=["state", "state_changed_at", "updated_at"])
            if payment.state == PaymentState.CONFIRMED:
                LedgerEntry.objects.create(
                    payment=payment,
                    merchant_id=payment.merchant_id,
                    kind=LedgerEntryKind.CREDIT,
                    amount=payment.amount,
                    currency=payment.currency,
                )
        outcome = EventOutcome.APPLIED if applied else EventOutcome.STALE
        ProcessedEvent.objects.create(
            processor_event_id=event["processor_event_id"],
            payment=payment,
            event_type=event["event_type"],
            payload_hash=fingerprint(event),
            outcome=outcome,
        )
        PaymentEvent.objects.create(
            payment=payment,
            kind=EventKind.PROCESSOR_EVENT,
            outcome=outcome,
            event_type=event["event_type"],
            processor_event_id=event["processor_event_id"],
            from_state=from_state,
            to_state=payment.state,
            payload=event,
            caused_by="celery",
        )
    return str(outcome)
