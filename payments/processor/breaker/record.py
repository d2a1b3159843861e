"""What one call's outcome does to the breaker: a success resets the count of failures, a
counted failure opens it (in a row, or as a rate of recent first submissions), a trial's
outcome closes or reopens it, and a 429 pauses every caller."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import F
from django.db.models.functions import Now

from payments import conf as payments_conf
from payments.models import AttemptOutcome, BreakerState, CircuitBreaker, ProcessorAttempt
from payments.processor.breaker.state import (
    DEFAULT_429_PAUSE_SECONDS,
    NOT_COUNTED_STATUSES,
    PROCESSOR,
    SUBMISSION,
    Admission,
    CallOutcome,
    processor_breaker_get,
)
from payments.processor.breaker.transitions import (
    breaker_open,
    breaker_reopen,
    breaker_trial_succeeded,
    processor_breaker_pause,
)


def call_outcome(*, http_status: int | None, retryable: bool, accepted: bool) -> CallOutcome:
    """What one call says about the processor's health."""
    if accepted or not retryable:
        return CallOutcome.SUCCESS
    if http_status in NOT_COUNTED_STATUSES:
        return CallOutcome.NEUTRAL
    return CallOutcome.FAILURE


def processor_breaker_record(
    *,
    admission: Admission,
    outcome: CallOutcome,
    operation: str = SUBMISSION,
    error: str = "",
    retry_after: float | None = None,
    http_status: int | None = None,
) -> str:
    """Record one call's outcome; returns the breaker state after it.

    Outside any transaction: it commits its own changes (the state is shared, a caller's
    rollback must not undo that the processor failed).
    """
    if http_status == 429:
        # Without a Retry-After the processor still said "too many": a short pause for all.
        seconds = retry_after if retry_after is not None else DEFAULT_429_PAUSE_SECONDS
        processor_breaker_pause(seconds=seconds, reason=error)
    if outcome == CallOutcome.SUCCESS:
        if operation == SUBMISSION and (
            admission.failures or admission.state != BreakerState.CLOSED
        ):
            # A call admitted by a closed breaker that had counted no failure has none to
            # reset: the UPDATE would change nothing, on every submission. One that failed in
            # the meantime and was not admitted (another process's) is reset by the next call
            # admitted after it.
            CircuitBreaker.objects.filter(name=PROCESSOR, consecutive_failures__gt=0).update(
                consecutive_failures=0
            )
        if admission.trial:
            breaker_trial_succeeded()
            return _state()
        # A success admitted while closed: if the breaker opened meanwhile (this call started
        # before it did), it does not cut the pause short; the trial decides.
        return admission.state
    if outcome == CallOutcome.NEUTRAL:
        if admission.trial:
            # Undecided: give the slot back so the next submission takes it.
            CircuitBreaker.objects.filter(
                name=PROCESSOR, state=BreakerState.HALF_OPEN, trial_admitted__gt=0
            ).update(trial_admitted=F("trial_admitted") - 1)
        return _state()
    if admission.trial:
        breaker_reopen(error=f"trial submission failed: {error}")
        return _state()
    updated = CircuitBreaker.objects.filter(name=PROCESSOR, state=BreakerState.CLOSED).update(
        consecutive_failures=F("consecutive_failures") + 1, last_error=error[:2000]
    )
    if not updated:
        return _state()  # already open or half-open: the pause and the trial decide
    breaker = processor_breaker_get()
    threshold = int(payments_conf.PROCESSOR_BREAKER_FAILURES)
    if breaker.consecutive_failures >= threshold:
        breaker_open(reason=f"{breaker.consecutive_failures} consecutive failures: {error}")
        return _state()
    rate_reason = _failure_rate_reason(breaker)
    if rate_reason:
        breaker_open(reason=f"{rate_reason}: {error}")
    return _state()


def _failure_rate_reason(breaker: CircuitBreaker) -> str:
    """Why the recent submissions say the processor is down, or "" when they do not."""
    calls = int(payments_conf.PROCESSOR_BREAKER_WINDOW_CALLS)
    window = float(payments_conf.PROCESSOR_BREAKER_WINDOW_SECONDS)
    rate = float(payments_conf.PROCESSOR_BREAKER_FAILURE_RATE)
    recent = list(
        ProcessorAttempt.objects.filter(
            operation=SUBMISSION,
            # First attempts only: a retry is there because its payment failed before, so
            # retries over-sample failing payments (a bad account, a rule of the processor's),
            # most of all when traffic is quiet and only they are left.
            attempt_number=1,
            pk__gt=breaker.window_after_attempt,
            recorded_at__gte=Now() - timedelta(seconds=window),
        )
        .order_by("-pk")
        .values_list("outcome", "http_status", "payment_id")[:calls]
    )
    if len(recent) < calls:
        return ""
    failed = {
        payment
        for outcome, status, payment in recent
        if outcome == AttemptOutcome.RETRYABLE and status not in NOT_COUNTED_STATUSES
    }
    if len(failed) / len(recent) >= rate:
        return f"{len(failed)} of the last {len(recent)} first submissions failed"
    return ""


def _state() -> str:
    return processor_breaker_get().state
