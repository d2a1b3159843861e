"""The processor's circuit breaker: its state machine on PostgreSQL, shared by every caller.

Every time the breaker keeps is the database's clock, so these tests move time by moving the
breaker's own times against the database's now (``pause_over``, ``lease_over``), never by
passing a clock in.
"""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from payments.models import (
    AttemptOutcome,
    BreakerState,
    BreakerTransitionKind,
    CircuitBreaker,
    CircuitBreakerTransition,
    PaymentState,
    ProcessorAttempt,
)
from payments.processor.breaker import (
    ALERT_KEY,
    DEGRADED_ALERT_KEY,
    PROCESSOR,
    STATUS_READ,
    CallOutcome,
    call_outcome,
    pause_seconds,
    processor_breaker_admit,
    processor_breaker_close_when_trials_done,
    processor_breaker_degraded,
    processor_breaker_degraded_end,
    processor_breaker_get,
    processor_breaker_incident_end,
    processor_breaker_record,
    processor_breaker_trial_start,
    processor_breaker_wait,
    processor_degraded_reason,
)
from tests.factories import PaymentFactory, ProcessorAttemptFactory
from triage.models import Alert, AlertStatus

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def breaker_settings(module_settings):
    module_settings.PROCESSOR_BREAKER_FAILURES = 3
    module_settings.PROCESSOR_BREAKER_FAILURE_RATE = 0.5
    module_settings.PROCESSOR_BREAKER_WINDOW_SECONDS = 30
    module_settings.PROCESSOR_BREAKER_WINDOW_CALLS = 10
    module_settings.PROCESSOR_BREAKER_PAUSE_SECONDS = 10
    module_settings.PROCESSOR_BREAKER_MAX_PAUSE_SECONDS = 25
    module_settings.PROCESSOR_BREAKER_TRIAL_CALLS = 3
    module_settings.PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS = 60
    module_settings.PROCESSOR_TIMEOUT_SECONDS = 2
    module_settings.PROCESSOR_CONNECT_TIMEOUT_SECONDS = 1


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


def breaker_times_move(**seconds_from_now):
    """Set breaker times to the database's now plus the given seconds (negative: past)."""
    CircuitBreaker.objects.filter(name=PROCESSOR).update(
        **{name: Now() + timedelta(seconds=s) for name, s in seconds_from_now.items()}
    )


def pause_over():
    breaker_times_move(open_until=-0.1)


def record(admission, outcome, **kwargs):
    return processor_breaker_record(admission=admission, outcome=outcome, **kwargs)


def fail(error="HTTP 503: down", operation="submit"):
    admission = processor_breaker_admit(operation=operation)
    assert admission.allowed
    return record(admission, CallOutcome.FAILURE, error=error, http_status=503, operation=operation)


def succeed(operation="submit"):
    return record(
        processor_breaker_admit(operation=operation), CallOutcome.SUCCESS, operation=operation
    )


def fail_until_open():
    """Open the breaker the way production does, by its failures (three, the threshold)."""
    for _ in range(3):
        fail()
    assert processor_breaker_get().state == BreakerState.OPEN


def trials(count):
    """Pause over, then ``count`` trial admissions (each must get a slot)."""
    pause_over()
    admitted = [processor_breaker_admit() for _ in range(count)]
    assert all(a.allowed and a.trial for a in admitted)
    return admitted


def attempts(payment, outcomes, *, operation="submit", age_seconds=1.0):
    """Processor attempts of ``payment``, oldest first; True = failed (503)."""
    start = ProcessorAttempt.objects.filter(payment=payment).count()
    for number, failed in enumerate(outcomes, start=start + 1):
        ProcessorAttemptFactory(
            payment=payment,
            operation=operation,
            attempt_number=number,
            outcome=AttemptOutcome.RETRYABLE if failed else AttemptOutcome.ACCEPTED,
            http_status=503 if failed else 201,
            started_at=timezone.now() - timedelta(seconds=age_seconds),
        )
    ProcessorAttempt.objects.filter(payment=payment, recorded_at__isnull=False).filter(
        attempt_number__gt=start
    ).update(recorded_at=Now() - timedelta(seconds=age_seconds))


