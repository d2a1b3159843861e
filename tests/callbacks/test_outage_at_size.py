"""The breaker's two promises at size, on the real stack: a long outage and a flapping processor.

PostgreSQL, the local SQS server with the queues ``setup_queues`` creates (RedrivePolicy
``maxReceiveCount`` 10 to the DLQ), the callback endpoint served by a live server, the sandbox
processor over HTTP sending signed callbacks to it, and two ``run_sqs_worker`` processes at the
default retry budget (6 attempts, 1 s base, 30 s cap). Payments are created with
``payment_create``: the outbox is what publishes them.

Every receive of a message counts toward the RedrivePolicy. A design that kept waiting
submissions on the queue would push them to the DLQ after enough trials; these tests show a
whole hour's worth of trials (and a minute of flapping) costs no message its budget.

Run with ``-s`` to see the measured figures.
"""

import json
import re
import signal
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db.models import Max
from django.utils import timezone

from callbacks.models import HoldKind, PaymentHold, QueueMessage
from payments.models import (
    AttemptOutcome,
    BreakerTransitionKind,
    CircuitBreakerTransition,
    EventKind,
    Payment,
    PaymentEvent,
    PaymentState,
    ProcessorAttempt,
)
from payments.processor.backends.http import reset_client
from payments.processor.breaker import ALERT_KEY, processor_breaker_get
from sandbox import FaultConfig, SandboxProcessor
from tests.callbacks.worker_support import WorkerProcess, drain, payments_created
from tests.waiting import wait_for
from triage.ingestion import dead_letters_ingest
from triage.models import Alert, AlertStatus, DeadLetter

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.scale]

# The breaker's defaults: a 15 s pause after opening, doubled at each reopening up to 300 s.
DEFAULT_PAUSE_SECONDS = 15.0
DEFAULT_MAX_PAUSE_SECONDS = 300.0
MAX_RECEIVE_COUNT = 10  # setup_queues' default RedrivePolicy
# A worker line per message it handled (callbacks.worker.outcomes.finish).
HANDLED = re.compile(r"message payment=\S+ message=(\S+) kind=(\S+) outcome=(\S+)")


def trials_within(seconds: float, *, pause: float, cap: float) -> int:
    """How many trials a breaker makes in an outage of ``seconds``: one after each pause, the
    pause doubling from ``pause`` up to ``cap`` (a trial's own calls take no time here)."""
    elapsed, trials = 0.0, 0
    while True:
        elapsed += min(cap, pause * 2**trials)
        if elapsed > seconds:
            return trials
        trials += 1


# 15, 30, 60, 120, 240, then 300 s apart: trials at 15, 45, 105, 225, 465, 765, ... 3465 s.
ONE_HOUR_TRIALS = trials_within(3600, pause=DEFAULT_PAUSE_SECONDS, cap=DEFAULT_MAX_PAUSE_SECONDS)


class Stack:
    """The sandbox (calling back into the live server) and two worker processes."""

    def __init__(
        self,
        *,
        sqs_queues,
        live_server,
        module_settings,
        tmp_path,
        env: dict[str, str],
        seed: int | None = None,
    ):
        self.queues = sqs_queues
        self.sandbox = SandboxProcessor(
            callback_url=f"{live_server.url}/callbacks/processor/",
            seed=seed,
            faults=FaultConfig(settle_after_seconds=0.5),
            callback_backoff_seconds=0.2,
            # Two callbacks per payment, a thousand payments: enough senders to keep up.
            callback_threads=8,
        ).start()
        module_settings.PROCESSOR_BASE_URL = self.sandbox.base_url
        for name, value in env.items():
            setattr(module_settings, name, float(value))
        reset_client()
        self.workers = [
            WorkerProcess("--wait-time", "1", log_dir=tmp_path, name=f"worker{i}", **env)
            for i in range(2)
        ]

    def stop_workers(self) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.signal(signal.SIGTERM)
        for worker in self.workers:
            assert worker.wait(60) == 0, worker.output[-5000:]

    def close(self) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.signal(signal.SIGTERM)
                worker.wait(60)
        self.sandbox.stop()
        reset_client()

    def handled_per_message(self) -> Counter:
        """How many times the workers handled each SQS message (one log line per handling)."""
        counts: Counter = Counter()
        for worker in self.workers:
            counts.update(m.group(1) for m in HANDLED.finditer(worker.output))
        return counts


