"""The worker and the processor's circuit breaker: submissions wait, events flow, nothing pays.

Real local SQS, real sandbox processor over HTTP, PostgreSQL; the worker through its command.
"""

import io
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from prometheus_client import REGISTRY

from callbacks.models import DeferredMessage, PaymentHold, ProcessingError, QueueMessage
from callbacks.reconciliation import payments_reconcile
from payments.models import (
    AttemptOutcome,
    BreakerState,
    CircuitBreaker,
    CircuitBreakerTransition,
    Payment,
    PaymentState,
    ProcessorAttempt,
)
from payments.processor.breaker import PROCESSOR, processor_breaker_get
from tests.callbacks.worker_support import (
    applied_events,
    drain,
    queue_counts,
    run_worker,
    send_body,
    send_event,
)
from tests.factories import PaymentFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def short_budget(settings):
    settings.WORKER_BACKOFF_BASE_SECONDS = 0
    settings.WORKER_BACKOFF_CAP_SECONDS = 0
    settings.WORKER_MAX_ATTEMPTS = 3
    settings.PROCESSOR_BREAKER_FAILURES = 2
    settings.PROCESSOR_BREAKER_PAUSE_SECONDS = 1
    settings.PROCESSOR_BREAKER_MAX_PAUSE_SECONDS = 2


def submit_message(sqs_queues, payment) -> str:
    body = {"kind": "submit_payment", "payment_id": str(payment.id)}
    return send_body(sqs_queues.client, sqs_queues.url, payment.id, body)


def open_the_breaker(seconds: float = 30) -> None:
    processor_breaker_get()
    now = timezone.now()
    CircuitBreaker.objects.filter(name=PROCESSOR).update(
        state=BreakerState.OPEN, opened_at=now, open_until=now + timedelta(seconds=seconds)
    )


def deferred_count(reason: str) -> float:
    return (
        REGISTRY.get_sample_value("payments_worker_messages_deferred_total", {"reason": reason})
        or 0.0
    )


def test_open_breaker_defers_a_submission_without_starting_it(sqs_queues, sandbox):
    payment = PaymentFactory(state=PaymentState.PENDING)
    message_id = submit_message(sqs_queues, payment)
    open_the_breaker(seconds=30)
    before = deferred_count("breaker_open")
    out = io.StringIO()

    call_command("run_sqs_worker", until_empty=True, wait_time=0, relay=False, stdout=out)

    assert deferred_count("breaker_open") == before + 1
    assert "1 deferred" in out.getvalue()

    # Not started: no attempt, no error, no call; hidden for the pause, not released.
    assert not QueueMessage.objects.filter(message_id=message_id).exists()
    assert not ProcessingError.objects.exists()
    assert not ProcessorAttempt.objects.exists()
    assert sandbox.stats()["requests"] == {}
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 1)
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING


def test_processor_events_are_applied_while_the_breaker_is_open(sqs_queues, sandbox):
    payment = PaymentFactory(state=PaymentState.PENDING)
    send_event(sqs_queues.client, sqs_queues.url, payment, "submitted")
    open_the_breaker(seconds=30)

    run_worker()

    assert applied_events(payment) == ["submitted"]
    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED


def test_outage_past_the_retry_budget_spends_no_budget_and_submits_once_after(
    sqs_queues, sandbox, short_budget, settings
):
    # 3 attempts allowed, backoff 0: without the breaker this message is dead-lettered within
    # a fraction of a second. The processor is down for 4 s, many pauses and probes long.
    settings.PROCESSOR_BREAKER_PAUSE_SECONDS = 0.5
    settings.PROCESSOR_BREAKER_MAX_PAUSE_SECONDS = 0.5
    payment = PaymentFactory(state=PaymentState.PENDING)
    message_id = submit_message(sqs_queues, payment)
    sandbox.outage_start("503", 4)
    ended = time.monotonic() + 4

    run_worker()  # fails twice, opens the breaker, defers the message: exits (no known end)
    assert processor_breaker_get().state == BreakerState.OPEN
    [deferred] = DeferredMessage.objects.filter(message_id=message_id)
    assert deferred.hidden_seconds >= 300  # hidden long: not handed out again and again
    while time.monotonic() < ended:
        run_worker()  # each run probes (and fails) when the pause is over
        time.sleep(0.2)
    probes = CircuitBreakerTransition.objects.filter(kind="reopened").count()
    assert probes >= 3
    # Through every failed probe the message stayed hidden: never received again.
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 1)

    deadline = time.monotonic() + 20
    while payment.state == PaymentState.PENDING and time.monotonic() < deadline:
        run_worker()  # the probe succeeds, the deferred message is released and submitted
        payment.refresh_from_db()

    assert payment.state == PaymentState.SUBMITTED
    record = QueueMessage.objects.get(message_id=message_id)
    assert record.status == "done"
    assert record.attempts <= settings.WORKER_MAX_ATTEMPTS
    assert not PaymentHold.objects.exists()
    assert not DeferredMessage.objects.exists()  # released, and forgotten
    assert drain(sqs_queues.client, sqs_queues.dlq_url) == []
    attempts = list(ProcessorAttempt.objects.filter(payment=payment).order_by("attempt_number"))
    assert [a.outcome for a in attempts] == [AttemptOutcome.RETRYABLE] * 2 + [
        AttemptOutcome.ACCEPTED
    ]
    assert sandbox.stats()["charges_by_payment"] == {str(payment.id): 1}
    # The failure that opened the breaker stays in the history, but gave its attempt back.
    assert ProcessingError.objects.filter(
        message_id=message_id, error_class="payments.exceptions.ProcessorCircuitOpen"
    ).exists()
    assert processor_breaker_get().state == BreakerState.CLOSED


