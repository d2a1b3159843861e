"""Alert conditions: what ``alerts_evaluate`` checks, one function per condition.

A periodic task runs ``alerts_evaluate``: it reads the operations snapshot once, then runs each
function of ``CONDITIONS`` in turn; each fires its alert while its condition holds and resolves
it once it cleared (through ``triage.operations.alerting``, which decides what is sent and when).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from django.utils import timezone

from triage import conf as triage_conf
from triage.models import Alert, AlertSeverity, AlertStatus, DeadLetter, DeadLetterStatus
from triage.operations.alerting import AlertDecision, alert_fire, alert_resolve

if TYPE_CHECKING:
    from triage.operations.monitoring import OperationsSnapshot

# Keys of the conditions ``alerts_evaluate`` checks; any other key is a one-off event alert.
DLQ_DEPTH = "queue.dlq_not_empty"
DEAD_LETTERS_OPEN = "dead_letters.open"
BACKLOG = "queue.backlog"
QUEUE_UNREACHABLE = "queue.unreachable"
# Raised by the processor's circuit breaker when it opens, cleared when it closes; the
# evaluation keeps it firing (reminders) while the breaker is open.
PROCESSOR_UNAVAILABLE = "processor.unavailable"
# Raised by the breaker when a failure is judged a degradation (calls fail for many payments
# while others go through), cleared once none was for the cool-down; kept firing meanwhile.
PROCESSOR_DEGRADED = "processor.degraded"
BEAT_HEARTBEAT_STALE = "beat.heartbeat_stale"
CONDITION_KEYS = (
    DLQ_DEPTH,
    DEAD_LETTERS_OPEN,
    BACKLOG,
    QUEUE_UNREACHABLE,
    PROCESSOR_UNAVAILABLE,
    PROCESSOR_DEGRADED,
    BEAT_HEARTBEAT_STALE,
)
# Alerts raised per dead letter at ingestion: "dead_letter:<DeadLetter pk>".
DEAD_LETTER_PREFIX = "dead_letter:"


@dataclass(frozen=True)
class EvaluationResult:
    fired: dict[str, AlertDecision]  # key -> decision
    resolved: list[str]


@dataclass
class _Evaluation:
    """One evaluation run: the snapshot every condition reads, and what they fired or resolved."""

    now: datetime
    snapshot: OperationsSnapshot
    fired: dict[str, AlertDecision] = field(default_factory=dict)
    resolved: list[str] = field(default_factory=list)

    def fire(self, key: str, severity: str, summary: str, details: dict) -> None:
        self.fired[key] = alert_fire(
            key=key, severity=severity, summary=summary, details=details, now=self.now
        ).decision

    def resolve(self, key: str, reason: str) -> None:
        if alert_resolve(key=key, now=self.now, reason=reason) is not None:
            self.resolved.append(key)


def alerts_evaluate(*, now: datetime | None = None) -> EvaluationResult:
    """Check every alert condition once (``CONDITIONS``, in order): fire what holds, resolve
    what cleared."""
    from triage.operations.monitoring import operations_snapshot

    now = now or timezone.now()
    evaluation = _Evaluation(now=now, snapshot=operations_snapshot(now=now))
    for condition in CONDITIONS:
        condition(evaluation)
    return EvaluationResult(evaluation.fired, evaluation.resolved)


def _queue_unreachable(evaluation: _Evaluation) -> None:
    error = evaluation.snapshot.queue_error
    if error:
        evaluation.fire(
            QUEUE_UNREACHABLE,
            AlertSeverity.MEDIUM,
            f"cannot read queue attributes: {error}",
            {"error": error},
        )
    else:
        evaluation.resolve(QUEUE_UNREACHABLE, "queue attributes readable again")


def _dlq_depth(evaluation: _Evaluation) -> None:
    """Messages in the DLQ; unknown (neither fired nor resolved) while the queue is unreadable."""
    snapshot = evaluation.snapshot
    if snapshot.queue_error:
        return
    depth = snapshot.dlq_visible + snapshot.dlq_in_flight
    if depth > 0:
        evaluation.fire(
            DLQ_DEPTH,
            AlertSeverity.HIGH,
            f"{depth} message(s) in the dead-letter queue",
            {"visible": snapshot.dlq_visible, "in_flight": snapshot.dlq_in_flight},
        )
    else:
        evaluation.resolve(DLQ_DEPTH, "dead-letter queue empty")


def _dead_letters_open(evaluation: _Evaluation) -> None:
    count = evaluation.snapshot.open_dead_letters
    if count is None:
        return
    if count > 0:
        evaluation.fire(
            DEAD_LETTERS_OPEN,
            AlertSeverity.HIGH,
            f"{count} dead letter(s) waiting for a decision in triage",
            {"open": count},
        )
    else:
        evaluation.resolve(DEAD_LETTERS_OPEN, "no open dead letters")


def _backlog(evaluation: _Evaluation) -> None:
    """Too many visible messages, or too old an unfinished one (low: quiet in the settlement
    window); resolved only when the depth is known."""
    snapshot = evaluation.snapshot
    reasons = []
    visible_threshold = triage_conf.ALERT_BACKLOG_VISIBLE_MESSAGES
    if snapshot.main_visible is not None and snapshot.main_visible > visible_threshold:
        reasons.append(f"{snapshot.main_visible} visible messages (threshold {visible_threshold})")
    age_threshold = triage_conf.ALERT_BACKLOG_OLDEST_AGE.total_seconds()
    age = snapshot.oldest_unfinished_age
    if age is not None and age > age_threshold:
        reasons.append(
            f"oldest unfinished message is {age:.0f} s old (threshold {age_threshold:.0f} s)"
        )
    if reasons:
        evaluation.fire(
            BACKLOG,
            AlertSeverity.LOW,
            "queue backlog: " + "; ".join(reasons),
            {"visible": snapshot.main_visible, "oldest_unfinished_age_seconds": age},
        )
    elif snapshot.main_visible is not None:
        evaluation.resolve(BACKLOG, "backlog under thresholds")


def _processor_breaker(evaluation: _Evaluation) -> None:
    """While the breaker is open the alert keeps firing, so the reminder policy reminds about
    it with a fresh count of waiting payments; once the incident is over (closed for the
    cool-down) a leftover alert is resolved (one whose clearing was lost with a crashed
    process)."""
    from payments.models import BreakerState, CircuitBreaker
    from payments.processor.breaker import (
        PROCESSOR,
        alert_unavailable_summary,
        payments_waiting_count,
        processor_breaker_incident_end,
    )

    breaker = CircuitBreaker.objects.filter(name=PROCESSOR).first()
    if breaker is None or breaker.opened_at is None:
        evaluation.resolve(PROCESSOR_UNAVAILABLE, "processor breaker closed")
        return
    if breaker.state == BreakerState.CLOSED:
        # Closed, its incident in the cool-down: a reopening now is the same incident, so the
        # alert stays as it is until the incident ends (here, or in a worker's loop).
        if processor_breaker_incident_end():
            evaluation.resolve(PROCESSOR_UNAVAILABLE, "processor breaker incident over")
        return
    waiting = payments_waiting_count()
    evaluation.fire(
        PROCESSOR_UNAVAILABLE,
        AlertSeverity.HIGH,
        alert_unavailable_summary(opened_at=breaker.opened_at, waiting=waiting),
        {
            "opened_at": breaker.opened_at.isoformat(),
            "payments_waiting": waiting,
            "state": breaker.state,
            "last_error": breaker.last_error[:500],
        },
    )


def _processor_degraded(evaluation: _Evaluation) -> None:
    """While the processor is degraded the alert keeps firing (reminders, a fresh count of
    waiting payments); once no failure was judged a degradation for the cool-down it ends here
    or in a worker's loop, and a leftover alert is resolved."""
    from payments.models import CircuitBreaker
    from payments.processor.breaker import (
        PROCESSOR,
        alert_degraded_summary,
        payments_waiting_count,
        processor_breaker_degraded_end,
    )

    breaker = CircuitBreaker.objects.filter(name=PROCESSOR).first()
    if breaker is None or breaker.degraded_since is None or processor_breaker_degraded_end():
        evaluation.resolve(PROCESSOR_DEGRADED, "processor no longer degraded")
        return
    waiting = payments_waiting_count()
    evaluation.fire(
        PROCESSOR_DEGRADED,
        AlertSeverity.HIGH,
        alert_degraded_summary(since=breaker.degraded_since, waiting=waiting),
        {"degraded_since": breaker.degraded_since.isoformat(), "payments_waiting": waiting},
    )