@pytest.fixture
def make_stack(sqs_queues, live_server, module_settings, tmp_path):
    stacks = []

    def make(**env: str) -> Stack:
        stack = Stack(
            sqs_queues=sqs_queues,
            live_server=live_server,
            module_settings=module_settings,
            tmp_path=tmp_path,
            env=env,
        )
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.close()


def state_counts(payments) -> Counter:
    return Counter(
        Payment.objects.filter(pk__in=[p.pk for p in payments]).values_list("state", flat=True)
    )


def all_in(payments, state: str) -> bool:
    return state_counts(payments) == Counter({state: len(payments)})


def transition_kinds() -> Counter:
    return Counter(CircuitBreakerTransition.objects.values_list("kind", flat=True))


def longest_trial_seconds() -> float:
    """The longest a trial took to be decided (from PROBING to the transition after it)."""
    rows = list(CircuitBreakerTransition.objects.order_by("id").values_list("kind", "created_at"))
    return max(
        (
            (after - at).total_seconds()
            for (kind, at), (_, after) in zip(rows, rows[1:], strict=False)
            if kind == BreakerTransitionKind.PROBING
        ),
        default=0.0,
    )


def assert_redrive_policy_in_force(queues) -> None:
    """The test's main queue sends a message to the DLQ after 10 receives, as in production."""
    attributes = queues.client.get_queue_attributes(
        QueueUrl=queues.url, AttributeNames=["RedrivePolicy"]
    )["Attributes"]
    dlq_arn = queues.client.get_queue_attributes(
        QueueUrl=queues.dlq_url, AttributeNames=["QueueArn"]
    )["Attributes"]["QueueArn"]
    redrive = json.loads(attributes["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == dlq_arn
    assert int(redrive["maxReceiveCount"]) == MAX_RECEIVE_COUNT


def assert_no_dead_letter_and_no_hold(stack: Stack) -> dict:
    """Nothing dead-lettered by a worker or by SQS, nothing left waiting; returns the figures."""
    assert not QueueMessage.objects.filter(status="dead_lettered").exists()
    # A message the RedrivePolicy took would be marked so once a later one of its group came.
    assert not QueueMessage.objects.filter(outcome="redrive_policy").exists()
    assert dead_letters_ingest(max_messages=1000) == 0
    assert not DeadLetter.objects.exists()
    assert drain(stack.queues.client, stack.queues.dlq_url) == []
    assert not PaymentHold.objects.filter(released_at__isnull=True).exists()
    # Every SQS message (each original and each copy a released hold sent) was handled a few
    # times at most: the outage is not paid for in receives. A handling is a receive here: the
    # local server hands out one message per group per receive, so no message is received and
    # released untouched behind a group-mate, and no worker crashed. The empty DLQ above is
    # the hard bound (fewer than 10 receives each); this is the measured one.
    handled = stack.handled_per_message()
    assert handled, "no worker handled anything"
    return {
        "sqs_messages": len(handled),
        "handlings": sum(handled.values()),
        "max_handlings_per_message": max(handled.values()),
        "outage_holds": PaymentHold.objects.filter(kind=HoldKind.OUTAGE).count(),
    }


def assert_charged_once_and_in_order(stack: Stack, payments) -> None:
    charges = stack.sandbox.stats()["charges_by_payment"]
    assert charges == {str(p.id): 1 for p in payments}
    # In order within each group: the submission first, then the processor's events.
    applied: dict = {}
    for payment_id, to_state in (
        PaymentEvent.objects.filter(
            payment__in=payments,
            outcome="applied",
            kind__in=(EventKind.SUBMISSION, EventKind.PROCESSOR_EVENT),
        )
        .order_by("id")
        .values_list("payment_id", "to_state")
    ):
        applied.setdefault(payment_id, []).append(to_state)
    expected = [PaymentState.SUBMITTED, PaymentState.CONFIRMED]
    out_of_order = {k: v for k, v in applied.items() if v != expected}
    assert not out_of_order
    assert len(applied) == len(payments)


def test_thousand_payments_wait_through_an_hour_of_trials_without_spending_receives(make_stack):
    """1,000 payments through a 503 outage that lasts as many trials as an hour would.

    At the defaults (15 s pause, doubled at each reopening, capped at 300 s) a breaker makes 15
    trials in the first hour of an outage (at 15, 45, 105, 225, 465, 765 s, then every 300 s up
    to 3465 s), each one real submissions released from their holds onto the queue. Here the
    pauses are 0.2 s doubling to 0.5 s and the outage goes on until 15 more trials have failed
    after the last of the payments (all created once it started) was created: each of them
    waits through at least an hour's worth of trials, at the default RedrivePolicy (10
    receives). More trials run while the payments are being created.
    """
    began = time.monotonic()
    stack = make_stack(
        PROCESSOR_BREAKER_PAUSE_SECONDS="0.2",
        PROCESSOR_BREAKER_MAX_PAUSE_SECONDS="0.5",
        PROCESSOR_CONNECT_TIMEOUT_SECONDS="0.3",
    )
    assert ONE_HOUR_TRIALS == 15
    assert_redrive_policy_in_force(stack.queues)

    stack.sandbox.outage_start("503", 3600)
    outage_began = time.monotonic()
    payments = make_payments(1000, "size")
    created = time.monotonic() - began
    # The last payment created waits through as many failed trials as an hour makes.
    reopened_before = transition_kinds()[BreakerTransitionKind.REOPENED]
    wait_for(
        lambda: (
            transition_kinds()[BreakerTransitionKind.REOPENED] >= reopened_before + ONE_HOUR_TRIALS
        ),
        240,
        f"{ONE_HOUR_TRIALS} failed trials",
    )
    # Every payment waits behind its outage hold, none charged: each charge comes after this.
    waiting = state_counts(payments)
    assert waiting == Counter({PaymentState.PENDING: 1000})
    assert stack.sandbox.stats()["charges_by_payment"] == {}
    holds_waiting = PaymentHold.objects.filter(
        kind=HoldKind.OUTAGE, released_at__isnull=True
    ).count()
    stack.sandbox.outage_stop()
    outage_lasted = time.monotonic() - outage_began
    recovery = wait_for(
        lambda: all_in(payments, PaymentState.CONFIRMED), 240, "every payment confirmed"
    )
    stack.stop_workers()

    figures = assert_no_dead_letter_and_no_hold(stack)
    assert_charged_once_and_in_order(stack, payments)
    # Each accepted once, all of them after the outage (none was charged when it ended).
    accepted = ProcessorAttempt.objects.filter(
        payment__in=payments, operation="submit", outcome=AttemptOutcome.ACCEPTED
    )
    assert accepted.count() == 1000

    kinds = transition_kinds()
    assert kinds[BreakerTransitionKind.OPENED] == 1
    assert kinds[BreakerTransitionKind.REOPENED] >= ONE_HOUR_TRIALS
    assert kinds[BreakerTransitionKind.PROBING] >= ONE_HOUR_TRIALS + 1  # the last one closed it
    assert kinds[BreakerTransitionKind.CLOSED] == 1
    [alert] = Alert.objects.filter(key=ALERT_KEY)
    assert alert.status == AlertStatus.FIRING  # the cool-down (300 s) has not passed
    failed_calls = ProcessorAttempt.objects.filter(
        operation="submit", outcome=AttemptOutcome.RETRYABLE
    ).count()
    # The processor was called only to open the breaker and by the trials: 1,000 payments
    # retrying on their own would have made thousands of calls.
    assert failed_calls <= 5 + 3 * kinds[BreakerTransitionKind.PROBING]
    # Few receives per message: far below the RedrivePolicy's 10.
    assert figures["max_handlings_per_message"] <= 3
    print(
        f"\noutage at size: 1000 payments, runtime {time.monotonic() - began:.1f} s "
        f"(create {created:.1f} s, outage {outage_lasted:.1f} s, recovery {recovery:.1f} s); "
        f"outage holds waiting at the end of the outage {holds_waiting}; "
        f"transitions {dict(kinds)}, longest trial {longest_trial_seconds():.1f} s; "
        f"failed submission calls {failed_calls}; "
        f"dead letters 0; alerts {Alert.objects.filter(key=ALERT_KEY).count()}; {figures}"
    )


def test_flapping_processor_is_one_incident_opened_within_a_few_failures(make_stack):
    """A healthy period, then a minute of every other debit failing with payments flowing,
    then recovery: the breaker opens within a few failures however busy the healthy period was,
    stays open while the flap lasts (a trial needs all of its calls to succeed), and the whole
    flap is one incident with one alert, resolved once the breaker stayed closed for the
    cool-down."""
    began = time.monotonic()
    stack = make_stack(
        PROCESSOR_BREAKER_PAUSE_SECONDS="1",
        PROCESSOR_BREAKER_MAX_PAUSE_SECONDS="4",
        PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS="8",
        PROCESSOR_CONNECT_TIMEOUT_SECONDS="0.3",
    )
    assert_redrive_policy_in_force(stack.queues)

    healthy = make_payments(300, "healthy")
    wait_for(lambda: all_in(healthy, PaymentState.CONFIRMED), 120, "the healthy period")
    healthy_lasted = time.monotonic() - began
    attempts_before = ProcessorAttempt.objects.aggregate(top=Max("pk"))["top"] or 0
    assert not CircuitBreakerTransition.objects.exists()

    flap_seconds = 60
    stack.sandbox.outage_start("flap", flap_seconds)
    flap_began = time.monotonic()
    flap_started_at = timezone.now()
    during: list[Payment] = []
    # 300 more over the flap's first 30 s, ten at a time: payments keep arriving through the
    # opening, the trials and the reopenings.
    for chunk in range(30):
        during += make_payments(10, f"flap{chunk:02d}")
        time.sleep(max(0.0, flap_began + chunk + 1 - time.monotonic()))
    time.sleep(max(0.0, flap_began + flap_seconds - time.monotonic()))
    flap_calls_failed = stack.sandbox.stats()["outage_calls_failed"]
    # The flap is over when the sandbox says so (its own clock).
    wait_for(lambda: not stack.sandbox.outage()["mode"], 5, "the end of the flap", every=0.1)
    everyone = healthy + during
    recovery = wait_for(
        lambda: all_in(everyone, PaymentState.CONFIRMED), 120, "every payment confirmed"
    )
    incident_end = wait_for(
        lambda: processor_breaker_get().opened_at is None, 60, "the end of the incident"
    )
    stack.stop_workers()

    figures = assert_no_dead_letter_and_no_hold(stack)
    assert_charged_once_and_in_order(stack, everyone)

    opened = CircuitBreakerTransition.objects.get(kind=BreakerTransitionKind.OPENED)
    failed = ProcessorAttempt.objects.filter(
        pk__gt=attempts_before, operation="submit", outcome=AttemptOutcome.RETRYABLE
    )
    failed_before_open = failed.filter(started_at__lte=opened.created_at).count()
    # Half of the last 10 failed: 5 failures, plus the call the other worker had in flight.
    assert 1 <= failed_before_open <= 7

    kinds = transition_kinds()
    assert kinds[BreakerTransitionKind.OPENED] == 1
    assert kinds[BreakerTransitionKind.RESOLVED] == 1
    assert kinds[BreakerTransitionKind.REOPENED] >= 1  # the flap outlasted the pauses
    # No trial passed while it flapped: it closed once, after the flap.
    closed = CircuitBreakerTransition.objects.get(kind=BreakerTransitionKind.CLOSED)
    assert closed.created_at >= flap_started_at + timedelta(seconds=flap_seconds - 1)
    [alert] = Alert.objects.filter(key=ALERT_KEY)
    assert alert.status == AlertStatus.RESOLVED
    assert figures["max_handlings_per_message"] <= 3
    print(
        f"\nflapping: {len(healthy)} healthy + {len(during)} during the flap, runtime "
        f"{time.monotonic() - began:.1f} s (healthy {healthy_lasted:.1f} s, flap {flap_seconds} "
        f"s, recovery {recovery:.1f} s, then incident end {incident_end:.1f} s); "
        f"failed calls before open {failed_before_open}, in all {failed.count()} "
        f"(sandbox 503s {flap_calls_failed}); transitions {dict(kinds)}, longest trial "
        f"{longest_trial_seconds():.1f} s; dead letters 0; "
        f"alerts {Alert.objects.filter(key=ALERT_KEY).count()} ({alert.status}); {figures}"
    )


def make_payments(count: int, prefix: str) -> list[Payment]:
    return payments_created(count, prefix, merchant_id="merchant-size", first_amount="1.00")