@pytest.mark.parametrize(
    ("http_status", "retryable", "accepted", "expected"),
    [
        (201, False, True, CallOutcome.SUCCESS),
        (400, False, False, CallOutcome.SUCCESS),  # the message's own problem: processor is up
        (503, True, False, CallOutcome.FAILURE),
        (None, True, False, CallOutcome.FAILURE),  # timeout or connection error
        (401, True, False, CallOutcome.FAILURE),
        (403, True, False, CallOutcome.FAILURE),
        (408, True, False, CallOutcome.FAILURE),
        (429, True, False, CallOutcome.NEUTRAL),
        (409, True, False, CallOutcome.NEUTRAL),
    ],
)
def test_what_a_call_says_about_the_processor(http_status, retryable, accepted, expected):
    assert call_outcome(http_status=http_status, retryable=retryable, accepted=accepted) == expected


def test_consecutive_failures_open_the_breaker_and_raise_one_high_alert():
    PaymentFactory.create_batch(4, state=PaymentState.PENDING)

    assert fail() == BreakerState.CLOSED
    assert fail() == BreakerState.CLOSED
    before = db_now()
    assert fail() == BreakerState.OPEN

    breaker = processor_breaker_get()
    assert before <= breaker.opened_at <= db_now()
    assert breaker.open_until - breaker.opened_at == timedelta(seconds=10)
    [opened] = CircuitBreakerTransition.objects.filter(kind=BreakerTransitionKind.OPENED)
    assert "3 consecutive failures" in opened.reason and opened.pause_seconds == 10
    [alert] = Alert.objects.filter(key=ALERT_KEY)
    assert alert.severity == "high" and alert.status == AlertStatus.FIRING
    assert alert.summary.startswith(
        f"processor unavailable since {breaker.opened_at:%Y-%m-%d %H:%M:%S} UTC"
    )
    assert "4 payment(s) waiting" in alert.summary


def test_a_successful_submission_resets_the_run_of_failures_a_status_read_does_not():
    fail()
    fail()
    succeed()
    fail()
    succeed(operation=STATUS_READ)  # a status read can answer while debits fail

    breaker = processor_breaker_get()
    assert breaker.state == BreakerState.CLOSED and breaker.consecutive_failures == 1
    assert fail() == BreakerState.CLOSED
    assert fail() == BreakerState.OPEN


def test_a_success_admitted_at_no_failures_writes_nothing_and_the_next_admitted_resets(
    django_assert_num_queries,
):
    processor_breaker_get()
    admitted_clean = processor_breaker_admit()
    fail()  # another process's failure, while the first call is under way

    with django_assert_num_queries(0):
        state = record(admitted_clean, CallOutcome.SUCCESS)
    after_first = processor_breaker_get().consecutive_failures
    succeed()  # admitted at one failure: its success resets the run

    assert (state, admitted_clean.failures, after_first) == (BreakerState.CLOSED, 0, 1)
    assert processor_breaker_get().consecutive_failures == 0


def test_every_other_submission_failing_opens_it_however_healthy_the_traffic_before():
    healthy = PaymentFactory()
    # A busy healthy period just before: a time window would be diluted by it.
    attempts(healthy, [False] * 40, age_seconds=5)
    # Then the processor flaps: every other payment's first debit fails (the call recorded
    # below comes after the 5th failure of the last 10 first submissions).
    for number in range(10):
        attempts(PaymentFactory(), [number % 2 == 1])

    assert fail() == BreakerState.OPEN
    [opened] = CircuitBreakerTransition.objects.filter(kind=BreakerTransitionKind.OPENED)
    assert "5 of the last 10 first submissions failed" in opened.reason


def test_retries_of_payments_that_fail_on_their_own_are_not_an_outage():
    for _ in range(10):
        attempts(PaymentFactory(), [False])  # quiet traffic, every first submission fine
    # Then only retries: three bad accounts failing again and again.
    for _ in range(3):
        attempts(PaymentFactory(), [True, True, True])
    ProcessorAttempt.objects.filter(attempt_number=1, outcome="retryable").delete()

    assert fail() == BreakerState.CLOSED


def test_failure_rate_ignores_429s_status_reads_old_calls_and_calls_before_the_last_close():
    payment = PaymentFactory()
    attempts(payment, [True] * 12, age_seconds=60)  # older than the 30 s window
    attempts(payment, [True] * 12, operation=STATUS_READ)  # not submissions
    ProcessorAttempt.objects.filter(payment=payment, operation=STATUS_READ).update(http_status=503)
    recent = PaymentFactory()
    for number in range(1, 9):  # recent 429s: a pause, not a failure
        ProcessorAttemptFactory(payment=recent, attempt_number=number, http_status=429)
    assert fail() == BreakerState.CLOSED

    # Failures before the last close no longer count either.
    attempts(payment, [True] * 9)
    CircuitBreaker.objects.filter(name=PROCESSOR).update(
        window_after_attempt=ProcessorAttempt.objects.order_by("-pk").first().pk
    )
    assert fail() == BreakerState.CLOSED


