"""May a processor call go now: the read every submission asks first, and the admission that
hands out the half-open trial's slots (a conditional UPDATE, so across processes no more are
taken than the trial has)."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db.models import F, Q
from django.db.models.functions import Now

from payments.models import (
    BreakerState,
    BreakerTransitionKind,
    CircuitBreaker,
    CircuitBreakerTransition,
)
from payments.processor.breaker.state import (
    PROBE_RECHECK_SECONDS,
    PROCESSOR,
    SUBMISSION,
    Admission,
    breaker_read,
    db_in,
    processor_breaker_get,
    trial_calls,
    trial_lease_seconds,
)

logger = logging.getLogger(__name__)


def _seconds_until(moment: datetime | None, now: datetime) -> float:
    if moment is None:
        return 0.0
    return max(0.0, (moment - now).total_seconds())


def _gate(breaker: CircuitBreaker | None, now: datetime | None, operation: str) -> Admission:
    """What the breaker row, as read, says to a caller that holds no trial slot. Allowed also
    when a trial slot may be had (``processor_breaker_admit`` then takes it or not)."""
    if breaker is None or now is None:
        return Admission(allowed=True)
    paused = _seconds_until(breaker.paused_until, now)
    since = f"{breaker.opened_at:%Y-%m-%d %H:%M:%S} UTC" if breaker.opened_at else "?"
    incident = breaker.opened_at is not None
    degraded = breaker.degraded_since is not None
    if breaker.state == BreakerState.CLOSED:
        reason = f"submissions paused by the processor's 429 Retry-After for {paused:.1f} s"
        return Admission(
            allowed=paused <= 0,
            wait_seconds=paused,
            state=breaker.state,
            reason=reason if paused else "",
            incident=incident,
            degraded=degraded,
            failures=breaker.consecutive_failures,
        )
    if breaker.state == BreakerState.OPEN:
        remaining = _seconds_until(breaker.open_until, now)
        wait = max(remaining, paused)
        reason = f"processor breaker open since {since}; next trial in {remaining:.1f} s"
    else:
        lease = _seconds_until(breaker.probe_until, now)
        slots = lease > 0 and breaker.trial_admitted < trial_calls()
        wait = max(paused, 0.0 if (slots or lease <= 0) else min(lease, PROBE_RECHECK_SECONDS))
        reason = f"processor breaker half-open since {since}: trial submissions are deciding"
    if operation != SUBMISSION:
        # Only a submission can show that submissions work again: other calls wait for the close.
        return Admission(
            allowed=False,
            wait_seconds=max(wait, PROBE_RECHECK_SECONDS),
            state=breaker.state,
            reason=reason,
            incident=incident,
            degraded=degraded,
        )
    return Admission(
        allowed=wait <= 0,
        wait_seconds=wait,
        state=breaker.state,
        reason=reason,
        incident=incident,
        degraded=degraded,
    )


def processor_breaker_wait(*, operation: str = SUBMISSION) -> Admission:
    """Read-only: may a call of ``operation`` go ahead (``allowed``), or how long must it stay
    away and why. One query: cheap enough to ask before starting every submission."""
    breaker, now = breaker_read()
    return _gate(breaker, now, operation)


def processor_breaker_admit(*, operation: str = SUBMISSION) -> Admission:
    """Decide whether a processor call may go now; in half-open, take a trial slot if one is
    free (starting the trial when the pause is over)."""
    breaker, now = breaker_read()
    if breaker is None:
        processor_breaker_get()  # first use: one query per call after this
        breaker, now = breaker_read()
    gate = _gate(breaker, now, operation)
    if breaker.state == BreakerState.CLOSED or not gate.allowed:
        return gate
    processor_breaker_trial_start()
    took = (
        CircuitBreaker.objects.filter(
            name=PROCESSOR,
            state=BreakerState.HALF_OPEN,
            probe_until__gt=Now(),
            trial_admitted__lt=trial_calls(),
        )
        .filter(Q(paused_until__isnull=True) | Q(paused_until__lte=Now()))
        .update(trial_admitted=F("trial_admitted") + 1)
    )
    if took:
        logger.warning("processor breaker half-open: this submission is a trial call")
        return Admission(
            allowed=True, trial=True, state=BreakerState.HALF_OPEN, reason="trial call"
        )
    breaker, now = breaker_read()
    after = _gate(breaker, now, operation)
    return Admission(
        allowed=False,
        wait_seconds=max(after.wait_seconds, PROBE_RECHECK_SECONDS),
        state=breaker.state,
        reason=after.reason or "the trial's calls are taken",
    )


def processor_breaker_admit_read(
    breaker: CircuitBreaker | None, now: datetime | None, *, operation: str = SUBMISSION
) -> Admission | None:
    """The admission from a breaker row the caller read itself right before its call (a
    submission reads it in the statement that marks the payment): decided only when the breaker
    is closed and lets the call go, which takes no trial slot and writes nothing; None
    otherwise, for ``processor_breaker_admit`` to read the row again and decide."""
    if breaker is None or now is None or breaker.state != BreakerState.CLOSED:
        return None
    gate = _gate(breaker, now, operation)
    return gate if gate.allowed else None


def processor_breaker_trial_start() -> bool:
    """When the pause is over (or the last trial's lease ran out undecided), start a trial:
    half-open, with its slots free. True for the one process whose UPDATE started it; the
    queue layer then releases that many waiting submissions to fill them."""
    lease = trial_lease_seconds()
    started = (
        CircuitBreaker.objects.filter(name=PROCESSOR)
        .filter(
            Q(state=BreakerState.OPEN, open_until__lte=Now())
            | Q(state=BreakerState.HALF_OPEN, probe_until__lte=Now())
            | Q(state=BreakerState.HALF_OPEN, probe_until__isnull=True)
        )
        .filter(Q(paused_until__isnull=True) | Q(paused_until__lte=Now()))
        .update(
            state=BreakerState.HALF_OPEN,
            probe_until=db_in(lease),
            trial_admitted=0,
            trial_succeeded=0,
        )
    )
    if not started:
        return False
    CircuitBreakerTransition.objects.create(
        breaker_id=PROCESSOR,
        kind=BreakerTransitionKind.PROBING,
        reason=f"pause over: {trial_calls()} real submission(s) decide (lease {lease:.0f} s)",
    )
    logger.warning("processor breaker half-open: %s trial submission(s) decide", trial_calls())
    return True
