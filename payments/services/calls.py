"""What every call to the processor shares: the call itself, a debit's or a credit's by the
payment's direction, the circuit breaker's admission and verdict, the attempt row, its log line
and the alert for refused credentials."""

import logging
from dataclasses import replace
from datetime import timedelta

from django.db import connection
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from payments.alerts import AlertSeverity, alert_raise
from payments.exceptions import ProcessorCircuitOpen, ProcessorDegraded
from payments.insert_sql import row_insert_returning
from payments.models import (
    AttemptOutcome,
    BreakerState,
    Payment,
    PaymentDirection,
    ProcessorAttempt,
)
from payments.processor.backend import CallErrorKind, DebitAccepted, DebitQueued, DebitStatus
from payments.processor.backends.http import (
    ProcessorAuthFailed,
    ProcessorCallRejected,
    ProcessorCallUnavailable,
    get_client,
)
from payments.processor.breaker import (
    NOT_COUNTED_STATUSES,
    STATUS_READ,
    SUBMISSION,
    Admission,
    CallOutcome,
    call_outcome,
    failure_interleaved,
    max_pause_seconds,
    processor_breaker_admit,
    processor_breaker_degraded,
    processor_breaker_record,
    processor_breaker_wait,
    processor_degraded_reason,
)

logger = logging.getLogger(__name__)

# ProcessorAttempt.operation: the breaker judges the processor by its submissions.
SUBMIT_OPERATION = SUBMISSION
STATUS_OPERATION = STATUS_READ


def transfer_create(payment: Payment) -> DebitAccepted | DebitQueued:
    """Submit the payment under its idempotency key: a debit from ``source_token``, or for
    money out (a refund or payout) a credit to it, ``source_token`` being then the account the
    credit goes to. Raises as the backend does (a backend without credits refuses one)."""
    backend = get_client()
    fields = {
        "idempotency_key": payment.idempotency_key,
        "payment_id": payment.id,
        "amount": payment.amount,
        "currency": payment.currency,
    }
    if backend.describes_entries:
        fields["sec_code"] = payment.sec_code
        fields["company_entry_description"] = payment.entry_description
    if payment.direction == PaymentDirection.CREDIT:
        return backend.credit_create(**fields, destination_token=payment.source_token)
    return backend.debit_create(**fields, source_token=payment.source_token)


def transfer_get(payment: Payment) -> DebitStatus:
    """What the processor knows of the payment's debit or credit, by idempotency key."""
    backend = get_client()
    if payment.direction == PaymentDirection.CREDIT:
        return backend.credit_get(idempotency_key=payment.idempotency_key)
    return backend.debit_get(idempotency_key=payment.idempotency_key)


def breaker_admit(payment: Payment, operation: str) -> Admission:
    """Ask the processor's circuit breaker for a call; no call and no attempt row when it is
    open or paused (``ProcessorCircuitOpen``: the caller waits without spending an attempt)."""
    admission = processor_breaker_admit(operation=operation)
    if not admission.allowed:
        what = "submission" if operation == SUBMIT_OPERATION else "status check"
        raise ProcessorCircuitOpen(
            f"payment {payment.id}: {what} not attempted: {admission.reason}",
            retry_after=admission.wait_seconds,
            breaker_open=admission.state != BreakerState.CLOSED,
        )
    return admission


