"""The worker and the processor's circuit breaker: submissions wait, events flow, nothing pays.

Real local SQS, real sandbox processor over HTTP, PostgreSQL; the worker through its command.
"""

import io
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection
from django.utils import timezone
from prometheus_client import REGISTRY

from callbacks.models import (
    DeferredMessage,
    PaymentHold,
    ProcessingError,
    QueueMessage,
    QueueMessageStatus,
)
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
from payments.processor.breaker import PROCESSOR, processor_breaker_get, processor_breaker_wait
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


@contextmanager
def breaker_table_unreadable() -> Iterator[None]:
    """The breaker's table is gone for as long as the block runs (renamed, so its row and its
    constraints come back intact): every read of the breaker fails inside PostgreSQL."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE payments_circuitbreaker RENAME TO payments_circuitbreaker_away")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "ALTER TABLE payments_circuitbreaker_away RENAME TO payments_circuitbreaker"
            )


@contextmanager
def deferrals_refused() -> Iterator[None]:
    """PostgreSQL refuses every write of a deferred-message row while the block runs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION refuse_deferred_message() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION 'deferred messages refused'; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER refuse_deferred_message BEFORE INSERT OR UPDATE "
            "ON callbacks_deferredmessage FOR EACH ROW EXECUTE FUNCTION refuse_deferred_message()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER refuse_deferred_message ON callbacks_deferredmessage")
            cursor.execute("DROP FUNCTION refuse_deferred_message()")


def test_an_unreadable_breaker_makes_the_submission_a_counted_retry_then_it_submits_once(
    sqs_queues, sandbox, fast_retries
):
    payment = PaymentFactory(state=PaymentState.PENDING)
    processor_breaker_get()  # the row exists and is closed: only the database is in the way
    message_id = submit_message(sqs_queues, payment)

    with breaker_table_unreadable():
        with pytest.raises(DatabaseError):
            processor_breaker_wait()
        run_worker(max_messages=1)

        # It fell through to the normal path: started (one attempt), then the submission's own
        # breaker check failed the same way before any call, and that failure is on record.
        record = QueueMessage.objects.get(message_id=message_id)
        assert (record.status, record.attempts) == (QueueMessageStatus.RETRYING, 1)
        [error] = ProcessingError.objects.filter(message_id=message_id)
        assert error.error_class == "django.db.utils.ProgrammingError"
        assert 'relation "payments_circuitbreaker" does not exist' in error.message
        assert error.retryable
        assert not DeferredMessage.objects.exists()
        assert not ProcessorAttempt.objects.exists()
        assert sandbox.stats()["requests"] == {}
        # Not deleted, not dead-lettered: back on the queue after its (zero) backoff.
        assert queue_counts(sqs_queues.client, sqs_queues.url) == (1, 0)
        assert drain(sqs_queues.client, sqs_queues.dlq_url) == []

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    record.refresh_from_db()
    assert (record.status, record.attempts) == (QueueMessageStatus.DONE, 2)
    assert ProcessingError.objects.filter(message_id=message_id).count() == 1
    assert sandbox.stats()["charges_by_payment"] == {str(payment.id): 1}
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)
    assert not PaymentHold.objects.exists()


def test_a_deferral_that_cannot_be_recorded_hides_the_submission_only_for_the_pause(
    sqs_queues, sandbox
):
    payment = PaymentFactory(state=PaymentState.PENDING)
    message_id = submit_message(sqs_queues, payment)
    open_the_breaker(seconds=3)
    open_until = processor_breaker_get().open_until
    before = deferred_count("breaker_open")

    with deferrals_refused():
        run_worker()

        assert deferred_count("breaker_open") == before + 1
        # Deferred without a record: no row to release it early, no start, no attempt, no
        # error, no call.
        assert not DeferredMessage.objects.exists()
        assert not QueueMessage.objects.filter(message_id=message_id).exists()
        assert not ProcessingError.objects.exists()
        assert not ProcessorAttempt.objects.exists()
        assert sandbox.stats()["requests"] == {}
        assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 1)

        # Nobody could release it, so it must come back by itself when the pause is over, not
        # after the long hide of a recorded deferral (300 s). Peek with a zero visibility
        # timeout, which leaves it visible for the worker.
        deadline = time.monotonic() + 20
        back = []
        while not back:
            assert time.monotonic() < deadline, "the deferred submission did not come back"
            back = sqs_queues.client.receive_message(
                QueueUrl=sqs_queues.url, WaitTimeSeconds=1, VisibilityTimeout=0
            ).get("Messages", [])
        assert [m["MessageId"] for m in back] == [message_id]
        assert timezone.now() >= open_until  # and not before the pause was over

        # The pause is over: the worker's probe closes the breaker and the submission goes,
        # with deferral records still refused (a closed breaker needs none).
        deadline = time.monotonic() + 20
        while payment.state == PaymentState.PENDING and time.monotonic() < deadline:
            run_worker()
            payment.refresh_from_db()

    assert payment.state == PaymentState.SUBMITTED
    assert processor_breaker_get().state == BreakerState.CLOSED
    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.attempts) == (QueueMessageStatus.DONE, 1)
    assert not ProcessingError.objects.exists()
    assert sandbox.stats()["charges_by_payment"] == {str(payment.id): 1}
    assert sandbox.stats()["requests"]["debit_create"] == 1
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)
    assert drain(sqs_queues.client, sqs_queues.dlq_url) == []


def test_a_deferral_that_cannot_be_recorded_after_the_call_that_opened_the_breaker_loses_nothing(
    sqs_queues, sandbox, settings
):
    settings.PROCESSOR_BREAKER_FAILURES = 1  # the first failed call opens the breaker
    settings.PROCESSOR_BREAKER_PAUSE_SECONDS = 2
    settings.PROCESSOR_BREAKER_MAX_PAUSE_SECONDS = 2
    payment = PaymentFactory(state=PaymentState.PENDING)
    message_id = submit_message(sqs_queues, payment)
    sandbox.outage_start("503", 1)

    with deferrals_refused():
        run_worker(max_messages=1)

        # The call failed and opened the breaker: its failure stays in the history, but the
        # attempt was given back, and with no deferral record the hide is only the pause.
        assert processor_breaker_get().state == BreakerState.OPEN
        record = QueueMessage.objects.get(message_id=message_id)
        assert (record.status, record.attempts) == (QueueMessageStatus.RETRYING, 0)
        [error] = ProcessingError.objects.filter(message_id=message_id)
        assert error.error_class == "payments.exceptions.ProcessorCircuitOpen"
        assert not DeferredMessage.objects.exists()
        assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 1)
        deadline = time.monotonic() + 20
        back = []
        while not back:
            assert time.monotonic() < deadline, "the deferred submission did not come back"
            back = sqs_queues.client.receive_message(
                QueueUrl=sqs_queues.url, WaitTimeSeconds=1, VisibilityTimeout=0
            ).get("Messages", [])
        assert [m["MessageId"] for m in back] == [message_id]

        deadline = time.monotonic() + 20
        while payment.state == PaymentState.PENDING and time.monotonic() < deadline:
            run_worker()
            payment.refresh_from_db()

    assert payment.state == PaymentState.SUBMITTED
    record.refresh_from_db()
    assert (record.status, record.attempts) == (QueueMessageStatus.DONE, 1)
    assert sandbox.stats()["charges_by_payment"] == {str(payment.id): 1}
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)
    assert drain(sqs_queues.client, sqs_queues.dlq_url) == []
    assert not PaymentHold.objects.exists()
