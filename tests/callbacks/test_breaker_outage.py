"""A processor outage several times longer than the retry budget, on the real stack.

PostgreSQL, the local SQS server, the callback endpoint served by a live server, the sandbox
processor over HTTP (sending signed callbacks to that endpoint), and two ``run_sqs_worker``
processes. The retry budget is shortened (3 attempts, backoff capped at 0.2 s: under a second
in all); the processor then goes down for many times that. Without the breaker every payment
created during the outage would be dead-lettered and held.
"""

import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from callbacks.models import PaymentHold, ProcessingError, QueueMessage
from payments.models import (
    AttemptOutcome,
    BreakerTransitionKind,
    CircuitBreakerTransition,
    Payment,
    PaymentEvent,
    PaymentState,
    ProcessorAttempt,
)
from payments.processor.backends.http import reset_client
from payments.processor.breaker import ALERT_KEY, processor_breaker_get
from sandbox import FaultConfig, SandboxProcessor
from tests.callbacks.worker_support import (
    WorkerProcess,
    applied_moves,
    drain,
    payments_created,
)
from tests.waiting import wait_for
from triage.models import Alert, AlertStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

BUDGET = {
    "WORKER_BACKOFF_BASE_SECONDS": "0.05",
    "WORKER_BACKOFF_CAP_SECONDS": "0.2",
    "WORKER_MAX_ATTEMPTS": "3",
}
BREAKER = {
    "PROCESSOR_BREAKER_FAILURES": "3",
    "PROCESSOR_BREAKER_PAUSE_SECONDS": "1",
    "PROCESSOR_BREAKER_MAX_PAUSE_SECONDS": "2",
    "PROCESSOR_CONNECT_TIMEOUT_SECONDS": "0.3",
    # The incident (and its one alert) ends 2 s after the last close.
    "PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS": "2",
}
SETTLE_AFTER = 3.0  # the settlement callback of a debit accepted before the outage lands in it


@pytest.fixture
def stack(sqs_queues, live_server, module_settings, tmp_path):
    sandbox = SandboxProcessor(
        callback_url=f"{live_server.url}/callbacks/processor/",
        faults=FaultConfig(timeout_seconds=0.8, settle_after_seconds=SETTLE_AFTER),
        callback_backoff_seconds=0.2,
    ).start()
    module_settings.PROCESSOR_BASE_URL = sandbox.base_url
    module_settings.PROCESSOR_TIMEOUT_SECONDS = 0.3
    for name, value in {**BUDGET, **BREAKER}.items():
        setattr(module_settings, name, float(value))
    reset_client()
    workers = [
        WorkerProcess("--wait-time", "1", log_dir=tmp_path, name=f"worker{i}", **BUDGET, **BREAKER)
        for i in range(2)
    ]
    yield sandbox, workers, sqs_queues
    for worker in workers:
        if worker.process.poll() is None:
            worker.signal(signal.SIGTERM)
            worker.wait(60)
    sandbox.stop()
    reset_client()


def states(payments) -> set[str]:
    return set(
        Payment.objects.filter(pk__in=[p.pk for p in payments]).values_list("state", flat=True)
    )


def run_outage(stack, *, mode: str, outage_seconds: float, during: int):
    """Payments submitted before the outage, the outage, payments created during it, recovery."""
    sandbox, workers, _ = stack
    before = make_payments(4, "before")
    wait_for(lambda: states(before) == {PaymentState.SUBMITTED}, 60, "the early submissions")

    sandbox.outage_start(mode, outage_seconds)
    outage_started = timezone.now()
    outage_ended = outage_started + timedelta(seconds=outage_seconds)
    created = make_payments(during, "during")
    wait_for(
        lambda: states(before + created) == {PaymentState.CONFIRMED},
        outage_seconds + 90,
        "every payment to be confirmed after the outage",
    )
    wait_for(lambda: processor_breaker_get().opened_at is None, 30, "the breaker's incident to end")
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(60) == 0, worker.output
    return before, created, outage_started, outage_ended


