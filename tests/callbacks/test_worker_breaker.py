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
from django.db.models.functions import Now
from django.utils import timezone
from prometheus_client import REGISTRY

from callbacks.models import (
    HoldKind,
    ParkedMessage,
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
from payments.processor.breaker import (
    DEGRADED_ALERT_KEY,
    PROCESSOR,
    processor_breaker_get,
    processor_breaker_wait,
)
from tests.callbacks.worker_support import (
    applied_events,
    applied_moves,
    drain,
    queue_counts,
    run_worker,
    send_body,
    send_event,
)
from tests.factories import PaymentFactory, ProcessorAttemptFactory, open_breaker
from triage.models import Alert

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def short_budget(module_settings):
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0
    module_settings.WORKER_MAX_ATTEMPTS = 3
    module_settings.PROCESSOR_BREAKER_FAILURES = 2
    module_settings.PROCESSOR_BREAKER_PAUSE_SECONDS = 1
    module_settings.PROCESSOR_BREAKER_MAX_PAUSE_SECONDS = 2


def submit_message(sqs_queues, payment) -> str:
    body = {"kind": "submit_payment", "payment_id": str(payment.id)}
    return send_body(sqs_queues.client, sqs_queues.url, payment.id, body)


def close_the_breaker() -> None:
    CircuitBreaker.objects.filter(name=PROCESSOR).update(
        state=BreakerState.CLOSED, opened_at=None, open_until=None
    )


def outage_holds() -> list[PaymentHold]:
    return list(PaymentHold.objects.filter(kind=HoldKind.OUTAGE, released_at__isnull=True))


def deferred_count(reason: str) -> float:
    return (
        REGISTRY.get_sample_value("payments_worker_messages_deferred_total", {"reason": reason})
        or 0.0
    )


def test_open_breaker_parks_a_submission_off_the_queue_without_starting_it(sqs_queues, sandbox):
    payment = PaymentFactory(state=PaymentState.PENDING)
    message_id = submit_message(sqs_queues, payment)
    open_breaker()
    before = deferred_count("breaker_open")
    out = io.StringIO()

    call_command("run_sqs_worker", until_empty=True, wait_time=0, relay=False, stdout=out)

    assert deferred_count("breaker_open") == before + 1
    assert "1 deferred" in out.getvalue()
    # Off the queue (so no outage, however long, hands it out again), in the database behind
    # an outage hold of its payment: no attempt, no error, no call.
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)
    [hold] = outage_holds()
    assert hold.payment_id == str(payment.id) and hold.caused_by is None
    assert "waits for the processor" in hold.reason
    [parked] = ParkedMessage.objects.filter(hold=hold)
    assert parked.message_id == message_id and parked.kind == "submit_payment"
    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.attempts) == (QueueMessageStatus.PARKED, 0)
    assert not ProcessingError.objects.exists()
    assert not ProcessorAttempt.objects.exists()
    assert sandbox.stats()["requests"] == {}
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING


def test_processor_events_are_applied_while_the_breaker_is_open(sqs_queues, sandbox):
    payment = PaymentFactory(state=PaymentState.PENDING)
    send_event(sqs_queues.client, sqs_queues.url, payment, "submitted")
    open_breaker()

    run_worker()

    assert applied_events(payment) == ["submitted"]
    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED


def test_outage_past_the_retry_budget_spends_no_budget_and_submits_once_after(
    sqs_queues, sandbox, short_budget, module_settings
):
    # 3 attempts allowed, backoff 0: without the breaker this message is dead-lettered within
    # a fraction of a second. The processor is down for 4 s, many pauses and trials long.
    module_settings.PROCESSOR_BREAKER_PAUSE_SECONDS = 0.5
    module_settings.PROCESSOR_BREAKER_MAX_PAUSE_SECONDS = 0.5
    payment = PaymentFactory(state=PaymentState.PENDING)
    message_id = submit_message(sqs_queues, payment)
    sandbox.outage_start("503", 4)

    run_worker()  # fails twice, opens the breaker, parks the message: exits (no known end)
    assert processor_breaker_get().state == BreakerState.OPEN
    [hold] = outage_holds()
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)

    deadline = time.monotonic() + 30
    while payment.state == PaymentState.PENDING and time.monotonic() < deadline:
        run_worker()  # trials fail and reopen it; then one succeeds and the hold is released
        time.sleep(0.2)
        payment.refresh_from_db()

    assert payment.state == PaymentState.SUBMITTED
    assert CircuitBreakerTransition.objects.filter(kind="reopened").count() >= 1
    original = QueueMessage.objects.get(message_id=message_id)
    assert original.status == QueueMessageStatus.PARKED and original.attempts <= 3
    # Every copy the releases sent was received once and either parked again (a failed trial)
    # or done (the one that went through), never retried: no receive spent waiting.
    copies = QueueMessage.objects.filter(kind="submit_payment").exclude(message_id=message_id)
    assert set(copies.values_list("status", flat=True)) <= {"parked", "done"}
    assert copies.filter(status="done").count() == 1
    assert not PaymentHold.objects.filter(released_at__isnull=True).exists()
    assert drain(sqs_queues.client, sqs_queues.dlq_url) == []
    outcomes = list(
        ProcessorAttempt.objects.filter(payment=payment, operation="submit")
        .order_by("attempt_number")
        .values_list("outcome", flat=True)
    )
    assert outcomes[:2] == [AttemptOutcome.RETRYABLE] * 2 and outcomes[-1] == "accepted"
    assert sandbox.stats()["charges_by_payment"] == {str(payment.id): 1}
    # The failure that opened the breaker stays in the history, but gave its attempt back.
    assert ProcessingError.objects.filter(
        message_id=message_id, error_class="payments.exceptions.ProcessorCircuitOpen"
    ).exists()
    assert processor_breaker_get().state == BreakerState.CLOSED


def test_a_parked_submission_goes_back_as_soon_as_calls_may_flow(sqs_queues, sandbox):
    payment = PaymentFactory(state=PaymentState.PENDING)
    submit_message(sqs_queues, payment)
    open_breaker()
    run_worker()
    assert len(outage_holds()) == 1
    close_the_breaker()

    run_worker()  # the tick releases the outage hold; the submission goes

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    assert outage_holds() == []
    [done] = QueueMessage.objects.filter(kind="submit_payment", status="done")
    assert done.attempts == 1
    assert sandbox.stats()["charges_by_payment"] == {str(payment.id): 1}


def test_a_payments_later_messages_wait_behind_its_parked_submission_in_order(sqs_queues, sandbox):
    payment = PaymentFactory(state=PaymentState.PENDING)
    submit_message(sqs_queues, payment)
    open_breaker()
    run_worker()
    # The processor's callbacks arrive while the submission waits (an earlier try charged).
    send_event(sqs_queues.client, sqs_queues.url, payment, "submitted")
    send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    run_worker()
    [hold] = outage_holds()
    assert list(hold.parked.values_list("kind", flat=True)) == [
        "submit_payment",
        "processor_event",
        "processor_event",
    ]
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING  # nothing overtook the submission
    close_the_breaker()

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert applied_events(payment) == ["settled"]  # "submitted" found it submitted: stale
    assert not ProcessingError.objects.exists()


def test_the_half_open_trial_releases_only_its_size_then_the_rest_after_the_close(
    sqs_queues, sandbox, module_settings
):
    module_settings.PROCESSOR_BREAKER_TRIAL_CALLS = 2
    payments = PaymentFactory.create_batch(5, state=PaymentState.PENDING)
    for payment in payments:
        submit_message(sqs_queues, payment)
    open_breaker()
    run_worker()
    assert len(outage_holds()) == 5
    CircuitBreaker.objects.filter(name=PROCESSOR).update(open_until=Now())

    run_worker()

    assert {p.state for p in Payment.objects.all()} == {PaymentState.SUBMITTED}
    kinds = list(CircuitBreakerTransition.objects.values_list("kind", flat=True))
    assert kinds == ["probing", "closed"]
    first_two = ProcessorAttempt.objects.order_by("id")[:2]
    closed = CircuitBreakerTransition.objects.get(kind="closed")
    assert all(a.started_at <= closed.created_at for a in first_two)
    assert sandbox.stats()["requests"]["debit_create"] == 5
    assert outage_holds() == []


