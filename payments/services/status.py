"""Asking the processor what it knows of a payment's debit (or credit), for reconciliation."""

from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import transaction

from payments.exceptions import PaymentNotFound
from payments.models import Payment
from payments.processor.backends.http import (
    DebitStatus,
    ProcessorAuthFailed,
    ProcessorCallRejected,
    ProcessorCallUnavailable,
)
from payments.services.calls import (
    STATUS_OPERATION,
    alert_auth_failed,
    attempt_record,
    breaker_admit,
    breaker_record,
    log_attempt,
    transfer_get,
)
from payments.services.writes import payment_lock


@dataclass(frozen=True)
class StatusCheckResult:
    found: bool  # False: the processor has no debit under the payment's idempotency key
    processor_status: str  # the processor's word for it ("submitted", "settled", "returned")
    processor_id: str
    payment: Payment


def payment_status_check(*, payment_id) -> StatusCheckResult:
    """Ask the processor what it knows of the payment's debit, by idempotency key.

    Read-only towards the payment (reconciliation decides what to do with the answer); leaves an
    attempt row with operation ``status``. Raises ``ProcessorUnavailable`` (retryable) or
    ``ProcessorRejected`` (the processor refused the question, e.g. a wrong API key) after the
    attempt row is committed.
    """
    try:
        payment = Payment.objects.get(pk=payment_id)
    except (Payment.DoesNotExist, ValidationError):
        raise PaymentNotFound(f"payment {payment_id} does not exist") from None
    admission = breaker_admit(payment, STATUS_OPERATION)
    result: DebitStatus | ProcessorCallRejected | ProcessorCallUnavailable
    try:
        result = transfer_get(payment)
    except (ProcessorCallRejected, ProcessorCallUnavailable) as exc:
        result = exc
    with transaction.atomic():
        payment = payment_lock(payment_id)
        attempt = attempt_record(payment, STATUS_OPERATION, result)
    log_attempt(payment, attempt, attempt.outcome)
    if isinstance(result, ProcessorAuthFailed):
        alert_auth_failed(payment, attempt)
    breaker_record(admission, payment, attempt, result)
    if isinstance(result, Exception):
        raise result
    return StatusCheckResult(
        found=result.found,
        processor_status=result.status,
        processor_id=result.processor_id,
        payment=payment,
    )
