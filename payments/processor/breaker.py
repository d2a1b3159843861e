"""The circuit breaker around the processor: one shared state for every worker process.

A failing *message* spends its own retry budget and is dead-lettered; a failing *dependency*
must not make every message do that. The breaker tells them apart:

- closed: calls flow. Counted failures (5xx, 408, timeouts, connection errors, 401/403, a 2xx
  with an unusable body) raise ``consecutive_failures``; any answer from a working processor
  (2xx, a message-specific 4xx) resets it. It opens after ``PROCESSOR_BREAKER_FAILURES`` in a
  row, or when at least ``PROCESSOR_BREAKER_MIN_CALLS`` calls in the last
  ``PROCESSOR_BREAKER_WINDOW_SECONDS`` failed at ``PROCESSOR_BREAKER_FAILURE_RATE`` or more
  (counted from the ``ProcessorAttempt`` rows every call leaves).
- open: nobody calls until ``open_until``. Callers get ``ProcessorCircuitOpen`` before any
  HTTP call, which the worker turns into "hide the message for the rest of the pause", without
  counting an attempt.
- half-open: after the pause, exactly one caller claims the probe (a conditional UPDATE, so
  across processes one wins). Its success closes the breaker; its failure reopens it with the
  pause doubled, up to ``PROCESSOR_BREAKER_MAX_PAUSE_SECONDS``. A probe whose process died
  is given up after a lease (the client's timeouts plus a margin), and another is claimed.

Independently of the state, a 429 pauses every caller for its ``Retry-After`` (1 s without
one; at most the maximum pause) through ``paused_until``; it is not a failure, and no message
pays an attempt for it.

Every change of state is a conditional UPDATE (or runs under the row's lock) and writes a
``CircuitBreakerTransition`` row in the same transaction; opening raises the high alert
``processor.unavailable`` and closing clears it, after commit.
"""

from __future__ import annotations

import enum
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

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
# Retryable answers that say nothing about the processor's health: 409 (our own earlier request
# with this key is still running) and 429 (a pause of its own, not a failure).
NOT_COUNTED_STATUSES = (409, 429)
# While another caller's probe is in flight, look again this soon.
PROBE_RECHECK_SECONDS = 1.0
DEFAULT_429_PAUSE_SECONDS = 1.0
PROBE_LEASE_MARGIN_SECONDS = 5.0


def breaker_setting(name: str):
    return getattr(payments_conf, name)


class CallOutcome(enum.StrEnum):
    SUCCESS = "success"  # the processor answered as a working processor does (2xx, 4xx)
    FAILURE = "failure"  # counted: the processor is not working
    NEUTRAL = "neutral"  # says nothing either way (409 in progress, 429 handled as a pause)


@dataclass(frozen=True, kw_only=True)
class Admission:
    """May the caller call the processor now? ``probe``: this caller holds the half-open probe,
    and its outcome decides. ``wait_seconds``: how long to stay away when not allowed."""

    allowed: bool
    probe: bool
    wait_seconds: float
    state: str
    reason: str = ""


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


def _seconds_until(moment: datetime | None, now: datetime) -> float:
    if moment is None:
        return 0.0
    return max(0.0, (moment - now).total_seconds())


@dataclass(frozen=True)
class _Decision:
    """What the breaker row, as read, says to a caller."""

    wait_seconds: float
    reason: str
    probe_due: bool  # the pause is over: the next caller may claim the probe

    def admission(self, breaker: CircuitBreaker) -> Admission:
        """The answer to a caller that does not hold the probe."""
        return Admission(
            allowed=self.wait_seconds <= 0,
            probe=False,
            wait_seconds=self.wait_seconds,
            state=breaker.state,
            reason=self.reason,
        )


_PROBE_DUE = _Decision(wait_seconds=0.0, reason="", probe_due=True)