def test_open_breaker_admits_nobody_until_the_pause_ends():
    fail_until_open()

    admission = processor_breaker_admit()

    assert not admission.allowed and not admission.trial
    assert admission.wait_seconds == pytest.approx(10, abs=1)
    assert "processor breaker open since" in admission.reason
    assert not processor_breaker_wait().allowed


def test_a_worker_clock_far_ahead_neither_stretches_nor_skips_the_pause(monkeypatch):
    ahead = timezone.now() + timedelta(minutes=2)
    monkeypatch.setattr(timezone, "now", lambda: ahead)

    fail_until_open()

    breaker = processor_breaker_get()
    assert breaker.open_until - db_now() <= timedelta(seconds=10)
    assert abs(breaker.opened_at - db_now()) < timedelta(seconds=5)
    gate = processor_breaker_wait()  # its clock says the pause is long over: the database's not
    assert not gate.allowed and gate.wait_seconds <= 10
    assert all(
        abs(t - db_now()) < timedelta(seconds=5)
        for t in CircuitBreakerTransition.objects.values_list("created_at", flat=True)
    )


def test_after_the_pause_exactly_the_trial_size_of_many_racing_threads_get_through():
    fail_until_open()
    pause_over()
    racers = 8
    barrier = threading.Barrier(racers)
    admissions = []
    errors = []

    def race():
        try:
            barrier.wait(timeout=10)
            admissions.append(processor_breaker_admit())
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=race) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert errors == []
    assert len(admissions) == racers
    admitted = [a for a in admissions if a.trial]
    assert len(admitted) == 3 and all(a.allowed for a in admitted)
    assert all(not a.allowed and a.wait_seconds > 0 for a in admissions if not a.trial)
    assert processor_breaker_get().state == BreakerState.HALF_OPEN
    assert CircuitBreakerTransition.objects.filter(kind=BreakerTransitionKind.PROBING).count() == 1


def test_a_status_read_is_never_a_trial_and_waits_for_the_close():
    fail_until_open()
    pause_over()

    assert not processor_breaker_admit(operation=STATUS_READ).allowed
    assert not processor_breaker_wait(operation=STATUS_READ).allowed
    assert processor_breaker_get().state == BreakerState.OPEN  # it did not even start a trial


def test_a_failed_trial_reopens_with_a_doubled_pause_capped_in_one_incident():
    fail_until_open()
    opened_at = processor_breaker_get().opened_at
    pauses = []
    for _ in range(3):
        [first, _second] = trials(2)
        assert record(first, CallOutcome.FAILURE, error="HTTP 503") == BreakerState.OPEN
        breaker = processor_breaker_get()
        pauses.append(round((breaker.open_until - db_now()).total_seconds()))

    assert pauses == [20, 25, 25]  # 10 s doubled, then the 25 s cap
    assert [pause_seconds(n) for n in range(4)] == [10, 20, 25, 25]
    assert processor_breaker_get().opened_at == opened_at  # one incident, however many trials
    assert Alert.objects.filter(key=ALERT_KEY).count() == 1


def test_it_closes_only_after_the_whole_trial_succeeded():
    fail_until_open()
    admitted = trials(3)

    assert record(admitted[0], CallOutcome.SUCCESS) == BreakerState.HALF_OPEN
    assert record(admitted[1], CallOutcome.SUCCESS) == BreakerState.HALF_OPEN
    assert record(admitted[2], CallOutcome.SUCCESS) == BreakerState.CLOSED

    breaker = processor_breaker_get()
    assert breaker.consecutive_failures == 0 and breaker.closed_at is not None
    kinds = list(CircuitBreakerTransition.objects.values_list("kind", flat=True))
    assert kinds == ["opened", "probing", "closed"]
    assert processor_breaker_admit().allowed


