"""The circuit breaker around the processor: one shared state for every worker process.

A failing *message* spends its own retry budget and is dead-lettered; a failing *dependency*
must not make every message do that. The breaker tells them apart:

- closed: calls flow. Counted failures (5xx, 408, timeouts, connection errors, 401/403, a 2xx
  with an unusable body) raise ``consecutive_failures``; an answer of a working processor to a
  *submission* (2xx, a message-specific 4xx) resets it: a status read can succeed while debits
  fail, so it resets nothing. It opens after ``PROCESSOR_BREAKER_FAILURES`` in a row, or when
  ``PROCESSOR_BREAKER_FAILURE_RATE`` of the last ``PROCESSOR_BREAKER_WINDOW_CALLS`` first
  submissions of payments failed (none older than ``PROCESSOR_BREAKER_WINDOW_SECONDS``, none
  from before the last close; retries over-sample payments that fail on their own). A window
  of calls, not of time: a flapping processor (every other debit failing) opens it within a
  few failures however busy the healthy period before it was.
- open: nobody calls until ``open_until``. Callers get ``ProcessorCircuitOpen`` before any
  HTTP call; the queue layer takes such a submission off the queue until calls may flow.
- half-open: after the pause, ``PROCESSOR_BREAKER_TRIAL_CALLS`` real submissions are admitted
  (a conditional UPDATE hands out the slots, so across processes no more are). It closes once
  that many succeeded; one failure reopens it. The trial tests what failed, a debit, not a
  status read. A lease (the client's timeouts plus the time a released submission needs to
  come round) bounds a trial whose callers died: after it, a new one starts.
- one incident: closing does not end it. A reopening within
  ``PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS`` of the close belongs to the same incident: the
  pause keeps doubling (up to ``PROCESSOR_BREAKER_MAX_PAUSE_SECONDS``) and the high alert
  ``processor.unavailable``, raised once, stays firing. Only a close that lasts the cool-down
  resolves the incident and the alert.

Independently of the state, a 429 pauses every caller for its ``Retry-After`` (1 s without
one; at most the maximum pause) through ``paused_until``; it is not a failure.

Every time the breaker keeps (``opened_at``, ``open_until``, ``probe_until``, ``paused_until``,
``closed_at``, its transitions' ``created_at``) is the database's clock, and every comparison
with them is made by the database: a worker whose own clock is wrong can neither stretch a
pause past its cap nor ignore another worker's. Every change of state is a conditional UPDATE
(or runs under the row's lock) and writes a ``CircuitBreakerTransition`` row in the same
transaction; alerts are raised and cleared after commit.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import F, Max, Q
from django.db.models.functions import Now

from payments import conf as payments_conf
from payments.alerts import AlertSeverity, alert_clear, alert_raise
from payments.models import (
    AttemptOutcome,
    BreakerState,
    BreakerTransitionKind,
    CircuitBreaker,
    CircuitBreakerTransition,
    Payment,
    PaymentState,
    ProcessorAttempt,
)

logger = logging.getLogger(__name__)

PROCESSOR = "processor"
ALERT_KEY = "processor.unavailable"
# ProcessorAttempt.operation of a submission (a debit) and of a status read.
SUBMISSION = "submit"
STATUS_READ = "status"
# Retryable answers that say nothing about the processor's health: 409 (our own earlier request
# with this key is still running) and 429 (a pause of its own, not a failure).
NOT_COUNTED_STATUSES = (409, 429)
# While a trial is deciding, look again this soon.
PROBE_RECHECK_SECONDS = 1.0
DEFAULT_429_PAUSE_SECONDS = 1.0
# A trial submission is released from the database, queued and received before it calls: its
# lease covers that as well as the call.
TRIAL_LEASE_MARGIN_SECONDS = 10.0


class CallOutcome(enum.StrEnum):
    SUCCESS = "success"  # the processor answered as a working processor does (2xx, 4xx)
    FAILURE = "failure"  # counted: the processor is not working
    NEUTRAL = "neutral"  # says nothing either way (409 in progress, 429 handled as a pause)


@dataclass(frozen=True, kw_only=True)
class Admission:
    """May the caller call the processor now? ``trial``: this call is one of the half-open
    trial's, and its outcome counts toward closing or reopening. ``wait_seconds``: how long to
    stay away when not allowed."""

    allowed: bool
    trial: bool = False
    wait_seconds: float = 0.0
    state: str = BreakerState.CLOSED
    reason: str = ""
    incident: bool = False  # an incident is open (maybe closed, within its cool-down)


def processor_breaker_get() -> CircuitBreaker:
    """The processor's breaker row, created closed on first use."""
    breaker = CircuitBreaker.objects.filter(name=PROCESSOR).first()
    if breaker is not None:
        return breaker
    try:
        with transaction.atomic():
            return CircuitBreaker.objects.create(name=PROCESSOR)
    except IntegrityError:
        return CircuitBreaker.objects.get(name=PROCESSOR)