def assert_one_incident_and_no_dead_letters(stack, before, created, outage_started, outage_ended):
    sandbox, workers, queues = stack
    everyone = before + created
    # No dead letter, no hold for a person, nothing in the DLQ: the outage spent no message's
    # budget. The submissions it held back waited behind outage holds, all released.
    assert not QueueMessage.objects.filter(status="dead_lettered").exists()
    assert not PaymentHold.objects.filter(kind="triage").exists()
    assert not PaymentHold.objects.filter(released_at__isnull=True).exists()
    assert PaymentHold.objects.filter(kind="outage").exists()
    assert drain(queues.client, queues.dlq_url) == []
    assert all(
        qm.attempts <= int(BUDGET["WORKER_MAX_ATTEMPTS"])
        for qm in QueueMessage.objects.filter(kind="submit_payment")
    )

    # Each payment charged exactly once (one debit per idempotency key at the processor) ...
    charges = sandbox.stats()["charges_by_payment"]
    assert charges == {str(p.id): 1 for p in everyone}
    # ... and the ones created during the outage were accepted only after it ended.
    for payment in created:
        [accepted] = ProcessorAttempt.objects.filter(
            payment=payment, operation="submit", outcome=AttemptOutcome.ACCEPTED
        )
        assert accepted.started_at >= outage_ended - timedelta(milliseconds=200)

    # In order within each group: submission first, then the processor's events; no event
    # ever found the payment in a state it could not apply to.
    for payment in everyone:
        assert [to for _, to in applied_moves(payment)] == [
            PaymentState.SUBMITTED,
            PaymentState.CONFIRMED,
        ]
    assert not ProcessingError.objects.exclude(
        error_class__in=(
            "payments.exceptions.ProcessorUnavailable",
            "payments.exceptions.ProcessorCircuitOpen",
        )
    ).exists()

    # The settlements of the early debits arrived during the outage and were applied then.
    for payment in before:
        settled = PaymentEvent.objects.get(payment=payment, event_type="settled", outcome="applied")
        assert outage_started <= settled.created_at < outage_ended

    # One incident: opened once, over once, one high alert raised and resolved.
    kinds = list(CircuitBreakerTransition.objects.values_list("kind", flat=True))
    assert kinds.count(BreakerTransitionKind.OPENED) == 1
    assert kinds.count(BreakerTransitionKind.CLOSED) >= 1
    assert kinds[-1] == BreakerTransitionKind.RESOLVED
    assert kinds.count(BreakerTransitionKind.RESOLVED) == 1
    [alert] = Alert.objects.filter(key=ALERT_KEY)
    assert alert.severity == "high" and alert.status == AlertStatus.RESOLVED
    assert alert.summary.startswith("processor unavailable since")
    assert "payment(s) waiting" in alert.summary

    # Submissions were deferred while it was open, not attempted.
    assert any("outcome=deferred" in w.output for w in workers)
    return kinds


def test_503_outage_many_times_the_retry_budget_is_one_incident_and_no_dead_letter(stack):
    before, created, started, ended = run_outage(stack, mode="503", outage_seconds=8, during=20)

    kinds = assert_one_incident_and_no_dead_letters(stack, before, created, started, ended)
    # The 8 s outage outlasted the 1-2 s pauses: probes failed and reopened it meanwhile.
    assert kinds.count(BreakerTransitionKind.REOPENED) >= 1
    # Far fewer calls than "every message retries on its own" would make (20 x 3 at least).
    during_outage = ProcessorAttempt.objects.filter(
        started_at__gte=started, started_at__lt=ended, outcome=AttemptOutcome.RETRYABLE
    ).count()
    assert during_outage < 20 * int(BUDGET["WORKER_MAX_ATTEMPTS"])


# In the scale tier (make test-slow): a second long fault (a 6 s outage, 25 to 40 s in all) on
# the path the 503 outage above walks in make test; what is the timeout's own (a timeout counted
# as the breaker's failure) is tested in process by tests/payments/test_breaker.py.
@pytest.mark.scale
def test_timeout_outage_is_one_incident_and_no_dead_letter(stack):
    before, created, started, ended = run_outage(stack, mode="timeout", outage_seconds=6, during=10)

    assert_one_incident_and_no_dead_letters(stack, before, created, started, ended)
    timeouts = ProcessorAttempt.objects.filter(error_kind="timeout").count()
    assert timeouts >= int(BREAKER["PROCESSOR_BREAKER_FAILURES"])


def make_payments(count: int, prefix: str) -> list[Payment]:
    return payments_created(count, prefix, merchant_id="merchant-outage", first_amount="10.00")
