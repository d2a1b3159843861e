"""A processor degraded for everyone, short of down: is a failed submission the payment's own
fault, or the processor's?

The breaker opens on a run of failures, or on a rate of first submissions; a processor that
fails about half its calls at low traffic may reach neither (each payment's retries meet the
failing half while other payments' first calls go through), and without more each payment
would spend its retry budget on it and reach a person. So a failed submission of a closed
breaker asks whether the processor fails *other* payments too:

- among the other payments of the last ``DEGRADED_WINDOW_CALLS`` submission calls (retries
  too, none older than ``PROCESSOR_BREAKER_WINDOW_SECONDS``, none from before the last close;
  409 and 429 say nothing), at least ``DEGRADED_MIN_PAYMENTS`` were called and at least
  ``DEGRADED_FAILURE_SHARE`` of them had a call fail: the failures are spread over payments,
  not one payment failing again and again (each payment counts once, however often it was
  retried);
- and at least ``DEGRADED_MIN_RECOVERED`` of them went through on a retry: the processor gave
  the same request (the same idempotency key) a failure and then an answer, so those failures
  were its own. Payments that fail on their own (a bad account answering 5xx) never go through,
  so however many of them fail at once they cannot make the processor look degraded to each
  other and keep one another from a person.

A payment's own calls never count toward its verdict. When the verdict is yes, the failure
spends no attempt: the queue layer parks the submission behind an outage hold for the
backoff a retry would have waited, and tries it again. When no: an ordinary retry, and after
the last one a dead letter, as before.

A failure can also be pinned to a payment rather than spread over payments: two backends
behind a round-robin balancer, one of them dead, fail every other call, and a payment's retries
can fall into step with the alternation and meet the dead backend every time while every
other payment's calls go through; a balancer that pins each connection to a backend fails
every call of the worker that holds a dead one. Judged by payments, each such failure looks
the payment's own. So a failed submission whose processor's previous call, another payment's,
went through (``failure_interleaved``: the failure interleaves with other payments'
successes) is made again at once on a new connection, under the same idempotency key
(``payments.services.submission``): one call later, or on another connection, it meets the
other backend. A payment that fails on its own fails that call too. One that goes through
on it is counted as recovered (its request got a failure, then an answer), and its success
asks the verdict below like a failure does: a balancer's flap is then one degradation, with
its alert, and no payment reaches a person for it.

The first such verdict marks the breaker degraded (``degraded_since``, a ``degraded``
transition) and raises the high alert ``processor.degraded``, even though the breaker may
never open; the degradation ends, and its alert resolves, once no failure was judged one for
``PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS``. Every time here is the database's clock.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models.functions import Now

from payments import conf as payments_conf
from payments.alerts import AlertSeverity, alert_clear, alert_raise
from payments.models import (
    AttemptOutcome,
    BreakerTransitionKind,
    CircuitBreaker,
    CircuitBreakerTransition,
    ProcessorAttempt,
)
from payments.processor.breaker.state import (
    DEGRADED_ALERT_KEY,
    DEGRADED_FAILURE_SHARE,
    DEGRADED_MIN_PAYMENTS,
    DEGRADED_MIN_RECOVERED,
    DEGRADED_WINDOW_CALLS,
    NOT_COUNTED_STATUSES,
    PROCESSOR,
    SUBMISSION,
    breaker_read,
)
from payments.processor.breaker.transitions import payments_waiting_count

logger = logging.getLogger(__name__)


def processor_degraded_reason(*, payment_id) -> str:
    """Why the processor's recent submissions say it fails other payments than ``payment_id``
    too, or "" when they do not. One query for the breaker and the clock, one bounded query
    (the last calls, by id) for the calls."""
    breaker, now = breaker_read()
    if breaker is None or now is None:
        return ""
    since = now - timedelta(seconds=float(payments_conf.PROCESSOR_BREAKER_WINDOW_SECONDS))
    recent = (
        ProcessorAttempt.objects.filter(operation=SUBMISSION, pk__gt=breaker.window_after_attempt)
        .exclude(payment_id=payment_id)
        .order_by("-pk")
        .values_list("payment_id", "outcome", "http_status", "attempt_number", "recorded_at")
    )
    called, failed, recovered = set(), set(), set()
    # The window's age is checked here, not in SQL: recorded_at has no index, and the newest
    # calls by id are what is wanted anyway.
    for payment, outcome, status, number, recorded_at in recent[:DEGRADED_WINDOW_CALLS]:
        if recorded_at < since or status in NOT_COUNTED_STATUSES:
            continue
        called.add(payment)
        if outcome == AttemptOutcome.RETRYABLE:
            failed.add(payment)
        elif number > 1:
            recovered.add(payment)  # answered on a retry: an earlier call of it failed
    if len(called) < DEGRADED_MIN_PAYMENTS or len(recovered) < DEGRADED_MIN_RECOVERED:
        return ""
    if len(failed) / len(called) < DEGRADED_FAILURE_SHARE:
        return ""
    return (
        f"calls failed for {len(failed)} of the {len(called)} other payments called lately, "
        f"{len(recovered)} of which went through on a retry"
    )


def failure_interleaved(*, payment_id, attempt_id: int) -> bool:
    """Whether the processor's submission call before the failed ``attempt_id`` (by id, 409s
    and 429s aside, since the last close and within the breaker's window) was another
    payment's, and went through."""
    breaker, now = breaker_read()
    if breaker is None or now is None:
        return False
    since = now - timedelta(seconds=float(payments_conf.PROCESSOR_BREAKER_WINDOW_SECONDS))
    previous = (
        ProcessorAttempt.objects.filter(
            operation=SUBMISSION, pk__gt=breaker.window_after_attempt, pk__lt=attempt_id
        )
        .exclude(http_status__in=NOT_COUNTED_STATUSES)
        .order_by("-pk")
        .values_list("payment_id", "outcome", "recorded_at")
        .first()
    )
    if previous is None:
        return False
    payment, outcome, recorded_at = previous
    return payment != payment_id and outcome != AttemptOutcome.RETRYABLE and recorded_at >= since