def _decision(breaker: CircuitBreaker, now: datetime) -> _Decision:
    paused = _seconds_until(breaker.paused_until, now)
    pause_reason = f"submissions paused by the processor's 429 Retry-After for {paused:.1f} s"
    if breaker.state == BreakerState.CLOSED:
        return _Decision(paused, pause_reason if paused else "", probe_due=False)
    since = f"{breaker.opened_at:%Y-%m-%d %H:%M:%S} UTC" if breaker.opened_at else "?"
    if breaker.state == BreakerState.OPEN:
        remaining = _seconds_until(breaker.open_until, now)
        if remaining > 0 or paused > 0:
            return _Decision(
                max(remaining, paused),
                f"processor breaker open since {since}; next probe in {remaining:.1f} s",
                probe_due=False,
            )
        return _PROBE_DUE
    lease = _seconds_until(breaker.probe_until, now)
    if lease > 0 or paused > 0:
        return _Decision(
            max(min(lease, PROBE_RECHECK_SECONDS), paused),
            f"processor breaker half-open since {since}: a probe call is deciding",
            probe_due=False,
        )
    return _PROBE_DUE


def processor_breaker_wait(*, now: datetime | None = None) -> Admission:
    """Read-only: may a caller go ahead (``allowed``), or how long must it stay away and why.
    Allowed also when the probe is due (``processor_breaker_admit`` then claims it or not). One
    query: cheap enough to ask before starting every submission."""
    now = now or timezone.now()
    breaker = CircuitBreaker.objects.filter(name=PROCESSOR).first()
    if breaker is None:
        return Admission(allowed=True, probe=False, wait_seconds=0.0, state=BreakerState.CLOSED)
    return _decision(breaker, now).admission(breaker)


def processor_breaker_admit(*, now: datetime | None = None) -> Admission:
    """Decide whether a processor call may go now; claims the half-open probe if it is due."""
    now = now or timezone.now()
    breaker = processor_breaker_get()
    decision = _decision(breaker, now)
    if not decision.probe_due:
        return decision.admission(breaker)
    lease = probe_lease_seconds()
    claimed = (
        CircuitBreaker.objects.filter(name=PROCESSOR)
        .filter(
            Q(state=BreakerState.OPEN, open_until__lte=now)
            | Q(state=BreakerState.HALF_OPEN, probe_until__lte=now)
            | Q(state=BreakerState.HALF_OPEN, probe_until__isnull=True)
        )
        .filter(Q(paused_until__isnull=True) | Q(paused_until__lte=now))
        .update(state=BreakerState.HALF_OPEN, probe_until=now + timedelta(seconds=lease))
    )
    if not claimed:
        # Another process took the probe (or closed the breaker) between our read and now.
        return _admit_after_race(now=now)
    CircuitBreakerTransition.objects.create(
        breaker_id=PROCESSOR,
        kind=BreakerTransitionKind.PROBING,
        reason=f"pause over: one probe call decides (lease {lease:.0f} s)",
    )
    logger.warning("processor breaker half-open: this call is the probe")
    return Admission(
        allowed=True, probe=True, wait_seconds=0.0, state=BreakerState.HALF_OPEN, reason="probe"
    )


def processor_breaker_probe(*, now: datetime | None = None) -> str:
    """When the pause is over, claim the probe and make it with a harmless read: the status of
    an idempotency key nobody uses (a working processor answers 404). Returns the state after.

    Workers call this from their loop, so an open breaker is probed on time even when every
    submission is hidden away; a submission that happens to come first may be the probe
    instead (``processor_breaker_admit`` hands the probe to one caller only).
    """
    from payments.processor.client import (
        ProcessorCallRejected,
        ProcessorCallUnavailable,
        get_client,
    )

    now = now or timezone.now()
    gate = processor_breaker_wait(now=now)
    if gate.state == BreakerState.CLOSED or not gate.allowed:
        return gate.state
    admission = processor_breaker_admit(now=now)
    if not admission.probe:
        return admission.state
    try:
        get_client().debit_get(idempotency_key=uuid.uuid4())
    except ProcessorCallRejected as exc:
        # It answered, and only refused the question: the processor works.
        call, outcome = exc.call, CallOutcome.SUCCESS
    except ProcessorCallUnavailable as exc:
        call = exc.call
        outcome = call_outcome(http_status=call.http_status, retryable=True, accepted=False)
    else:
        call, outcome = None, CallOutcome.SUCCESS
    logger.warning(
        "processor breaker probe (status read): %s%s",
        outcome,
        f" ({call.error})" if call is not None and call.error else "",
    )
    return processor_breaker_record(
        admission=admission,
        outcome=outcome,
        error=call.error if call is not None else "",
        retry_after=call.retry_after if call is not None else None,
        http_status=call.http_status if call is not None else None,
    )


