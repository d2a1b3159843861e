"""Reads of the queue layer's records for the API, the admin and the dashboards."""

from django.db.models import Count, Q, QuerySet

from callbacks.models import (
    UNFINISHED_STATUSES,
    HoldKind,
    PaymentHold,
    ProcessingError,
    QueueMessage,
    QueueMessageStatus,
)
from payments.models import Payment, PaymentState

# What a tenant is told of a failed processing attempt: a stable code and a short text. The
# stored class, message and traceback quote exceptions, queue messages and the processor's
# address: they are for the admin, never for the API.
WORKER_PUBLIC_ERRORS = {
    "processor_unavailable": "the processor did not answer; retried automatically",
    "database_unavailable": "the database was unavailable; retried automatically",
    "processing_retried": "processing an event of this payment failed; retried automatically",
    "processing_failed": "processing an event of this payment failed; an operator looks at it",
}
_WORKER_ERROR_CODES = {
    "ProcessorUnavailable": "processor_unavailable",
    "ProcessorCircuitOpen": "processor_unavailable",
    "ProcessorDegraded": "processor_unavailable",
    "OperationalError": "database_unavailable",
    "InterfaceError": "database_unavailable",
}


def processing_error_code(error: ProcessingError) -> str:
    code = _WORKER_ERROR_CODES.get(error.error_class.rsplit(".", 1)[-1])
    if code is not None:
        return code
    return "processing_retried" if error.retryable else "processing_failed"


def payment_processing_errors(payment_id) -> QuerySet[ProcessingError]:
    """Every failed attempt recorded for a payment, oldest first."""
    return ProcessingError.objects.filter(payment_id=str(payment_id)).order_by("created_at", "id")


def payment_active_hold(payment_id) -> PaymentHold | None:
    return (
        PaymentHold.objects.select_related("caused_by")
        .filter(payment_id=str(payment_id), released_at__isnull=True)
        .first()
    )


def payment_dead_lettered_message_ids(payment_id) -> set[str]:
    """Ids of the payment's messages that left the main queue for the dead-letter queue."""
    return set(
        QueueMessage.objects.filter(
            payment_id=str(payment_id), status=QueueMessageStatus.DEAD_LETTERED
        ).values_list("message_id", flat=True)
    )


def payment_queue_detail(payment) -> dict:
    """The payment-detail section this app contributes: processing errors and the active hold."""
    errors = []
    for e in payment_processing_errors(payment.pk):
        code = processing_error_code(e)
        errors.append(
            {
                "source": "worker",
                "code": code,
                "message": WORKER_PUBLIC_ERRORS[code],
                "attempt": e.attempt_number,
                "at": e.created_at.isoformat(),
                "message_id": e.message_id,
                "attempt_number": e.attempt_number,
                "retryable": e.retryable,
                "delay_seconds": e.delay_seconds,
                "created_at": e.created_at.isoformat(),
            }
        )
    hold = payment_active_hold(payment.pk)
    hold_data = None
    if hold is not None:
        hold_data = {
            "id": hold.pk,
            "kind": hold.kind,
            # The stored reason quotes exceptions and queue messages: the admin shows it.
            "reason": HoldKind(hold.kind).label,
            "created_at": hold.created_at.isoformat(),
            "caused_by_message_id": hold.caused_by.message_id if hold.caused_by else None,
            "parked_messages": hold.parked.filter(republished_message_id="").count(),
        }
    return {"errors": errors, "hold": hold_data}


def queue_message_by_id(message_id: str) -> QueueMessage | None:
    """The worker's record of one message; None when no worker ever started it."""
    return QueueMessage.objects.filter(message_id=message_id).first()


def message_processing_errors(message_id: str) -> QuerySet[ProcessingError]:
    """Every failed attempt recorded for one message, oldest first."""
    return ProcessingError.objects.filter(message_id=message_id).order_by("created_at", "id")


def queue_messages_unfinished(
    *, message_ids: list[str], never_finished_class: str
) -> QuerySet[QueueMessage]:
    """The worker's records of these messages that are not finished, each annotated with
    ``never_finished``: how many of its error rows say a start of it never finished (their
    class is ``never_finished_class``)."""
    return QueueMessage.objects.filter(
        message_id__in=message_ids, status__in=UNFINISHED_STATUSES
    ).annotate(never_finished=Count("errors", filter=Q(errors__error_class=never_finished_class)))


def payment_submission_started(payment_id: str) -> bool:
    """Whether the payment is still pending although a submission of it marked it before its
    call (``submission_started_at``, which stays set after a call that failed retryably, since
    that call may have reached the processor, and is cleared when no call was made): the
    processor may have the debit, and its events may come before the submission's answer is
    applied. A payment held for review or validation is never marked: its submission was
    skipped, and nothing of it is at the processor."""
    return Payment.objects.filter(
        pk=str(payment_id), state=PaymentState.PENDING, submission_started_at__isnull=False
    ).exists()
