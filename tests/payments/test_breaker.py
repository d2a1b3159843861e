"""The processor's circuit breaker: its state machine on PostgreSQL, shared by every caller."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from payments.models import (
    AttemptOutcome,
    BreakerState,
    BreakerTransitionKind,
    CircuitBreakerTransition,
    PaymentState,
    ProcessorAttempt,
)
from payments.processor.breaker import (
    ALERT_KEY,
    CallOutcome,
    call_outcome,
    pause_seconds,
    processor_breaker_admit,
    processor_breaker_get,
    processor_breaker_record,
    processor_breaker_wait,
)
from tests.factories import PaymentFactory
from triage.models import Alert, AlertStatus

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def breaker_settings(settings):
    settings.PROCESSOR_BREAKER_FAILURES = 3
    settings.PROCESSOR_BREAKER_FAILURE_RATE = 0.5
    settings.PROCESSOR_BREAKER_WINDOW_SECONDS = 30
    settings.PROCESSOR_BREAKER_MIN_CALLS = 10
    settings.PROCESSOR_BREAKER_PAUSE_SECONDS = 10
    settings.PROCESSOR_BREAKER_MAX_PAUSE_SECONDS = 25
    settings.PROCESSOR_TIMEOUT_SECONDS = 2
    settings.PROCESSOR_CONNECT_TIMEOUT_SECONDS = 1


def fail(now=None, error="HTTP 503: down"):
    admission = processor_breaker_admit(now=now)
    assert admission.allowed
    return processor_breaker_record(
        admission=admission, outcome=CallOutcome.FAILURE, error=error, http_status=503, now=now
    )


def succeed(now=None):
    admission = processor_breaker_admit(now=now)
    return processor_breaker_record(admission=admission, outcome=CallOutcome.SUCCESS, now=now)


def open_breaker(now):
    for _ in range(3):
        fail(now)
    assert processor_breaker_get().state == BreakerState.OPEN


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
    now = timezone.now()

    assert fail(now) == BreakerState.CLOSED
    assert fail(now) == BreakerState.CLOSED
    assert fail(now) == BreakerState.OPEN

    breaker = processor_breaker_get()
    assert breaker.opened_at == now
    assert breaker.open_until == now + timedelta(seconds=10)
    [opened] = CircuitBreakerTransition.objects.filter(kind=BreakerTransitionKind.OPENED)
    assert "3 consecutive failures" in opened.reason and opened.pause_seconds == 10
    [alert] = Alert.objects.filter(key=ALERT_KEY)
    assert alert.severity == "high" and alert.status == AlertStatus.FIRING
    assert alert.summary.startswith(f"processor unavailable since {now:%Y-%m-%d %H:%M:%S} UTC")
    assert "4 payment(s) waiting" in alert.summary


def test_a_success_resets_the_run_of_failures():
    now = timezone.now()
    fail(now)
    fail(now)
    succeed(now)
    fail(now)
    fail(now)

    assert processor_breaker_get().state == BreakerState.CLOSED
    assert processor_breaker_get().consecutive_failures == 2


def test_failure_rate_over_the_window_opens_the_breaker_without_a_run():
    payment = PaymentFactory()
    now = timezone.now()
    # 12 calls in the window, every other one failed: 50 %, at least the minimum of 10 calls.
    for number in range(1, 13):
        failed = number % 2 == 0
        ProcessorAttempt.objects.create(
            payment=payment,
            attempt_number=number,
            idempotency_key=payment.idempotency_key,
            outcome=AttemptOutcome.RETRYABLE if failed else AttemptOutcome.ACCEPTED,
            http_status=503 if failed else 201,
            latency_ms=1,
            started_at=now - timedelta(seconds=number),
        )

    assert fail(now) == BreakerState.OPEN
    [opened] = CircuitBreakerTransition.objects.filter(kind=BreakerTransitionKind.OPENED)
    assert "6 of 12 calls failed in the last 30 s" in opened.reason


def test_failure_rate_ignores_calls_outside_the_window_and_429s():
    payment = PaymentFactory()
    now = timezone.now()
    for number in range(1, 13):
        ProcessorAttempt.objects.create(
            payment=payment,
            attempt_number=number,
            idempotency_key=payment.idempotency_key,
            outcome=AttemptOutcome.RETRYABLE,
            # Old failures, and recent 429s (a pause, not a failure): neither counts.
            http_status=503 if number <= 6 else 429,
            latency_ms=1,
            started_at=now - timedelta(seconds=60 if number <= 6 else 1),
        )

    assert fail(now) == BreakerState.CLOSED


def test_open_breaker_admits_nobody_until_the_pause_ends():
    now = timezone.now()
    open_breaker(now)

    admission = processor_breaker_admit(now=now + timedelta(seconds=4))

    assert not admission.allowed and not admission.probe
    assert admission.wait_seconds == pytest.approx(6)
    assert "processor breaker open since" in admission.reason
    assert not processor_breaker_wait(now=now + timedelta(seconds=4)).allowed


def test_after_the_pause_exactly_one_of_many_racing_threads_gets_the_probe():
    now = timezone.now()
    open_breaker(now)
    later = now + timedelta(seconds=11)
    racers = 8
    barrier = threading.Barrier(racers)
    admissions = []
    errors = []

    def race():
        try:
            barrier.wait(timeout=10)
            admissions.append(processor_breaker_admit(now=later))
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
    probes = [a for a in admissions if a.probe]
    assert len(probes) == 1 and probes[0].allowed
    assert all(not a.allowed and a.wait_seconds > 0 for a in admissions if not a.probe)
    assert processor_breaker_get().state == BreakerState.HALF_OPEN
    assert CircuitBreakerTransition.objects.filter(kind=BreakerTransitionKind.PROBING).count() == 1


def test_a_failed_probe_reopens_with_a_doubled_pause_capped():
    now = timezone.now()
    open_breaker(now)
    moment = now
    pauses = []
    for _ in range(3):
        moment = processor_breaker_get().open_until
        probe = processor_breaker_admit(now=moment)
        assert probe.probe
        state = processor_breaker_record(
            admission=probe, outcome=CallOutcome.FAILURE, error="HTTP 503", now=moment
        )
        assert state == BreakerState.OPEN
        breaker = processor_breaker_get()
        pauses.append((breaker.open_until - moment).total_seconds())

    assert pauses == [20, 25, 25]  # 10 s doubled, then the 25 s cap
    assert [pause_seconds(n) for n in range(4)] == [10, 20, 25, 25]
    assert processor_breaker_get().opened_at == now  # one incident, however many probes
    assert Alert.objects.filter(key=ALERT_KEY).count() == 1


def test_a_successful_probe_closes_the_breaker_and_resolves_the_alert():
    now = timezone.now()
    open_breaker(now)
    later = now + timedelta(seconds=10)
    probe = processor_breaker_admit(now=later)

    state = processor_breaker_record(admission=probe, outcome=CallOutcome.SUCCESS, now=later)

    assert state == BreakerState.CLOSED
    breaker = processor_breaker_get()
    assert (breaker.consecutive_failures, breaker.opened_at, breaker.reopen_count) == (0, None, 0)
    kinds = list(CircuitBreakerTransition.objects.values_list("kind", flat=True))
    assert kinds == ["opened", "probing", "closed"]
    [alert] = Alert.objects.filter(key=ALERT_KEY)
    assert alert.status == AlertStatus.RESOLVED
    assert "breaker closed" in alert.details["resolved_because"]
    assert processor_breaker_admit(now=later).allowed


def test_a_success_started_before_the_breaker_opened_does_not_cut_the_pause_short():
    now = timezone.now()
    early = processor_breaker_admit(now=now)  # a slow call, admitted while closed
    open_breaker(now)

    processor_breaker_record(admission=early, outcome=CallOutcome.SUCCESS, now=now)

    assert processor_breaker_get().state == BreakerState.OPEN


def test_a_probe_whose_caller_vanished_is_given_up_after_its_lease():
    now = timezone.now()
    open_breaker(now)
    first = processor_breaker_admit(now=now + timedelta(seconds=10))
    assert first.probe  # ... and its process dies: no outcome is ever recorded

    during_lease = processor_breaker_admit(now=now + timedelta(seconds=12))
    after_lease = processor_breaker_admit(now=now + timedelta(seconds=10 + 1 + 2 + 5 + 1))

    assert not during_lease.allowed and during_lease.wait_seconds == pytest.approx(1)
    assert after_lease.probe


def test_an_undecided_probe_429_gives_the_probe_back_and_pauses_everyone():
    now = timezone.now()
    open_breaker(now)
    later = now + timedelta(seconds=10)
    probe = processor_breaker_admit(now=later)

    processor_breaker_record(
        admission=probe,
        outcome=CallOutcome.NEUTRAL,
        error="HTTP 429",
        http_status=429,
        retry_after=4,
        now=later,
    )

    paused = processor_breaker_admit(now=later + timedelta(seconds=1))
    assert not paused.allowed and paused.wait_seconds == pytest.approx(3)
    assert processor_breaker_admit(now=later + timedelta(seconds=4)).probe


def test_429_retry_after_pauses_every_caller_while_closed_without_counting_a_failure():
    now = timezone.now()
    admission = processor_breaker_admit(now=now)

    processor_breaker_record(
        admission=admission,
        outcome=CallOutcome.NEUTRAL,
        error="HTTP 429: slow down",
        http_status=429,
        retry_after=5,
        now=now,
    )

    breaker = processor_breaker_get()
    assert breaker.state == BreakerState.CLOSED and breaker.consecutive_failures == 0
    gate = processor_breaker_wait(now=now + timedelta(seconds=2))
    assert not gate.allowed and gate.wait_seconds == pytest.approx(3)
    assert "429 Retry-After" in gate.reason
    assert processor_breaker_admit(now=now + timedelta(seconds=5)).allowed
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
    now = timezone.now()
    admission = processor_breaker_admit(now=now)

    processor_breaker_record(
        admission=admission,
        outcome=CallOutcome.NEUTRAL,
        error="HTTP 429",
        http_status=429,
        retry_after=86400 * 365,
        now=now,
    )

    assert processor_breaker_get().paused_until == now + timedelta(seconds=25)


def test_a_429_without_retry_after_still_pauses_everyone_briefly():
    now = timezone.now()
    admission = processor_breaker_admit(now=now)

    processor_breaker_record(
        admission=admission, outcome=CallOutcome.NEUTRAL, error="HTTP 429", http_status=429, now=now
    )

    assert processor_breaker_get().paused_until == now + timedelta(seconds=1)
    assert processor_breaker_get().consecutive_failures == 0
