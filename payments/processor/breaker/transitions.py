"""The breaker's changes of state: open, reopen, close, the end of an incident, and the 429 pause.

Each is a conditional UPDATE, or runs under the row's lock, and writes its
``CircuitBreakerTransition`` row in the same transaction; the alert is raised and cleared
after the commit.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F, Max, Q
from django.db.models.functions import Now

from payments import conf as payments_conf
from payments.alerts import AlertSeverity, alert_clear, alert_raise
from payments.models import (
    BreakerState,
    BreakerTransitionKind,
    CircuitBreaker,
    CircuitBreakerTransition,
    Payment,
    PaymentState,
    ProcessorAttempt,
)
from payments.processor.breaker.state import (
    ALERT_KEY,
    PROCESSOR,
    db_in,
    max_pause_seconds,
    pause_seconds,
    processor_breaker_get,
    trial_calls,
)

logger = logging.getLogger(__name__)


def breaker_open(*, reason: str) -> bool:
    """Open a closed breaker; within an incident's cool-down this is the same incident."""
    with transaction.atomic():
        breaker = (
            CircuitBreaker.objects.select_for_update()
            .annotate(db_now=Now())
            .filter(name=PROCESSOR, state=BreakerState.CLOSED)
            .first()
        )
        if breaker is None:
            return False  # another process opened it first
        same_incident = breaker.opened_at is not None
        reopen_count = breaker.reopen_count + 1 if same_incident else 0
        pause = pause_seconds(reopen_count)
        CircuitBreaker.objects.filter(name=PROCESSOR).update(
            state=BreakerState.OPEN,
            opened_at=breaker.opened_at if same_incident else Now(),
            open_until=db_in(pause),
            reopen_count=reopen_count,
            probe_until=None,
            trial_admitted=0,
            trial_succeeded=0,
            last_error=reason[:2000],
        )
        if same_incident:
            closed_for = (breaker.db_now - (breaker.closed_at or breaker.db_now)).total_seconds()
            reason = f"failing again {closed_for:.0f} s after closing (same incident): {reason}"
        CircuitBreakerTransition.objects.create(
            breaker_id=PROCESSOR,
            kind=BreakerTransitionKind.REOPENED if same_incident else BreakerTransitionKind.OPENED,
            reason=reason[:2000],
            pause_seconds=pause,
        )
    logger.error("processor breaker opened for %.0f s: %s", pause, reason)
    _alert_unavailable(opened_at=breaker.opened_at or breaker.db_now, reason=reason)
    return True


def _half_open_locked() -> CircuitBreaker | None:
    """The breaker row, locked, with the database's clock, if a trial is deciding it."""
    return (
        CircuitBreaker.objects.select_for_update()
        .annotate(db_now=Now())
        .filter(name=PROCESSOR, state=BreakerState.HALF_OPEN)
        .first()
    )


def breaker_reopen(*, error: str) -> None:
    with transaction.atomic():
        breaker = _half_open_locked()
        if breaker is None:
            return
        reopen_count = breaker.reopen_count + 1
        pause = pause_seconds(reopen_count)
        CircuitBreaker.objects.filter(name=PROCESSOR).update(
            state=BreakerState.OPEN,
            reopen_count=reopen_count,
            open_until=db_in(pause),
            probe_until=None,
            trial_admitted=0,
            trial_succeeded=0,
            last_error=error[:2000],
        )
        CircuitBreakerTransition.objects.create(
            breaker=breaker,
            kind=BreakerTransitionKind.REOPENED,
            reason=error[:2000],
            pause_seconds=pause,
        )
    logger.error("processor breaker open again for %.0f s: %s", pause, error)
    _alert_unavailable(opened_at=breaker.opened_at or breaker.db_now, reason=error)


def breaker_trial_succeeded() -> None:
    CircuitBreaker.objects.filter(name=PROCESSOR, state=BreakerState.HALF_OPEN).update(
        trial_succeeded=F("trial_succeeded") + 1
    )
    _close(reason=f"{trial_calls()} trial submission(s) succeeded", succeeded_at_least=None)


def processor_breaker_close_when_trials_done() -> bool:
    """Close a half-open breaker whose admitted trials all succeeded, though fewer than the
    trial's size: the queue layer calls this when no submission is left waiting, so no more
    trials will come. False when no trial succeeded yet, or one is still out."""
    return _close(
        reason="every waiting submission went through: the trial calls all succeeded",
        succeeded_at_least=1,
    )