def breaker_record(
    admission: Admission,
    payment: Payment,
    attempt: ProcessorAttempt,
    result,
) -> None:
    """Tell the breaker what the call said about the processor. A failure that finds the
    breaker open (this call opened it, or a trial call failed) or a 429 pause is raised as
    ``ProcessorCircuitOpen``: the processor is down or busy as a whole, so the message does not
    pay an attempt for it. A submission's failure while the breaker stays closed but the
    processor fails other payments too is raised as ``ProcessorDegraded``, for the same
    reason."""
    failed = isinstance(result, ProcessorCallUnavailable)
    state = processor_breaker_record(
        admission=admission,
        outcome=call_outcome(
            http_status=attempt.http_status,
            retryable=failed,
            accepted=not isinstance(result, Exception),
        ),
        operation=attempt.operation,
        error=attempt.error,
        retry_after=attempt.retry_after_seconds,
        http_status=attempt.http_status,
    )
    if not failed or attempt.http_status == 409:
        return
    paused = attempt.http_status == 429
    if not paused and state == BreakerState.CLOSED:
        _raise_if_degraded(payment, attempt, result)
        return
    after = processor_breaker_wait(
        operation=attempt.operation
    )  # includes a 429's pause (capped by the breaker)
    wait = after.wait_seconds
    if paused and attempt.retry_after_seconds is not None:
        wait = max(wait, min(attempt.retry_after_seconds, max_pause_seconds()))
    raise ProcessorCircuitOpen(
        f"payment {payment.id} attempt {attempt.attempt_number}: {result}; "
        f"{after.reason or 'calls paused'}",
        retry_after=wait,
        called=True,
        breaker_open=state != BreakerState.CLOSED,
    ) from result


def call_again_worth(admission: Admission, attempt: ProcessorAttempt, result) -> bool:
    """Whether a failed submission is made again at once on a new connection: it failed with
    a 5xx or without an answer (not a timeout: its request may still be running), outside a
    trial, and interleaved with other payments' successes (``breaker.degraded``)."""
    if admission.trial or attempt.operation != SUBMIT_OPERATION:
        return False
    if not isinstance(result, ProcessorCallUnavailable) or isinstance(result, ProcessorAuthFailed):
        return False
    status = attempt.http_status
    if status is None and attempt.error_kind != CallErrorKind.CONNECTION:
        return False
    if status is not None and (status < 500 or status in NOT_COUNTED_STATUSES):
        return False
    return failure_interleaved(payment_id=attempt.payment_id, attempt_id=attempt.pk)


def breaker_record_called_again(admission: Admission, attempt: ProcessorAttempt) -> Admission:
    """Tell the breaker of the failure that was made again: counted as any failure; what the
    call again says is told after it (``breaker_record``), with the admission returned, which
    counts that failure (its success then resets it)."""
    processor_breaker_record(
        admission=admission,
        outcome=CallOutcome.FAILURE,
        operation=attempt.operation,
        error=attempt.error,
        http_status=attempt.http_status,
    )
    return replace(admission, failures=admission.failures + 1)


def breaker_recovered(payment: Payment, attempt: ProcessorAttempt) -> None:
    """A submission that failed went through when made again on a new connection: the
    failure was the processor's. Asks the degraded verdict as a failure does, so a balancer's
    flap that no payment feels is an incident all the same."""
    reason = processor_degraded_reason(payment_id=payment.id)
    if reason:
        processor_breaker_degraded(
            reason=f"{reason}; payment {payment.id} went through when called again on a new "
            f"connection (attempt {attempt.attempt_number})"
        )


def _raise_if_degraded(payment: Payment, attempt: ProcessorAttempt, result) -> None:
    """A submission that failed alone is the payment's to retry; one that failed while the
    processor fails other payments too is not (``breaker.degraded``)."""
    if attempt.operation != SUBMIT_OPERATION:
        return
    reason = processor_degraded_reason(payment_id=payment.id)
    if not reason:
        return
    processor_breaker_degraded(reason=f"{reason}: {attempt.error}")
    raise ProcessorDegraded(
        f"payment {payment.id} attempt {attempt.attempt_number}: {result}; processor degraded: "
        f"{reason}",
        retry_after=attempt.retry_after_seconds or 0.0,
        attempt_number=attempt.attempt_number,
    ) from result


