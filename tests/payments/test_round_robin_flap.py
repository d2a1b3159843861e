"""A processor behind a round-robin balancer with one of its two backends dead, over real HTTP
against the sandbox: the calls of one process, in an order that pins every failure on one
payment (or on one kept connection), the way two workers' timings did on the real stack.

Judged by payments alone, each of those failures is the payment's own: the other payments'
calls all go through. A failure that interleaves with other payments' successes is made again
at once on a new connection, and going through then is the processor's failure: no payment
spends its budget on it, and the failures spread over payments make one incident. A payment
that fails on its own fails that call too and keeps spending its budget (a person sees it).
"""

from decimal import Decimal

import pytest

from payments.exceptions import ProcessorDegraded, ProcessorUnavailable
from payments.models import (
    AttemptOutcome,
    BreakerTransitionKind,
    CircuitBreakerTransition,
    PaymentState,
    ProcessorAttempt,
)
from payments.processor.breaker import DEGRADED_ALERT_KEY, processor_breaker_get
from payments.services import payment_submit
from tests.factories import PaymentFactory
from triage.models import Alert

pytestmark = pytest.mark.django_db(transaction=True)

BUDGET = 6  # the worker's default attempts of a message


def submitted(sandbox, count: int, prefix: str) -> list:
    payments = []
    for n in range(count):
        payment = PaymentFactory(source_token=f"tok_{prefix}_{n:04d}")
        assert payment_submit(payment_id=payment.id).outcome == "submitted"
        payments.append(payment)
    return payments


def outcomes(payment) -> list[str]:
    return list(
        ProcessorAttempt.objects.filter(payment=payment, operation="submit")
        .order_by("attempt_number")
        .values_list("outcome", flat=True)
    )


def assert_charged_once(sandbox, payments) -> None:
    for payment in payments:
        payment.refresh_from_db()
        assert payment.state == PaymentState.SUBMITTED
        assert sandbox.debit(str(payment.idempotency_key)).payment_id == str(payment.id)
    assert sandbox.stats()["total_charges"] == len(payments)


def test_a_payment_pinned_to_the_dead_backend_goes_through_when_called_again(sandbox):
    """Strict alternation, a pinned payment's budget: its call meets the dead backend each
    time while the calls between go to the live one. Before, it failed its six attempts, all
    503, and the others' successes said the failures were its own."""
    healthy = submitted(sandbox, 3, "healthy")
    sandbox.outage_start("round_robin", 600)
    pinned = PaymentFactory(source_token="tok_pinned_0001")
    others = submitted(sandbox, 1, "between")  # the live backend's call; the next is dead

    assert payment_submit(payment_id=pinned.id).outcome == "submitted"

    assert outcomes(pinned) == [AttemptOutcome.RETRYABLE, AttemptOutcome.ACCEPTED]
    assert_charged_once(sandbox, [*healthy, *others, pinned])
    assert processor_breaker_get().consecutive_failures == 0


def test_a_round_robin_flap_at_low_traffic_is_one_incident_and_spends_no_budget(
    sandbox, module_settings
):
    """Every other call fails, whatever it asks, one payment at a time: each failure goes
    through on the call again, and once the failures are spread over enough payments the
    processor is degraded, one transition and one high alert, however long it goes on. The
    breaker's own rules are set out of reach, as on the real stack where they never tripped
    (at their defaults the rate of first submissions may open it: an incident too)."""
    module_settings.PROCESSOR_BREAKER_WINDOW_CALLS = 10_000
    module_settings.PROCESSOR_BREAKER_FAILURES = 1_000
    healthy = submitted(sandbox, 3, "healthy")
    sandbox.outage_start("round_robin", 600)

    during = submitted(sandbox, 20, "flap")

    assert_charged_once(sandbox, [*healthy, *during])
    failed = [p for p in during if AttemptOutcome.RETRYABLE in outcomes(p)]
    assert len(failed) >= 9, "the alternation failed about every other payment's first call"
    assert all(outcomes(p) == [AttemptOutcome.RETRYABLE, AttemptOutcome.ACCEPTED] for p in failed)
    [degraded] = CircuitBreakerTransition.objects.filter(kind=BreakerTransitionKind.DEGRADED)
    assert "called again on a new connection" in degraded.reason
    [alert] = Alert.objects.filter(key=DEGRADED_ALERT_KEY)
    assert alert.severity == "high"
    assert not CircuitBreakerTransition.objects.filter(kind=BreakerTransitionKind.OPENED).exists()


def test_a_connection_pinned_to_the_dead_backend_is_left_for_a_new_one(sandbox):
    """The balancer pins each connection: the kept one goes to the dead backend and every call
    on it fails, for every payment. The failed call is made again on a new connection (the
    live backend), and the calls after it keep that one."""
    healthy = submitted(sandbox, 3, "healthy")
    sandbox.outage_start("flap_connection", 600)

    during = submitted(sandbox, 10, "flap")

    assert_charged_once(sandbox, [*healthy, *during])
    assert outcomes(during[0]) == [AttemptOutcome.RETRYABLE, AttemptOutcome.ACCEPTED]
    assert all(outcomes(p) == [AttemptOutcome.ACCEPTED] for p in during[1:])
    assert sandbox.stats()["outage_calls_failed"] == 1


def test_a_payment_failing_alone_between_successes_still_spends_its_budget(sandbox):
    """Its failure interleaves with other payments' successes as a pinned one's does, but it
    fails the call again too: an ordinary retryable failure each time, never a degradation,
    and no alert; the worker dead-letters it after its budget, for a person."""
    submitted(sandbox, 3, "healthy")
    lone = PaymentFactory(source_token="tok_fail5xx_99_lone", amount=Decimal("99.00"))

    for attempt in range(BUDGET):
        submitted(sandbox, 1, f"between{attempt}")
        with pytest.raises(ProcessorUnavailable) as raised:
            payment_submit(payment_id=lone.id)
        assert not isinstance(raised.value, ProcessorDegraded)

    assert outcomes(lone) == [AttemptOutcome.RETRYABLE] * (2 * BUDGET)
    lone.refresh_from_db()
    assert lone.state == PaymentState.PENDING
    assert not Alert.objects.filter(key=DEGRADED_ALERT_KEY).exists()
    assert not CircuitBreakerTransition.objects.exists()


def test_a_failure_after_another_failure_is_not_called_again(sandbox):
    """An outage for everyone: the call before already failed, so nothing interleaves and the
    failure is not made again (the breaker's rules judge it)."""
    submitted(sandbox, 3, "healthy")
    sandbox.outage_start("503", 600)
    first, second = PaymentFactory(), PaymentFactory()

    for payment in (first, second):
        with pytest.raises(ProcessorUnavailable):
            payment_submit(payment_id=payment.id)

    assert outcomes(first) == [AttemptOutcome.RETRYABLE] * 2  # after healthy calls: again
    assert outcomes(second) == [AttemptOutcome.RETRYABLE]
    assert processor_breaker_get().consecutive_failures == 3
