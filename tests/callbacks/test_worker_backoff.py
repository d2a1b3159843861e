"""Worker rules on their own: backoff (exponential, full jitter, capped, Retry-After as a floor),
error classification, relay pacing."""

import pytest

from callbacks.retry import MAX_VISIBILITY_SECONDS, backoff_delay, classify
from payments.exceptions import (
    AmountMismatch,
    EventConflict,
    InvalidTransition,
    PaymentNotFound,
    ProcessorRejected,
    ProcessorUnavailable,
)


def ceiling(attempt, base=1, cap=30):
    # The top of the jitter range: uniform(a, b) called with the maximum returns b.
    return backoff_delay(attempt, base=base, cap=cap, uniform=lambda a, b: b)


def test_backoff_ceiling_doubles_from_the_base_per_attempt():
    assert [ceiling(n) for n in range(1, 6)] == [1, 2, 4, 8, 16]


def test_backoff_ceiling_stops_at_the_cap():
    assert ceiling(6) == 30
    assert ceiling(40) == 30
    assert ceiling(10_000) == 30  # no overflow on absurd attempt numbers


def test_backoff_draws_the_whole_range_from_zero():
    calls = []

    def uniform(a, b):
        calls.append((a, b))
        return a

    assert backoff_delay(4, base=1, cap=30, uniform=uniform) == 0
    assert calls == [(0, 8)]


def test_backoff_real_jitter_stays_within_the_range():
    delays = [backoff_delay(3, base=1, cap=30) for _ in range(200)]
    assert all(0 <= d <= 4 for d in delays)
    assert len(set(delays)) > 100  # jittered, not a constant


def test_retry_after_larger_than_the_draw_is_a_floor():
    assert backoff_delay(1, base=1, cap=30, retry_after=7.5, uniform=lambda a, b: b) == 7.5


def test_retry_after_smaller_than_the_draw_changes_nothing():
    assert backoff_delay(5, base=1, cap=30, retry_after=2, uniform=lambda a, b: b) == 16


def test_backoff_never_exceeds_what_sqs_accepts():
    assert backoff_delay(1, base=1, cap=30, retry_after=10**9) == MAX_VISIBILITY_SECONDS


def test_zero_cap_means_retry_at_once():
    assert backoff_delay(3, base=1, cap=0) == 0


def test_attempt_numbers_start_at_one():
    with pytest.raises(ValueError, match="start at 1"):
        backoff_delay(0, base=1, cap=30)


@pytest.mark.parametrize(
    "exc, expected",
    [
        (InvalidTransition("x"), (True, None)),
        (PaymentNotFound("x"), (True, None)),
        (ProcessorUnavailable("x", retry_after=3.0), (True, 3.0)),
        (EventConflict("x"), (False, None)),
        (AmountMismatch("x"), (False, None)),
        (ProcessorRejected("x", status=400), (False, None)),
        (RuntimeError("unexpected"), (True, None)),
    ],
)
def test_classify_follows_the_error_hierarchy(exc, expected):
    assert classify(exc) == expected


def test_relay_runs_every_idle_loop_but_at_most_once_a_second_while_busy():
    from callbacks.worker import Worker

    calls = []
    worker = Worker(relay=False)
    worker.relay = lambda: calls.append(1) or 0

    worker._relay(busy=False)
    worker._relay(busy=False)
    worker._relay(busy=True)  # within the interval: skipped
    assert len(calls) == 2

    worker._relay_due = 0  # the interval has passed
    worker._relay(busy=True)
    assert len(calls) == 3