def _beat_heartbeat(evaluation: _Evaluation) -> None:
    """Beat's heartbeat older than BEAT_HEARTBEAT_STALE_SECONDS (its age in database time).

    This runs from beat itself, so it cannot see beat stop (Prometheus does, from ``/metrics``:
    ``triage.operations.heartbeat``); it sees a beat that ticks while its heartbeat task fails
    or waits unread. High, as a stopped beat is: ingestion and this evaluation are beat's too.
    A heartbeat that never ran is unknown here (a first evaluation may come before it).
    """
    from triage.operations.heartbeat import heartbeat_age

    age = heartbeat_age()
    if age is None:
        return
    threshold = float(triage_conf.BEAT_HEARTBEAT_STALE_SECONDS)
    if age > threshold:
        evaluation.fire(
            BEAT_HEARTBEAT_STALE,
            AlertSeverity.HIGH,
            f"beat's heartbeat is {age:.0f} s old (threshold {threshold:.0f} s): periodic "
            "tasks may not be running",
            {"age_seconds": round(age), "threshold_seconds": threshold},
        )
    else:
        evaluation.resolve(BEAT_HEARTBEAT_STALE, "beat's heartbeat is fresh again")


def _dead_letters_decided(evaluation: _Evaluation) -> None:
    """One alert per dead letter (raised at ingestion): resolved once a human has decided."""
    firing = {
        key: key.split(":", 1)[1]
        for key in Alert.objects.filter(
            status=AlertStatus.FIRING, key__startswith=DEAD_LETTER_PREFIX
        ).values_list("key", flat=True)
    }
    if not firing:
        return
    ids = [pk for pk in firing.values() if pk.isdigit()]
    decided = dict(
        DeadLetter.objects.filter(pk__in=ids)
        .exclude(status=DeadLetterStatus.OPEN)
        .values_list("pk", "status")
    )
    for key, pk in firing.items():
        if pk.isdigit() and int(pk) in decided:
            evaluation.resolve(key, f"dead letter {pk} is {decided[int(pk)]}")