def _read() -> tuple[CircuitBreaker | None, datetime | None]:
    """The breaker row and the database's clock, in one query (no row: never used)."""
    breaker = CircuitBreaker.objects.annotate(db_now=Now()).filter(name=PROCESSOR).first()
    if breaker is None:
        return None, None
    return breaker, breaker.db_now


def _db_in(seconds: float):
    """An expression for the database's now plus ``seconds``."""
    return Now() + timedelta(seconds=seconds)


def _seconds_until(moment: datetime | None, now: datetime) -> float:
    if moment is None:
        return 0.0
    return max(0.0, (moment - now).total_seconds())


def trial_calls() -> int:
    return max(1, int(payments_conf.PROCESSOR_BREAKER_TRIAL_CALLS))


def _gate(breaker: CircuitBreaker | None, now: datetime | None, operation: str) -> Admission:
    """What the breaker row, as read, says to a caller that holds no trial slot. Allowed also
    when a trial slot may be had (``processor_breaker_admit`` then takes it or not)."""
    if breaker is None or now is None:
        return Admission(allowed=True)
    paused = _seconds_until(breaker.paused_until, now)
    since = f"{breaker.opened_at:%Y-%m-%d %H:%M:%S} UTC" if breaker.opened_at else "?"
    incident = breaker.opened_at is not None
    if breaker.state == BreakerState.CLOSED:
        reason = f"submissions paused by the processor's 429 Retry-After for {paused:.1f} s"
        return Admission(
            allowed=paused <= 0,
            wait_seconds=paused,
            state=breaker.state,
            reason=reason if paused else "",
            incident=incident,
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
        )
    return Admission(
        allowed=wait <= 0, wait_seconds=wait, state=breaker.state, reason=reason, incident=incident
    )


def processor_breaker_wait(*, operation: str = SUBMISSION) -> Admission:
    """Read-only: may a call of ``operation`` go ahead (``allowed``), or how long must it stay
    away and why. One query: cheap enough to ask before starting every submission."""
    breaker, now = _read()
    return _gate(breaker, now, operation)


def processor_breaker_admit(*, operation: str = SUBMISSION) -> Admission:
    """Decide whether a processor call may go now; in half-open, take a trial slot if one is
    free (starting the trial when the pause is over)."""
    breaker, now = _read()
    if breaker is None:
        processor_breaker_get()  # first use: one query per call after this
        breaker, now = _read()
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
    breaker, now = _read()
    after = _gate(breaker, now, operation)
    return Admission(
        allowed=False,
        wait_seconds=max(after.wait_seconds, PROBE_RECHECK_SECONDS),
        state=breaker.state,
        reason=after.reason or "the trial's calls are taken",
    )


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
            probe_until=_db_in(lease),
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


def trial_lease_seconds() -> float:
    return (
        float(payments_conf.PROCESSOR_CONNECT_TIMEOUT_SECONDS)
        + float(payments_conf.PROCESSOR_TIMEOUT_SECONDS)
        + TRIAL_LEASE_MARGIN_SECONDS
    )


def max_pause_seconds() -> float:
    return float(payments_conf.PROCESSOR_BREAKER_MAX_PAUSE_SECONDS)


def pause_seconds(reopen_count: int) -> float:
    """The open pause after ``reopen_count`` reopenings in one incident: doubling, capped."""
    base = float(payments_conf.PROCESSOR_BREAKER_PAUSE_SECONDS)
    return min(max_pause_seconds(), base * 2 ** min(reopen_count, 30))


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
        if operation == SUBMISSION:
            CircuitBreaker.objects.filter(name=PROCESSOR, consecutive_failures__gt=0).update(
                consecutive_failures=0
            )
        if admission.trial:
            _trial_succeeded()
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
        _reopen(error=f"trial submission failed: {error}")
        return _state()
    updated = CircuitBreaker.objects.filter(name=PROCESSOR, state=BreakerState.CLOSED).update(
        consecutive_failures=F("consecutive_failures") + 1, last_error=error[:2000]
    )
    if not updated:
        return _state()  # already open or half-open: the pause and the trial decide
    breaker = processor_breaker_get()
    threshold = int(payments_conf.PROCESSOR_BREAKER_FAILURES)
    if breaker.consecutive_failures >= threshold:
        _open(reason=f"{breaker.consecutive_failures} consecutive failures: {error}")
        return _state()
    rate_reason = _failure_rate_reason(breaker)
    if rate_reason:
        _open(reason=f"{rate_reason}: {error}")
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


def _open(*, reason: str) -> bool:
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
            open_until=_db_in(pause),
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


def _reopen(*, error: str) -> None:
    with transaction.atomic():
        breaker = _half_open_locked()
        if breaker is None:
            return
        reopen_count = breaker.reopen_count + 1
        pause = pause_seconds(reopen_count)
        CircuitBreaker.objects.filter(name=PROCESSOR).update(
            state=BreakerState.OPEN,
            reopen_count=reopen_count,
            open_until=_db_in(pause),
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


def _trial_succeeded() -> None:
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
            .filter(Q(paused_until__isnull=True) | Q(paused_until__lt=_db_in(seconds)))
            .update(paused_until=_db_in(seconds))
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