def _close(*, reason: str, succeeded_at_least: int | None) -> bool:
    """Close a half-open breaker once ``succeeded_at_least`` trials succeeded (None: the
    trial's size) and every admitted one did. The incident stays open for its cool-down."""
    with transaction.atomic():
        breaker = _half_open_locked()
        if breaker is None:
            return False
        needed = trial_calls() if succeeded_at_least is None else succeeded_at_least
        if breaker.trial_succeeded < needed or breaker.trial_succeeded < breaker.trial_admitted:
            return False
        floor = ProcessorAttempt.objects.aggregate(top=Max("pk"))["top"] or 0
        CircuitBreaker.objects.filter(name=PROCESSOR).update(
            state=BreakerState.CLOSED,
            consecutive_failures=0,
            open_until=None,
            probe_until=None,
            trial_admitted=0,
            trial_succeeded=0,
            closed_at=Now(),
            # The calls that opened it no longer count toward the failure rate.
            window_after_attempt=floor,
        )
        CircuitBreakerTransition.objects.create(
            breaker=breaker, kind=BreakerTransitionKind.CLOSED, reason=reason
        )
    lasted = (breaker.db_now - breaker.opened_at).total_seconds() if breaker.opened_at else 0.0
    logger.warning("processor breaker closed %.0f s into the incident: %s", lasted, reason)
    return True


def processor_breaker_incident_end() -> bool:
    """End the incident of a breaker that has stayed closed for the cool-down: resolve the
    alert. Cheap when there is nothing to end (one conditional UPDATE); the workers' loop and
    the periodic alert evaluation call it."""
    cooldown = float(payments_conf.PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS)
    with transaction.atomic():
        breaker = (
            CircuitBreaker.objects.select_for_update()
            .annotate(db_now=Now())
            .filter(
                name=PROCESSOR,
                state=BreakerState.CLOSED,
                opened_at__isnull=False,
                closed_at__lte=Now() - timedelta(seconds=cooldown),
            )
            .first()
        )
        if breaker is None:
            return False
        CircuitBreaker.objects.filter(name=PROCESSOR).update(opened_at=None, reopen_count=0)
        lasted = ((breaker.closed_at or breaker.db_now) - breaker.opened_at).total_seconds()
        reason = (
            f"processor available again: the incident lasted {lasted:.0f} s "
            f"({breaker.reopen_count} reopening(s)), then {cooldown:.0f} s closed without "
            "opening again"
        )
        CircuitBreakerTransition.objects.create(
            breaker=breaker, kind=BreakerTransitionKind.RESOLVED, reason=reason
        )
    logger.warning("processor breaker incident over: %s", reason)
    alert_clear(key=ALERT_KEY, reason=reason)
    return True


def processor_breaker_pause(*, seconds: float, reason: str) -> bool:
    """Pause every caller for ``seconds`` (a 429's Retry-After); True if this extended it.

    Capped at ``PROCESSOR_BREAKER_MAX_PAUSE_SECONDS``: a wrong or hostile Retry-After (a day,
    a year) must not stop every submission for that long; after the cap the next call asks again.
    """
    cap = max_pause_seconds()
    if seconds > cap:
        logger.warning("Retry-After of %.0f s capped at %.0f s", seconds, cap)
        seconds = cap
    seconds = max(0.0, seconds)
    with transaction.atomic():
        processor_breaker_get()
        extended = (
            CircuitBreaker.objects.filter(name=PROCESSOR)
            .filter(Q(paused_until__isnull=True) | Q(paused_until__lt=db_in(seconds)))
            .update(paused_until=db_in(seconds))
        )
        if extended:
            CircuitBreakerTransition.objects.create(
                breaker_id=PROCESSOR,
                kind=BreakerTransitionKind.PAUSED,
                reason=reason[:2000],
                pause_seconds=seconds,
            )
    if extended:
        logger.warning("processor calls paused for %.1f s (429 Retry-After)", seconds)
    return bool(extended)


def payments_waiting_count() -> int:
    return Payment.objects.filter(state=PaymentState.PENDING).count()


def alert_unavailable_summary(*, opened_at: datetime, waiting: int) -> str:
    return (
        f"processor unavailable since {opened_at:%Y-%m-%d %H:%M:%S} UTC: the circuit breaker "
        f"is open; {waiting} payment(s) waiting for submission (no attempts are spent while "
        "it is open; they are submitted in order once it closes)"
    )


def _alert_unavailable(*, opened_at: datetime, reason: str) -> None:
    waiting = payments_waiting_count()
    alert_raise(
        severity=AlertSeverity.HIGH,
        key=ALERT_KEY,
        summary=alert_unavailable_summary(opened_at=opened_at, waiting=waiting),
        details={
            "opened_at": opened_at.isoformat(),
            "payments_waiting": waiting,
            "last_error": reason[:500],
        },
    )
