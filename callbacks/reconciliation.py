"""Reconciliation of stuck payments with the processor's status API.

Callbacks can be lost (the processor gave up retrying, an outage longer than its retries), and
a submission can time out after the processor recorded the debit. Two kinds of payment are
therefore checked with ``payment_status_check`` (GET by idempotency key):

- ``submitted`` for longer than ``RECONCILE_SUBMITTED_AFTER`` (ACH settles in days);
- ``pending`` whose last submission attempt ended in a timeout or connection error more than
  ``RECONCILE_PENDING_AFTER`` ago (the processor may hold the debit while we do not know it).

What the processor knows is never applied here. It becomes ``processor_event`` messages on the
main FIFO queue (group = payment id), applied by the worker through the same state machine,
dedup and ordering path as a callback. For a pending payment whose debit already settled,
failed or was returned, a ``submitted`` event is published first, then the final one, in order.

The messages are deterministic, so a repeated run or two overlapping runs cannot conflict:
``processor_event_id`` (also the deduplication id) is ``recon:<idempotency key>:<status>``, and
the event's ``timestamp`` is the moment the payment entered its current state (the time we last
knew for sure), not the time of the check: a second publication of the same finding carries the
same fingerprint, so SQS or the processed-event record drops it instead of flagging a conflict.
The check time travels as ``observed_at`` (outside the fingerprint). The status API gives no
amount; the event carries the payment's own amount.

A payment is checked again only after ``RECONCILE_RECHECK_AFTER`` (each check leaves a
``status`` attempt row), so a processor that keeps answering "submitted" is not polled every
tick.

While the processor's circuit breaker is open, status checks wait too: a run makes no call
(``payments_reconcile`` returns at once), and a run during which it opens stops there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from callbacks import conf as callbacks_conf
from callbacks import sqs
from callbacks.schema import processor_event_outgoing
from payments.alerts import alert_raise
from payments.events import ProcessorEvent, transition_event_types
from payments.exceptions import ProcessorCircuitOpen, ProcessorRejected, ProcessorUnavailable
from payments.models import AttemptOutcome, Payment, PaymentState, ProcessorAttempt
from payments.processor.breaker import processor_breaker_wait
from payments.services import (
    STATUS_OPERATION,
    SUBMIT_OPERATION,
    StatusCheckResult,
    payment_status_check,
)

logger = logging.getLogger(__name__)

LOST_SUBMISSION_ERRORS = ("timeout", "connection")
FINAL_STATUSES = ("settled", "failed", "returned")


class ReconcileAction(StrEnum):
    """What a check of one payment came to."""

    PUBLISHED = "published"  # the processor knows more: events are on the queue
    IN_SYNC = "in_sync"  # nothing to publish
    NOT_FOUND = "not_found"  # the processor has no debit under the idempotency key
    UNKNOWN_STATUS = "unknown_status"  # a status the state machine does not know (alerted)
    UNAVAILABLE = "unavailable"  # the processor could not answer; the next run retries
    REFUSED = "refused"  # the processor refused the status check (alerted)
    BREAKER_OPEN = "breaker_open"  # the processor's circuit breaker is open: the run stops


@dataclass(frozen=True)
class ReconcileOutcome:
    payment_id: str
    action: ReconcileAction
    events: tuple[str, ...] = ()


def reconcile_candidates(*, now: datetime, limit: int) -> list[Payment]:
    """Stuck payments not checked within ``RECONCILE_RECHECK_AFTER``, oldest first."""
    last_submit = ProcessorAttempt.objects.filter(
        payment=OuterRef("pk"), operation=SUBMIT_OPERATION
    ).order_by("-attempt_number")
    pending_after = now - callbacks_conf.RECONCILE_PENDING_AFTER
    recently_checked = ProcessorAttempt.objects.filter(
        operation=STATUS_OPERATION, started_at__gte=now - callbacks_conf.RECONCILE_RECHECK_AFTER
    ).values("payment_id")
    return list(
        Payment.objects.annotate(
            last_submit_outcome=Subquery(last_submit.values("outcome")[:1]),
            last_submit_error=Subquery(last_submit.values("error_kind")[:1]),
            last_submit_at=Subquery(last_submit.values("started_at")[:1]),
        )
        .filter(
            Q(
                state=PaymentState.SUBMITTED,
                state_changed_at__lt=now - callbacks_conf.RECONCILE_SUBMITTED_AFTER,
            )
            | Q(
                state=PaymentState.PENDING,
                last_submit_outcome=AttemptOutcome.RETRYABLE,
                last_submit_error__in=LOST_SUBMISSION_ERRORS,
                last_submit_at__lt=pending_after,
            )
        )
        .exclude(pk__in=recently_checked)
        .order_by("state_changed_at")[:limit]
    )


def _events_to_publish(payment: Payment, processor_status: str) -> list[str]:
    if payment.state == PaymentState.PENDING:
        if processor_status == "submitted":
            return ["submitted"]
        return ["submitted", processor_status]
    if payment.state == PaymentState.SUBMITTED and processor_status in FINAL_STATUSES:
        return [processor_status]
    return []


def reconcile_event(*, payment: Payment, event_type: str, processor_status: str, now: datetime):
    """The deterministic processor event reconciliation publishes for ``payment``."""
    event_id = f"recon:{payment.idempotency_key}:{event_type}"
    event = ProcessorEvent(
        payment_id=payment.id,
        event_type=event_type,
        processor_event_id=event_id,
        amount=payment.amount,
        timestamp=payment.state_changed_at,
        message=f"reconciliation: processor status {processor_status}",
        raw={
            "source": "reconciliation",
            "observed_at": now.isoformat(),
            "processor_status": processor_status,
        },
    )
    return processor_event_outgoing(event, received_at=now)


def _status_check(payment: Payment) -> StatusCheckResult | ReconcileAction:
    """The processor's answer for ``payment``, or why there is none (alerted if refused)."""
    pid = str(payment.id)
    try:
        return payment_status_check(payment_id=payment.id)
    except ProcessorCircuitOpen as exc:
        logger.info("reconcile %s: waits: %s", pid, exc, extra={"payment_id": pid})
        return ReconcileAction.BREAKER_OPEN
    except ProcessorUnavailable as exc:
        logger.warning(
            "reconcile %s: processor unavailable: %s", pid, exc, extra={"payment_id": pid}
        )
        return ReconcileAction.UNAVAILABLE
    except ProcessorRejected as exc:
        alert_raise(
            severity="medium",
            key="reconcile.status_refused",
            summary=f"processor refused the status check of payment {pid}: {exc}",
            payment_id=pid,
        )
        return ReconcileAction.REFUSED