def test_a_deferred_submission_is_released_as_soon_as_calls_may_flow(sqs_queues, sandbox):
    payment = PaymentFactory(state=PaymentState.PENDING)
    submit_message(sqs_queues, payment)
    open_the_breaker(seconds=30)
    run_worker()
    assert DeferredMessage.objects.get().hidden_seconds >= 300
    CircuitBreaker.objects.filter(name=PROCESSOR).update(
        state=BreakerState.CLOSED, opened_at=None, open_until=None
    )

    started = time.monotonic()
    run_worker()  # releases it at once instead of waiting out the long hide

    assert time.monotonic() - started < 20

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    [message] = QueueMessage.objects.filter(kind="submit_payment")
    assert message.attempts == 1


def test_429_retry_after_pauses_every_submission_without_spending_attempts(
    sqs_queues, sandbox, settings
):
    settings.WORKER_MAX_ATTEMPTS = 1  # an attempt spent on the 429 would dead-letter it
    throttled = PaymentFactory(state=PaymentState.PENDING, source_token="tok_429_1abcdef")
    other = PaymentFactory(state=PaymentState.PENDING, source_token="tok_good_account")
    throttled_id = submit_message(sqs_queues, throttled)
    run_worker(max_messages=1)  # the 429 arrives with Retry-After: 2
    pause = processor_breaker_get()
    assert pause.paused_until is not None and pause.state == BreakerState.CLOSED

    other_id = submit_message(sqs_queues, other)  # another payment, another message group
    run_worker()

    throttled.refresh_from_db()
    other.refresh_from_db()
    assert (throttled.state, other.state) == (PaymentState.SUBMITTED, PaymentState.SUBMITTED)
    for message_id in (throttled_id, other_id):
        record = QueueMessage.objects.get(message_id=message_id)
        assert (record.status, record.attempts) == ("done", 1)
    # The other payment waited for the pause too: one pause for every caller.
    [other_call] = ProcessorAttempt.objects.filter(payment=other)
    assert other_call.started_at >= pause.paused_until - timedelta(milliseconds=50)
    assert not PaymentHold.objects.exists()


def test_a_message_specific_rejection_still_fails_the_payment_at_once(
    sqs_queues, sandbox, short_budget
):
    payment = PaymentFactory(state=PaymentState.PENDING, source_token="tok_reject_closed")
    submit_message(sqs_queues, payment)

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.FAILED
    breaker = processor_breaker_get()
    assert (breaker.state, breaker.consecutive_failures) == (BreakerState.CLOSED, 0)


def test_until_empty_does_not_wait_for_submissions_deferred_by_an_open_breaker(sqs_queues, sandbox):
    payment = PaymentFactory(state=PaymentState.PENDING)
    submit_message(sqs_queues, payment)
    open_the_breaker(seconds=600)

    started = time.monotonic()
    run_worker()

    assert time.monotonic() - started < 10
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 1)


def test_reconciliation_makes_no_status_call_while_the_breaker_is_open(sqs_queues, sandbox):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    Payment.objects.filter(pk=payment.pk).update(
        state_changed_at=timezone.now() - timedelta(days=10)
    )
    open_the_breaker(seconds=30)

    payments_reconcile()

    assert not ProcessorAttempt.objects.exists()
    assert sandbox.stats()["requests"] == {}

    # Once the pause is over, the same run checks the payment (the call is the probe).
    CircuitBreaker.objects.filter(name=PROCESSOR).update(open_until=timezone.now())
    payments_reconcile()

    assert ProcessorAttempt.objects.filter(payment=payment, operation="status").count() == 1
    assert processor_breaker_get().state == BreakerState.CLOSED
