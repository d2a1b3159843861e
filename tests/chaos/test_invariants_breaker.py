"""The chaos invariant of the processor's breaker: no dead letter for an outage alone."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from callbacks.models import ProcessingError, QueueMessage, QueueMessageStatus
from chaos.invariants.dead_letters import breaker_open_intervals
from payments.models import BreakerTransitionKind, CircuitBreakerTransition
from payments.processor.breaker import processor_breaker_get
from tests.chaos.histories import check
from triage.models import DeadLetter, DeadLetterSource

pytestmark = pytest.mark.django_db

UNAVAILABLE = "payments.exceptions.ProcessorUnavailable"


def incident(start, end=None) -> None:
    breaker = processor_breaker_get()
    opened = CircuitBreakerTransition.objects.create(
        breaker=breaker, kind=BreakerTransitionKind.OPENED
    )
    CircuitBreakerTransition.objects.filter(pk=opened.pk).update(created_at=start)
    if end is not None:
        closed = CircuitBreakerTransition.objects.create(
            breaker=breaker, kind=BreakerTransitionKind.CLOSED
        )
        CircuitBreakerTransition.objects.filter(pk=closed.pk).update(created_at=end)


def dead_submission(payment, error_times, *, error_class=UNAVAILABLE, ingested=False) -> str:
    now = timezone.now()
    message = QueueMessage.objects.create(
        message_id=f"msg-{uuid.uuid4()}",
        kind="submit_payment",
        group_id=str(payment.id),
        payment_id=str(payment.id),
        body={"kind": "submit_payment", "payment_id": str(payment.id)},
        first_started_at=now,
        last_started_at=now,
        attempts=len(error_times),
        status=QueueMessageStatus.DEAD_LETTERED,
        outcome="dead_lettered",
    )
    for number, at in enumerate(error_times, start=1):
        error = ProcessingError.objects.create(
            queue_message=message,
            payment_id=str(payment.id),
            message_id=message.message_id,
            attempt_number=number,
            error_class=error_class,
            message="HTTP 503",
            retryable=True,
        )
        ProcessingError.objects.filter(pk=error.pk).update(created_at=at)
    if ingested:
        DeadLetter.objects.create(
            original_message_id=message.message_id,
            dlq_message_id=f"dlq-{uuid.uuid4()}",
            payment_id=payment.id,
            kind="submit_payment",
            group_id=str(payment.id),
            body={"kind": "submit_payment"},
            source=DeadLetterSource.WORKER,
        )
    return message.message_id


def test_a_dead_letter_made_only_of_errors_while_the_breaker_was_open_fails(history):
    now = timezone.now()
    incident(now - timedelta(minutes=10), now - timedelta(minutes=1))
    payment = history["payments"]["held"]
    inside = [now - timedelta(minutes=m) for m in (9, 8, 7)]
    message_id = dead_submission(payment, inside, ingested=True)

    report = check(history)

    [violation] = report.violations_of("no_outage_dead_letters")
    assert violation.ids == (message_id,)
    assert "while the processor's breaker was open" in violation.detail


def test_a_dead_letter_still_counts_while_the_incident_is_not_closed(history):
    now = timezone.now()
    incident(now - timedelta(minutes=5))
    payment = history["payments"]["held"]
    message_id = dead_submission(payment, [now - timedelta(minutes=1)])

    report = check(history)

    assert report.violations_of("no_outage_dead_letters")[0].ids == (message_id,)


def test_a_dead_letter_with_failures_before_the_breaker_opened_passes(history):
    now = timezone.now()
    incident(now - timedelta(minutes=10), now - timedelta(minutes=1))
    payment = history["payments"]["held"]
    # Its budget was spent before the breaker opened: the breaker could not have helped.
    dead_submission(payment, [now - timedelta(minutes=m) for m in (30, 20, 9)])

    assert not check(history).violations_of("no_outage_dead_letters")


def test_a_dead_letter_with_an_error_of_its_own_passes(history):
    now = timezone.now()
    incident(now - timedelta(minutes=10), now - timedelta(minutes=1))
    payment = history["payments"]["held"]
    dead_submission(
        payment,
        [now - timedelta(minutes=8)],
        error_class="payments.exceptions.InvalidTransition",
    )

    report = check(history)

    assert not report.violations_of("no_outage_dead_letters")
    assert report.checked["no_outage_dead_letters"]["breaker incidents"] == 1


def test_open_intervals_pair_each_opening_with_its_closing():
    now = timezone.now()
    incident(now - timedelta(minutes=30), now - timedelta(minutes=20))
    incident(now - timedelta(minutes=5))

    intervals = breaker_open_intervals()

    assert intervals == [
        (now - timedelta(minutes=30), now - timedelta(minutes=20)),
        (now - timedelta(minutes=5), None),
    ]