def test_a_flap_after_the_close_is_the_same_incident_and_its_alert_resolves_after_the_cooldown():
    fail_until_open()
    first_opened = processor_breaker_get().opened_at
    for admission in trials(3):
        record(admission, CallOutcome.SUCCESS)
    # Closed, but the incident (and its alert) is open for the cool-down.
    [alert] = Alert.objects.filter(key=ALERT_KEY)
    assert alert.status == AlertStatus.FIRING
    assert not processor_breaker_incident_end()

    fail_until_open()  # failing again soon after the close

    breaker = processor_breaker_get()
    assert breaker.opened_at == first_opened and breaker.reopen_count == 1
    assert breaker.open_until - db_now() > timedelta(seconds=15)  # the pause kept doubling
    [reopened] = CircuitBreakerTransition.objects.filter(kind=BreakerTransitionKind.REOPENED)
    assert "same incident" in reopened.reason
    assert Alert.objects.filter(key=ALERT_KEY).count() == 1

    for admission in trials(3):
        record(admission, CallOutcome.SUCCESS)
    CircuitBreaker.objects.filter(name=PROCESSOR).update(closed_at=Now() - timedelta(seconds=61))
    assert processor_breaker_incident_end()

    breaker = processor_breaker_get()
    assert breaker.state == BreakerState.CLOSED and breaker.opened_at is None
    [alert] = Alert.objects.filter(key=ALERT_KEY)
    assert alert.status == AlertStatus.RESOLVED
    assert "processor available again" in alert.details["resolved_because"]
    kinds = list(CircuitBreakerTransition.objects.values_list("kind", flat=True))
    assert kinds.count("opened") == 1 and kinds[-1] == "resolved"


def test_fewer_trials_than_its_size_close_it_when_nothing_else_waits():
    fail_until_open()
    [only] = trials(1)
    assert not processor_breaker_close_when_trials_done()  # one is still out

    record(only, CallOutcome.SUCCESS)

    assert processor_breaker_get().state == BreakerState.HALF_OPEN
    assert processor_breaker_close_when_trials_done()
    assert processor_breaker_get().state == BreakerState.CLOSED


def test_a_success_started_before_the_breaker_opened_does_not_cut_the_pause_short():
    early = processor_breaker_admit()  # a slow call, admitted while closed
    fail_until_open()

    record(early, CallOutcome.SUCCESS)

    assert processor_breaker_get().state == BreakerState.OPEN


def test_a_trial_whose_callers_vanished_is_started_again_after_its_lease():
    fail_until_open()
    trials(3)  # ... and their processes die: no outcome is ever recorded

    during_lease = processor_breaker_admit()
    assert not during_lease.allowed and during_lease.wait_seconds == pytest.approx(1)
    assert not processor_breaker_trial_start()

    breaker_times_move(probe_until=-0.1)
    assert processor_breaker_trial_start()
    assert processor_breaker_admit().trial


def test_an_undecided_trial_429_gives_the_slot_back_and_pauses_everyone():
    fail_until_open()
    admitted = trials(3)

    record(admitted[0], CallOutcome.NEUTRAL, error="HTTP 429", http_status=429, retry_after=4)

    paused = processor_breaker_admit()
    assert not paused.allowed and paused.wait_seconds == pytest.approx(4, abs=1)
    breaker_times_move(paused_until=-0.1)
    assert processor_breaker_admit().trial  # the slot it gave back


def test_429_retry_after_pauses_every_caller_while_closed_without_counting_a_failure():
    admission = processor_breaker_admit()

    record(
        admission, CallOutcome.NEUTRAL, error="HTTP 429: slow down", http_status=429, retry_after=5
    )

    breaker = processor_breaker_get()
    assert breaker.state == BreakerState.CLOSED and breaker.consecutive_failures == 0
    gate = processor_breaker_wait()
    assert not gate.allowed and gate.wait_seconds == pytest.approx(5, abs=1)
    assert "429 Retry-After" in gate.reason
    breaker_times_move(paused_until=-0.1)
    assert processor_breaker_admit().allowed
    [paused] = CircuitBreakerTransition.objects.filter(kind=BreakerTransitionKind.PAUSED)
    assert paused.pause_seconds == 5