def _return_rates(evaluation: _Evaluation) -> None:
    """Merchants' return rates against the NACHA thresholds (one query over daily counters)."""
    from triage.operations.return_rates import return_rate_alerts_evaluate

    return_rates = return_rate_alerts_evaluate(now=evaluation.now)
    evaluation.fired.update(return_rates["fired"])
    evaluation.resolved.extend(return_rates["resolved"])


def _quiet_event_alerts(evaluation: _Evaluation) -> None:
    """Other one-off alerts (a rejected submission) resolve after a quiet period."""
    from triage.operations.return_rates import RETURN_RATE_PREFIX

    quiet_since = evaluation.now - triage_conf.ALERT_EVENT_QUIET_RESOLVE
    for key in (
        Alert.objects.filter(status=AlertStatus.FIRING, last_fired_at__lt=quiet_since)
        .exclude(key__in=CONDITION_KEYS)
        .exclude(key__startswith=DEAD_LETTER_PREFIX)
        .exclude(key__startswith=RETURN_RATE_PREFIX)
        .values_list("key", flat=True)
    ):
        evaluation.resolve(key, f"no repeat for {triage_conf.ALERT_EVENT_QUIET_RESOLVE}")


# The conditions ``alerts_evaluate`` checks, in order; each fires or resolves its own alerts.
CONDITIONS: tuple[Callable[[_Evaluation], None], ...] = (
    _queue_unreachable,
    _dlq_depth,
    _dead_letters_open,
    _backlog,
    _processor_breaker,
    _processor_degraded,
    _beat_heartbeat,
    _dead_letters_decided,
    _return_rates,
    _quiet_event_alerts,
)