def processor_breaker_degraded(*, reason: str) -> bool:
    """Record that a failure was judged a degradation; the first one of a degradation writes
    the ``degraded`` transition and raises the high alert (after the commit). True for that
    first one."""
    with transaction.atomic():
        began = CircuitBreaker.objects.filter(name=PROCESSOR, degraded_since__isnull=True).update(
            degraded_since=Now(), degraded_seen_at=Now()
        )
        if not began:
            CircuitBreaker.objects.filter(name=PROCESSOR).update(degraded_seen_at=Now())
            return False
        CircuitBreakerTransition.objects.create(
            breaker_id=PROCESSOR, kind=BreakerTransitionKind.DEGRADED, reason=reason[:2000]
        )
        breaker = CircuitBreaker.objects.get(name=PROCESSOR)
    logger.error("processor degraded: %s", reason)
    _alert_degraded(since=breaker.degraded_since, reason=reason)
    return True


def processor_breaker_degraded_end() -> bool:
    """End a degradation no failure was judged part of for the incident cool-down: write the
    ``recovered`` transition and resolve the alert. The workers' loop and the periodic alert
    evaluation call it."""
    cooldown = float(payments_conf.PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS)
    with transaction.atomic():
        breaker = (
            CircuitBreaker.objects.select_for_update()
            .annotate(db_now=Now())
            .filter(
                name=PROCESSOR,
                degraded_since__isnull=False,
                degraded_seen_at__lte=Now() - timedelta(seconds=cooldown),
            )
            .first()
        )
        if breaker is None:
            return False
        CircuitBreaker.objects.filter(name=PROCESSOR).update(
            degraded_since=None, degraded_seen_at=None
        )
        lasted = (breaker.degraded_seen_at - breaker.degraded_since).total_seconds()
        reason = (
            f"processor no longer degraded: failures spread over payments for {lasted:.0f} s, "
            f"then none for {cooldown:.0f} s"
        )
        CircuitBreakerTransition.objects.create(
            breaker=breaker, kind=BreakerTransitionKind.RECOVERED, reason=reason
        )
    logger.warning("%s", reason)
    alert_clear(key=DEGRADED_ALERT_KEY, reason=reason)
    return True


def alert_degraded_summary(*, since: datetime, waiting: int) -> str:
    return (
        f"processor degraded since {since:%Y-%m-%d %H:%M:%S} UTC: its calls fail for many "
        f"payments while others go through; {waiting} payment(s) waiting for submission (a "
        "failure while it is degraded spends no retry: the payment waits its backoff and is "
        "tried again)"
    )


def _alert_degraded(*, since: datetime, reason: str) -> None:
    waiting = payments_waiting_count()
    alert_raise(
        severity=AlertSeverity.HIGH,
        key=DEGRADED_ALERT_KEY,
        summary=alert_degraded_summary(since=since, waiting=waiting),
        details={
            "degraded_since": since.isoformat(),
            "payments_waiting": waiting,
            "reason": reason[:500],
        },
    )