def _admit_after_race(*, now: datetime) -> Admission:
    breaker = processor_breaker_get()
    decision = _decision(breaker, now)
    if breaker.state == BreakerState.CLOSED:
        return decision.admission(breaker)
    return Admission(
        allowed=False,
        probe=False,
        wait_seconds=max(decision.wait_seconds, PROBE_RECHECK_SECONDS),
        state=breaker.state,
        reason=decision.reason or "probe taken",
    )


def probe_lease_seconds() -> float:
    return (
        float(payments_conf.PROCESSOR_CONNECT_TIMEOUT_SECONDS)
        + float(payments_conf.PROCESSOR_TIMEOUT_SECONDS)
        + PROBE_LEASE_MARGIN_SECONDS
    )


def max_pause_seconds() -> float:
    return float(breaker_setting("PROCESSOR_BREAKER_MAX_PAUSE_SECONDS"))


def pause_seconds(reopen_count: int) -> float:
    """The open pause after ``reopen_count`` failed probes: doubling, capped."""
    base = float(breaker_setting("PROCESSOR_BREAKER_PAUSE_SECONDS"))
    cap = float(breaker_setting("PROCESSOR_BREAKER_MAX_PAUSE_SECONDS"))
    return min(cap, base * 2 ** min(reopen_count, 30))


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
    error: str = "",
    retry_after: float | None = None,
    http_status: int | None = None,
    now: datetime | None = None,
) -> str:
    """Record one call's outcome; returns the breaker state after it.

    Outside any transaction: it commits its own changes (the state is shared, a caller's
    rollback must not undo that the processor failed).
    """
    now = now or timezone.now()
    if http_status == 429:
        # Without a Retry-After the processor still said "too many": a short pause for all.
        seconds = retry_after if retry_after is not None else DEFAULT_429_PAUSE_SECONDS
        processor_breaker_pause(seconds=seconds, reason=error, now=now)
    if outcome == CallOutcome.SUCCESS:
        CircuitBreaker.objects.filter(name=PROCESSOR, consecutive_failures__gt=0).update(
            consecutive_failures=0
        )
        if admission.probe:
            _close(now=now, reason="the probe call succeeded")
            return _state()
        # A success admitted while closed: if the breaker opened meanwhile (this call started
        # before it did), it does not cut the pause short; the probe decides.
        return admission.state
    if outcome == CallOutcome.NEUTRAL:
        if admission.probe:
            # Undecided: give the probe back so the next caller probes at once.
            CircuitBreaker.objects.filter(name=PROCESSOR, state=BreakerState.HALF_OPEN).update(
                probe_until=now
            )
        return _state()
    if admission.probe:
        _reopen(now=now, error=error)
        return _state()
    updated = CircuitBreaker.objects.filter(name=PROCESSOR, state=BreakerState.CLOSED).update(
        consecutive_failures=F("consecutive_failures") + 1, last_error=error[:2000]
    )
    if not updated:
        return _state()  # already open or probing: the pause and the probe decide
    breaker = processor_breaker_get()
    threshold = int(breaker_setting("PROCESSOR_BREAKER_FAILURES"))
    if breaker.consecutive_failures >= threshold:
        _open(now=now, reason=f"{breaker.consecutive_failures} consecutive failures: {error}")
        return _state()
    rate_reason = _failure_rate_reason(now)
    if rate_reason:
        _open(now=now, reason=f"{rate_reason}: {error}")
    return _state()


def _failure_rate_reason(now: datetime) -> str:
    window = float(breaker_setting("PROCESSOR_BREAKER_WINDOW_SECONDS"))
    minimum = int(breaker_setting("PROCESSOR_BREAKER_MIN_CALLS"))
    rate = float(breaker_setting("PROCESSOR_BREAKER_FAILURE_RATE"))
    counts = ProcessorAttempt.objects.filter(
        started_at__gte=now - timedelta(seconds=window)
    ).aggregate(
        total=Count("pk"),
        failed=Count(
            "pk",
            filter=Q(outcome=AttemptOutcome.RETRYABLE) & ~Q(http_status__in=NOT_COUNTED_STATUSES),
        ),
    )
    total, failed = counts["total"], counts["failed"]
    if total >= minimum and total and failed / total >= rate:
        return f"{failed} of {total} calls failed in the last {window:.0f} s"
    return ""