def test_the_breaker_row_is_created_once_under_concurrent_first_use():
    barrier = threading.Barrier(4)
    names = []

    def first_use():
        barrier.wait(timeout=10)
        names.append(processor_breaker_get().name)
        connection.close()

    threads = [threading.Thread(target=first_use) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert names == ["processor"] * 4


def test_a_huge_retry_after_pauses_no_longer_than_the_maximum_pause():
    admission = processor_breaker_admit()

    record(
        admission, CallOutcome.NEUTRAL, error="HTTP 429", http_status=429, retry_after=86400 * 365
    )

    remaining = processor_breaker_get().paused_until - db_now()
    assert timedelta(seconds=20) < remaining <= timedelta(seconds=25)


def test_a_429_without_retry_after_still_pauses_everyone_briefly():
    admission = processor_breaker_admit()

    record(admission, CallOutcome.NEUTRAL, error="HTTP 429", http_status=429)

    assert processor_breaker_get().paused_until - db_now() <= timedelta(seconds=1)
    assert not processor_breaker_wait().allowed
    assert processor_breaker_get().consecutive_failures == 0


def test_failures_stamped_by_a_worker_clock_far_behind_still_count_toward_the_rate():
    for number in range(10):
        attempts(PaymentFactory(), [number % 2 == 1])
    # Their worker's clock is 10 minutes behind: started_at says long ago, the database now.
    ProcessorAttempt.objects.update(started_at=timezone.now() - timedelta(minutes=10))

    assert fail() == BreakerState.OPEN


# --- degraded: is a failed submission the payment's own, or the processor's? ---------------


def flapping(payments: int, **kwargs) -> None:
    """Other payments of a flapping processor: each failed once, then went through on a retry."""
    for _ in range(payments):
        attempts(PaymentFactory(), [True, False], **kwargs)


def degraded_for(payment) -> str:
    processor_breaker_get()
    return processor_degraded_reason(payment_id=payment.id)


def test_failures_spread_over_payments_that_then_go_through_are_a_degradation():
    for _ in range(4):
        attempts(PaymentFactory(), [False])  # first calls that went through
    flapping(5)
    own = PaymentFactory()
    attempts(own, [True])

    reason = degraded_for(own)

    assert reason == (
        "calls failed for 5 of the 9 other payments called lately, 5 of which went through "
        "on a retry"
    )


def test_payments_failing_on_their_own_never_look_like_a_degraded_processor():
    for _ in range(4):
        attempts(PaymentFactory(), [False])  # quiet traffic, going through
    bad_accounts = [PaymentFactory() for _ in range(4)]
    for bad in bad_accounts:
        attempts(bad, [True, True, True])

    # Three of the seven others failed, but none ever went through: their own fault each, so
    # they cannot keep one another from a person.
    assert degraded_for(bad_accounts[0]) == ""
    assert processor_breaker_get().degraded_since is None


def test_a_payments_own_calls_never_make_its_case():
    for _ in range(6):
        attempts(PaymentFactory(), [False])
    own = PaymentFactory()
    attempts(own, [True, True, True, True, True])

    assert degraded_for(own) == ""


def test_too_few_payments_called_say_nothing_of_the_processor():
    flapping(4)

    assert degraded_for(PaymentFactory()) == ""
    flapping(1)
    assert degraded_for(PaymentFactory()) != ""


def test_degradation_ignores_old_calls_calls_before_the_last_close_429s_and_409s():
    flapping(5, age_seconds=31)  # older than the 30 s window
    assert degraded_for(PaymentFactory()) == ""

    flapping(5)
    CircuitBreaker.objects.filter(name=PROCESSOR).update(
        window_after_attempt=ProcessorAttempt.objects.order_by("-pk").first().pk
    )
    assert degraded_for(PaymentFactory()) == ""

    flapping(5)
    ProcessorAttempt.objects.filter(outcome=AttemptOutcome.RETRYABLE).update(http_status=429)
    assert degraded_for(PaymentFactory()) == ""


def test_a_degradation_is_one_transition_and_one_high_alert_resolved_after_the_cooldown():
    PaymentFactory.create_batch(2, state=PaymentState.PENDING)
    processor_breaker_get()

    assert processor_breaker_degraded(reason="calls failed for 5 of the 9 other payments")
    assert not processor_breaker_degraded(reason="again")

    breaker = processor_breaker_get()
    assert breaker.state == BreakerState.CLOSED and breaker.degraded_since is not None
    [degraded] = CircuitBreakerTransition.objects.filter(kind=BreakerTransitionKind.DEGRADED)
    assert "5 of the 9" in degraded.reason
    [alert] = Alert.objects.filter(key=DEGRADED_ALERT_KEY)
    assert alert.severity == "high" and alert.status == AlertStatus.FIRING
    assert alert.summary.startswith(
        f"processor degraded since {breaker.degraded_since:%Y-%m-%d %H:%M:%S} UTC"
    )
    assert "2 payment(s) waiting" in alert.summary
    gate = processor_breaker_wait()
    assert gate.allowed and gate.degraded  # degraded is not down: calls flow
    assert not processor_breaker_degraded_end()  # a failure was judged one just now

    breaker_times_move(degraded_seen_at=-61)  # no failure judged one for the 60 s cool-down
    assert processor_breaker_degraded_end()

    assert processor_breaker_get().degraded_since is None
    assert not processor_breaker_wait().degraded
    [alert] = Alert.objects.filter(key=DEGRADED_ALERT_KEY)
    assert alert.status == AlertStatus.RESOLVED
    kinds = list(CircuitBreakerTransition.objects.values_list("kind", flat=True))
    assert kinds == [BreakerTransitionKind.DEGRADED, BreakerTransitionKind.RECOVERED]
