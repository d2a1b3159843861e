"""Canceling a payment before origination: ``pending -> canceled``, once, against the submission.

The cancel and the submission decide under the payment's row lock. The submission marks the
payment (``submission_started_at``) in its first short transaction, before its call to the
processor; from then on the debit may be at the processor, so a cancel is refused
(``already_submitted``) and the submission goes on. A cancel that locks the row first moves the
payment to ``canceled``, and the submission, locking the row after it, finds the payment not
pending and never calls (its queue message is done). Either way there is one winner.

A backend that holds a debit before sending it (the bank backend's entry waiting for its file)
withdraws it in the cancel's transaction (``ProcessorBackend.debit_withdraw``), under the lock its
own sending takes; a debit it has sent on refuses the cancel the same way.

A canceled payment moved no money: it writes no ledger entry and counts in no balance.
"""

import logging
from dataclasses import dataclass

from django.db import transaction

from payments.exceptions import CancelRefused
from payments.models import EventKind, EventOutcome, Payment, PaymentEvent, PaymentState
from payments.processor.backend import DebitSent, get_backend
from payments.services.transitions import payment_transition, transition_announce
from payments.services.writes import payment_lock

logger = logging.getLogger(__name__)

ALREADY_SUBMITTED = "already_submitted"
PAYMENT_NOT_CANCELABLE = "payment_not_cancelable"
# Every rule a refusal names, as the error envelope's code.
RULES = (ALREADY_SUBMITTED, PAYMENT_NOT_CANCELABLE)
# The event log's word for the cancel (its ``event_type``).
CANCEL_EVENT = "canceled"


@dataclass(frozen=True)
class CancelResult:
    payment: Payment
    # False: the payment was canceled before; nothing was written, the answer is the same.
    canceled: bool


def payment_cancel(*, payment_id, caused_by: str = "") -> CancelResult:
    """Cancel a payment that has not reached the processor or a bank file yet.

    In one transaction under the payment's row lock: refuse (``CancelRefused`` naming the rule)
    a payment whose submission has begun or that has left ``pending``; withdraw a debit the
    backend holds unsent; move ``pending -> canceled``; log it and tell the host (the signals
    every transition sends). A payment already canceled is answered as it is (idempotent).
    ``PaymentNotFound`` for an unknown id.
    """
    with transaction.atomic():
        payment = payment_lock(payment_id)
        if payment.state == PaymentState.CANCELED:
            return CancelResult(payment, canceled=False)
        _cancel_check(payment)
        try:
            get_backend().debit_withdraw(payment_id=payment.id)
        except DebitSent as exc:
            raise CancelRefused(
                ALREADY_SUBMITTED, f"payment {payment.id} has been sent on: {exc}"
            ) from exc
        from_state, to_state = payment_transition(payment=payment, target=PaymentState.CANCELED)
        row = PaymentEvent.objects.create(
            payment=payment,
            kind=EventKind.CANCELLATION,
            outcome=EventOutcome.APPLIED,
            event_type=CANCEL_EVENT,
            from_state=from_state,
            to_state=to_state,
            caused_by=caused_by,
        )
        transition_announce(row)
    logger.info(
        "payment %s canceled before origination",
        payment.id,
        extra={"payment_id": str(payment.id)},
    )
    return CancelResult(payment, canceled=True)


def _cancel_check(payment: Payment) -> None:
    """Refuse a cancel the payment's state no longer allows, naming the rule."""
    if payment.state == PaymentState.FAILED:
        raise CancelRefused(
            PAYMENT_NOT_CANCELABLE,
            f"payment {payment.id} is failed: it moves no money and cannot be canceled",
        )
    if payment.state != PaymentState.PENDING:
        raise CancelRefused(
            ALREADY_SUBMITTED,
            f"payment {payment.id} is {payment.state}: it reached the processor and cannot be "
            "canceled",
        )
    if payment.submission_started_at is not None:
        raise CancelRefused(
            ALREADY_SUBMITTED,
            f"payment {payment.id} is being submitted (since "
            f"{payment.submission_started_at.isoformat()}): it may have reached the processor "
            "and cannot be canceled",
        )