def _debit_not_found(payment: Payment) -> None:
    """Say that the processor has no debit for ``payment``: an alert if we think it has one."""
    pid = str(payment.id)
    if payment.state == PaymentState.SUBMITTED:
        alert_raise(
            severity="medium",
            key="reconcile.debit_unknown",
            summary=(
                f"payment {pid} is submitted here but the processor has no debit under its "
                f"idempotency key {payment.idempotency_key}"
            ),
            payment_id=pid,
        )
    else:
        # The timed-out submission never reached the processor: the worker's retries (same
        # idempotency key) or a dead letter take it from here.
        logger.info(
            "reconcile %s: the processor has no debit; submission retries continue",
            pid,
            extra={"payment_id": pid},
        )


def payment_reconcile(*, payment: Payment, now: datetime) -> ReconcileOutcome:
    """Check one payment with the processor and publish what it knows (immediately).

    Raises ``QueueUnavailable`` when the answer cannot be published.
    """
    pid = str(payment.id)
    result = _status_check(payment)
    if isinstance(result, ReconcileAction):
        return ReconcileOutcome(pid, result)
    payment = result.payment
    if not result.found:
        _debit_not_found(payment)
        return ReconcileOutcome(pid, ReconcileAction.NOT_FOUND)
    status = result.processor_status
    if status not in transition_event_types():
        alert_raise(
            severity="medium",
            key="reconcile.unknown_status",
            summary=f"processor reports unknown status {status!r} for {pid}",
            payment_id=pid,
        )
        return ReconcileOutcome(pid, ReconcileAction.UNKNOWN_STATUS)
    event_types = _events_to_publish(payment, status)
    if not event_types:
        return ReconcileOutcome(pid, ReconcileAction.IN_SYNC)
    messages = [
        reconcile_event(payment=payment, event_type=t, processor_status=status, now=now)
        for t in event_types
    ]
    sqs.send_messages_now(messages)
    logger.info(
        "reconcile %s: %s here, %s at the processor: published %s",
        pid,
        payment.state,
        status,
        ", ".join(m.deduplication_id for m in messages),
        extra={"payment_id": pid},
    )
    return ReconcileOutcome(pid, ReconcileAction.PUBLISHED, tuple(event_types))


def payments_reconcile(*, now: datetime | None = None, limit: int | None = None) -> int:
    """Check every stuck payment (up to ``limit``); return how many got events published.

    Calls the processor and the queue: run it outside any transaction. A queue failure stops
    the run and raises ``QueueUnavailable`` (the next run picks the payments up again).
    """
    now = now or timezone.now()
    limit = limit or callbacks_conf.RECONCILE_BATCH_SIZE
    gate = processor_breaker_wait(operation=STATUS_OPERATION)
    if not gate.allowed:
        # Status checks wait until the breaker closes (only submissions can close it); the
        # next run picks the payments up.
        logger.info("reconciliation waits: %s", gate.reason)
        return 0
    outcomes = []
    for payment in reconcile_candidates(now=now, limit=limit):
        outcome = payment_reconcile(payment=payment, now=now)
        outcomes.append(outcome)
        if outcome.action == ReconcileAction.BREAKER_OPEN:
            break  # the breaker opened during the run: the rest wait for the next one
    published = sum(1 for o in outcomes if o.action == ReconcileAction.PUBLISHED)
    if outcomes:
        counts: dict[str, int] = {}
        for o in outcomes:
            counts[o.action.value] = counts.get(o.action.value, 0) + 1
        logger.info("reconciliation checked %s payment(s): %s", len(outcomes), counts)
    return published