def _state() -> str:
    return processor_breaker_get().state


def _open(*, now: datetime, reason: str) -> bool:
    pause = pause_seconds(0)
    with transaction.atomic():
        opened = CircuitBreaker.objects.filter(name=PROCESSOR, state=BreakerState.CLOSED).update(
            state=BreakerState.OPEN,
            opened_at=now,
            open_until=now + timedelta(seconds=pause),
            reopen_count=0,
            probe_until=None,
            last_error=reason[:2000],
        )
        if not opened:
            return False  # another process opened it first
        CircuitBreakerTransition.objects.create(
            breaker_id=PROCESSOR,
            kind=BreakerTransitionKind.OPENED,
            reason=reason[:2000],
            pause_seconds=pause,
        )
    logger.error("processor breaker opened for %.0f s: %s", pause, reason)
    _alert_unavailable(opened_at=now, reason=reason)
    return True


def _half_open_locked() -> CircuitBreaker | None:
    """The breaker row, locked, if a probe is deciding it (half-open); else None."""
    return (
        CircuitBreaker.objects.select_for_update()
        .filter(name=PROCESSOR, state=BreakerState.HALF_OPEN)
        .first()
    )


def _reopen(*, now: datetime, error: str) -> None:
    with transaction.atomic():
        breaker = _half_open_locked()
        if breaker is None:
            return
        breaker.reopen_count += 1
        pause = pause_seconds(breaker.reopen_count)
        breaker.state = BreakerState.OPEN
        breaker.open_until = now + timedelta(seconds=pause)
        breaker.probe_until = None
        breaker.last_error = error[:2000]
        breaker.save(
            update_fields=[
                "state",
                "reopen_count",
                "open_until",
                "probe_until",
                "last_error",
                "updated_at",
            ]
        )
        CircuitBreakerTransition.objects.create(
            breaker=breaker,
            kind=BreakerTransitionKind.REOPENED,
            reason=f"probe failed: {error}"[:2000],
            pause_seconds=pause,
        )
    logger.error("processor breaker probe failed; open again for %.0f s: %s", pause, error)
    _alert_unavailable(opened_at=breaker.opened_at or now, reason=error)


def _close(*, now: datetime, reason: str) -> bool:
    with transaction.atomic():
        breaker = _half_open_locked()
        if breaker is None:
            return False
        opened_at = breaker.opened_at
        breaker.state = BreakerState.CLOSED
        breaker.consecutive_failures = 0
        breaker.opened_at = breaker.open_until = breaker.probe_until = None
        breaker.reopen_count = 0
        breaker.save(
            update_fields=[
                "state",
                "consecutive_failures",
                "opened_at",
                "open_until",
                "probe_until",
                "reopen_count",
                "updated_at",
            ]
        )
        CircuitBreakerTransition.objects.create(
            breaker=breaker, kind=BreakerTransitionKind.CLOSED, reason=reason
        )
    lasted = (now - opened_at).total_seconds() if opened_at else 0.0
    logger.warning("processor breaker closed after %.0f s open: %s", lasted, reason)
    alert_clear(key=ALERT_KEY, reason=f"breaker closed after {lasted:.0f} s: {reason}")
    return True


def processor_breaker_pause(*, seconds: float, reason: str, now: datetime | None = None) -> bool:
    """Pause every caller for ``seconds`` (a 429's Retry-After); True if this extended it.

    Capped at ``PROCESSOR_BREAKER_MAX_PAUSE_SECONDS``: a wrong or hostile Retry-After (a day,
    a year) must not stop every submission for that long; after the cap the next call asks again.
    """
    now = now or timezone.now()
    cap = max_pause_seconds()
    if seconds > cap:
        logger.warning("Retry-After of %.0f s capped at %.0f s", seconds, cap)
        seconds = cap
    until = now + timedelta(seconds=max(0.0, seconds))
    with transaction.atomic():
        processor_breaker_get()
        extended = (
            CircuitBreaker.objects.filter(name=PROCESSOR)
            .filter(Q(paused_until__isnull=True) | Q(paused_until__lt=until))
            .update(paused_until=until)
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