def test_a_dead_letter_of_a_payment_waiting_for_the_processor_makes_it_wait_for_a_person():
    from callbacks.services import payment_hold

    outage = payment_hold(payment_id="p-1", reason="waits for the processor", kind=HoldKind.OUTAGE)
    triage = payment_hold(payment_id="p-1", reason="dead-lettered")
    again = payment_hold(payment_id="p-1", reason="waits again", kind=HoldKind.OUTAGE)

    assert outage.pk == triage.pk == again.pk
    again.refresh_from_db()
    assert again.kind == HoldKind.TRIAGE and "dead-lettered" in again.reason


def test_429_retry_after_pauses_every_submission_without_spending_attempts(
    sqs_queues, sandbox, module_settings
):
    module_settings.WORKER_MAX_ATTEMPTS = 1  # an attempt spent on the 429 would dead-letter it
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
    for payment, message_id in ((throttled, throttled_id), (other, other_id)):
        # Each waited off the queue through the pause, then went as a copy: one attempt paid.
        assert QueueMessage.objects.get(message_id=message_id).status == "parked"
        [done] = QueueMessage.objects.filter(group_id=payment.id, status="done")
        assert done.attempts == 1
    # The other payment waited for the pause too: one pause for every caller.
    [other_call] = ProcessorAttempt.objects.filter(payment=other)
    assert other_call.started_at >= pause.paused_until - timedelta(milliseconds=50)
    assert not PaymentHold.objects.filter(released_at__isnull=True).exists()


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


def test_until_empty_does_not_wait_for_submissions_parked_by_an_open_breaker(sqs_queues, sandbox):
    payment = PaymentFactory(state=PaymentState.PENDING)
    submit_message(sqs_queues, payment)
    open_breaker(open_for=timedelta(seconds=600))

    started = time.monotonic()
    run_worker()

    assert time.monotonic() - started < 10
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)
    assert len(outage_holds()) == 1