def alert_auth_failed(payment: Payment, attempt: ProcessorAttempt) -> None:
    alert_raise(
        severity=AlertSeverity.HIGH,
        key="processor.auth_failed",
        summary=(
            f"the processor refused our credentials (HTTP {attempt.http_status}) on the "
            f"{attempt.operation} call for payment {payment.id}: check PROCESSOR_API_KEY; the "
            "payment stays as it was and is retried"
        ),
        details={"http_status": attempt.http_status, "error": attempt.error},
        payment_id=payment.id,
    )


def attempt_record(
    payment: Payment, operation: str, result, *, idempotency_key=None
) -> ProcessorAttempt:
    """Write the attempt row; the caller holds the payment's row lock, so the number is safe.
    ``idempotency_key``: the key the call sent, when it is not the payment's (a dishonor
    request has its own)."""
    attempt = attempt_new(payment, operation, result, idempotency_key=idempotency_key)
    attempt.attempt_number = _attempt_number_next(payment, operation)
    if connection.vendor == "postgresql":
        # The number counted by the insert itself, and returned by it: one statement.
        row_insert_returning(attempt, computed=("attempt_number",))
    else:
        attempt.save(force_insert=True)
    attempt_recorded(attempt)
    return attempt


def attempt_new(
    payment: Payment, operation: str, result, *, idempotency_key=None
) -> ProcessorAttempt:
    """The attempt row of ``result``, unsaved and not numbered yet: its number and its start
    (the record's time less the call's latency, ``started_at``) are the insert's to compute."""
    if isinstance(result, ProcessorCallRejected):
        outcome = AttemptOutcome.REJECTED
    elif isinstance(result, ProcessorCallUnavailable):
        outcome = AttemptOutcome.RETRYABLE
    elif isinstance(result, DebitQueued):
        outcome = AttemptOutcome.QUEUED
    else:
        outcome = AttemptOutcome.ACCEPTED
    call = result.call
    # On the database's clock, as every audit time: the call began its own (monotonic) latency
    # before this record. The calling host's clock, which may be minutes off, is not read.
    latency = timedelta(milliseconds=call.latency_ms)
    return ProcessorAttempt(
        payment=payment,
        operation=operation,
        idempotency_key=idempotency_key or payment.idempotency_key,
        outcome=outcome,
        http_status=call.http_status,
        error_kind=call.error_kind,
        error=call.error,
        response_body=call.response_body,
        latency_ms=call.latency_ms,
        retry_after_seconds=call.retry_after,
        started_at=Now() - latency,
    )


def attempt_recorded(attempt: ProcessorAttempt) -> None:
    """Set an attempt's start as stored, once its insert has returned ``recorded_at``: the same
    statement time the database subtracted the latency from, so this is the stored value
    without reading it again."""
    attempt.started_at = attempt.recorded_at - timedelta(milliseconds=attempt.latency_ms)


def _attempt_number_next(payment: Payment, operation: str) -> int | RawSQL:
    """The number of the payment's next attempt of ``operation``, safe under the caller's row
    lock: on PostgreSQL an expression its insert computes, else counted first."""
    attempts = ProcessorAttempt.objects.filter(payment=payment, operation=operation)
    if connection.vendor != "postgresql":
        return attempts.count() + 1
    meta = ProcessorAttempt._meta
    quote = connection.ops.quote_name
    sql = (
        f"SELECT COUNT(*) + 1 FROM {quote(meta.db_table)} "  # noqa: S608
        f"WHERE {quote(meta.get_field('payment').column)} = %s "
        f"AND {quote(meta.get_field('operation').column)} = %s"
    )
    return RawSQL(sql, (payment.pk, operation))


def log_attempt(payment: Payment, attempt: ProcessorAttempt, outcome: str) -> None:
    logger.info(
        "processor %s attempt %s for payment %s: %s (%s) in %.0f ms -> %s",
        attempt.operation,
        attempt.attempt_number,
        payment.id,
        attempt.outcome,
        attempt.http_status or attempt.error_kind,
        attempt.latency_ms,
        outcome,
        extra={"payment_id": str(payment.id)},
    )