def test_reconciliation_makes_no_status_call_until_the_breaker_closes(sqs_queues, sandbox):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    Payment.objects.filter(pk=payment.pk).update(
        state_changed_at=timezone.now() - timedelta(days=10)
    )
    open_breaker()

    payments_reconcile()
    # The pause is over: still no status read, which cannot show that debits work again.
    CircuitBreaker.objects.filter(name=PROCESSOR).update(open_until=Now())
    payments_reconcile()

    assert not ProcessorAttempt.objects.exists()
    assert sandbox.stats()["requests"] == {}

    close_the_breaker()
    payments_reconcile()

    assert ProcessorAttempt.objects.filter(payment=payment, operation="status").count() == 1


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
def parking_refused() -> Iterator[None]:
    """PostgreSQL refuses every write of a parked message while the block runs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION refuse_parked_message() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION 'parked messages refused'; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER refuse_parked_message BEFORE INSERT OR UPDATE "
            "ON callbacks_parkedmessage FOR EACH ROW EXECUTE FUNCTION refuse_parked_message()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER refuse_parked_message ON callbacks_parkedmessage")
            cursor.execute("DROP FUNCTION refuse_parked_message()")


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
        assert not ParkedMessage.objects.exists()
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


def test_a_deferral_that_cannot_be_parked_hides_the_submission_only_for_the_pause(
    sqs_queues, sandbox
):
    payment = PaymentFactory(state=PaymentState.PENDING)
    message_id = submit_message(sqs_queues, payment)
    open_breaker(open_for=timedelta(seconds=3))
    open_until = processor_breaker_get().open_until

    with parking_refused():
        run_worker()

        # Not parked: no hold, no attempt, no error, no call; hidden on the queue instead.
        assert not PaymentHold.objects.exists()
        assert not ProcessingError.objects.exists()
        assert not ProcessorAttempt.objects.exists()
        assert sandbox.stats()["requests"] == {}
        assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 1)

        # Nobody could release it, so it must come back by itself when the pause is over.
        deadline = time.monotonic() + 20
        back = []
        while not back:
            assert time.monotonic() < deadline, "the deferred submission did not come back"
            back = sqs_queues.client.receive_message(
                QueueUrl=sqs_queues.url, WaitTimeSeconds=1, VisibilityTimeout=0
            ).get("Messages", [])
        assert [m["MessageId"] for m in back] == [message_id]
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement_timestamp()")
            assert cursor.fetchone()[0] >= open_until  # and not before the pause was over

        # The pause is over: it is the trial, which succeeds and closes the breaker.
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
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)
    assert drain(sqs_queues.client, sqs_queues.dlq_url) == []


def test_a_copy_deferred_before_its_release_marked_it_sent_is_not_lost(sqs_queues, sandbox):
    """The release sends a parked submission, then marks its row sent. A worker may receive
    the copy in between and find the processor unavailable again: the copy must wait in its
    hold once more, and the half-done release may neither mark its row sent nor lift it."""
    from callbacks import sqs
    from callbacks.services import RELEASE_MARK, hold_release, parked_message_republish

    payment = PaymentFactory(state=PaymentState.PENDING)
    submit_message(sqs_queues, payment)
    open_breaker()
    run_worker()
    [hold] = outage_holds()
    [row] = hold.parked.all()
    # The release, half done: the copy is on the queue, its row not yet marked.
    sqs.send_message_now(
        body=row.body,
        group_id=row.payment_id,
        deduplication_id=f"{row.message_id}{RELEASE_MARK}{hold.pk}",
    )

    run_worker()  # the copy arrives while the breaker is still open: deferred again

    # The same hold waits again, its release a round further, on the same unsent row.
    [waiting] = outage_holds()
    assert waiting.pk == hold.pk and waiting.release_round == 1
    assert list(waiting.parked.values_list("pk", "republished_message_id")) == [(row.pk, "")]
    # The release that was half done (round 0) can neither mark the row sent nor lift the hold.
    assert not parked_message_republish(row=row, hold=hold, release_round=0)
    assert PaymentHold.objects.get(pk=hold.pk).released_at is None
    close_the_breaker()

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    assert outage_holds() == []
    assert sandbox.stats()["charges_by_payment"] == {str(payment.id): 1}
    assert hold_release(payment_id=payment.id, released_by="test", note="") == 0


def test_a_flapping_breaker_keeps_one_hold_and_one_row_per_message_of_an_outage(
    sqs_queues, sandbox, module_settings
):
    """An outage whose releases land again and again while the processor is unavailable (the
    breaker reopened, or still probing with its trial slots taken): each payment keeps one
    hold and each parked message one row, however many rounds; each round sends each held
    message once; in the end every payment is submitted once, in order with its later event."""
    from callbacks import sqs
    from callbacks.services import outage_holds_release

    module_settings.OUTAGE_RELEASE_PER_SECOND = 1000
    payments = PaymentFactory.create_batch(6, state=PaymentState.PENDING)
    for payment in payments:
        submit_message(sqs_queues, payment)
    # One payment also has a later message parked behind its submission.
    send_event(sqs_queues.client, sqs_queues.url, payments[0], "settled")
    open_breaker()
    run_worker()
    assert len(outage_holds()) == 6 and ParkedMessage.objects.count() == 7
    sent = []
    original_send = sqs.send_message_now

    def counting_send(**kwargs):
        sent.append(kwargs["deduplication_id"])
        return original_send(**kwargs)

    rounds = 5
    for flap in range(rounds):
        # Half the rounds, a trial: half-open with its slots already taken by others; the
        # other half, the trial failed and the breaker reopened before the copies land.
        if flap % 2:
            CircuitBreaker.objects.filter(name=PROCESSOR).update(
                state=BreakerState.HALF_OPEN,
                probe_until=Now() + timedelta(seconds=30),
                trial_admitted=10,
            )
        else:
            open_breaker()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sqs, "send_message_now", counting_send)
            outage_holds_release(limit=100, trial=True)
        run_worker()  # every copy meets the processor unavailable: parked again

        assert len(outage_holds()) == 6
        assert PaymentHold.objects.count() == 6
        assert ParkedMessage.objects.count() == 7
        assert ParkedMessage.objects.filter(republished_message_id="").count() == 7

    # Each round sent each held message once, each under a deduplication id of its own.
    assert len(sent) == rounds * 7 and len(set(sent)) == len(sent)
    close_the_breaker()

    run_worker()

    states = dict(Payment.objects.values_list("pk", "state"))
    assert states == {
        p.pk: PaymentState.CONFIRMED if p == payments[0] else PaymentState.SUBMITTED
        for p in payments
    }
    assert applied_moves(payments[0]) == [
        (PaymentState.PENDING, PaymentState.SUBMITTED),
        (PaymentState.SUBMITTED, PaymentState.CONFIRMED),
    ]
    assert sandbox.stats()["charges_by_payment"] == {str(p.id): 1 for p in payments}
    assert outage_holds() == []
    assert PaymentHold.objects.count() == 6 and ParkedMessage.objects.count() == 7


def other_payments_called(*, failing_then_through: int, through: int) -> None:
    """What the processor did lately to other payments: some failed once and went through on a
    retry, others went through at once (attempt rows, recorded now by the database)."""
    for _ in range(failing_then_through):
        payment = PaymentFactory()
        ProcessorAttemptFactory(payment=payment, attempt_number=1)
        ProcessorAttemptFactory(
            payment=payment, attempt_number=2, outcome=AttemptOutcome.ACCEPTED, http_status=201
        )
    for _ in range(through):
        ProcessorAttemptFactory(outcome=AttemptOutcome.ACCEPTED, http_status=201)


def test_a_failure_while_the_processor_fails_others_too_waits_its_backoff_unspent(
    sqs_queues, sandbox, module_settings
):
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 1.5
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 1.5
    module_settings.WORKER_MAX_ATTEMPTS = 1  # one failure of its own would dead-letter it
    other_payments_called(failing_then_through=4, through=3)
    # Two failures: the first call's at once retry on a new connection fails too, so the
    # payment waits its backoff (one failure would go through on that retry).
    payment = PaymentFactory(state=PaymentState.PENDING, source_token="tok_fail5xx_2_degraded")
    message_id = submit_message(sqs_queues, payment)
    before = deferred_count("degraded")

    run_worker()  # fails, is parked for its backoff, then released and submitted: it stays

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    assert sandbox.stats()["charges_by_payment"] == {str(payment.id): 1}
    assert deferred_count("degraded") == before + 1
    # The failure is in the history, but the attempt was given back: no dead letter.
    original = QueueMessage.objects.get(message_id=message_id)
    assert (original.status, original.attempts) == (QueueMessageStatus.PARKED, 0)
    [error] = ProcessingError.objects.filter(message_id=message_id)
    assert error.error_class == "payments.exceptions.ProcessorDegraded"
    assert "processor degraded: calls failed for 4 of the 7 other payments" in error.message
    # It waited behind an outage hold released only after its backoff (the database's clock).
    [hold] = PaymentHold.objects.filter(payment_id=str(payment.id))
    assert hold.kind == HoldKind.OUTAGE and hold.released_at is not None
    assert hold.created_at < hold.release_after <= hold.created_at + timedelta(seconds=1.6)
    assert hold.released_at >= hold.release_after - timedelta(seconds=0.5)
    assert drain(sqs_queues.client, sqs_queues.dlq_url) == []
    # The breaker stays closed; the degradation is recorded and alerted.
    breaker = processor_breaker_get()
    assert breaker.state == BreakerState.CLOSED and breaker.degraded_since is not None
    assert CircuitBreakerTransition.objects.filter(kind="degraded").count() == 1
    assert Alert.objects.get(key=DEGRADED_ALERT_KEY).severity == "high"


def test_a_payment_failing_alone_while_others_go_through_spends_its_budget(
    sqs_queues, sandbox, short_budget, module_settings
):
    module_settings.PROCESSOR_BREAKER_FAILURES = 5
    other_payments_called(failing_then_through=0, through=8)
    payment = PaymentFactory(state=PaymentState.PENDING, source_token="tok_fail5xx_9_alone")
    message_id = submit_message(sqs_queues, payment)

    run_worker()

    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.attempts) == (QueueMessageStatus.DEAD_LETTERED, 3)
    assert set(
        ProcessingError.objects.filter(message_id=message_id).values_list("error_class", flat=True)
    ) == {"payments.exceptions.ProcessorUnavailable"}
    assert PaymentHold.objects.get(payment_id=str(payment.id)).kind == HoldKind.TRIAGE
    assert len(drain(sqs_queues.client, sqs_queues.dlq_url)) == 1
    breaker = processor_breaker_get()
    assert breaker.state == BreakerState.CLOSED and breaker.degraded_since is None
    assert not Alert.objects.filter(key=DEGRADED_ALERT_KEY).exists()
