"""run_sqs_worker as real processes: signals, SIGKILL, two workers at once, the heartbeat."""

import json
import re
import signal
import time

import pytest
from django.utils import timezone

from callbacks.models import PaymentHold, ProcessingError, QueueMessage
from callbacks.schema import processor_event_message
from callbacks.worker.crashes import NEVER_FINISHED
from payments.models import (
    LedgerEntry,
    Payment,
    PaymentEvent,
    PaymentState,
    ProcessedEvent,
    ProcessorAttempt,
)
from sandbox import DebitLatch, FaultConfig, SandboxProcessor
from tests.callbacks.worker_support import WorkerProcess, drain, queue_counts, send_body
from tests.factories import PaymentFactory, processor_event
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

SUMMARY = re.compile(r"run_sqs_worker stopped: (\d+) handled .*, (\d+) deleted, (\d+) released")


@pytest.fixture
def start_sandbox(module_settings):
    """Start the sandbox processor answering every debit after ``latency`` seconds."""
    servers = []

    def start(latency: float = 0.4, *, timeout: float | None = None) -> SandboxProcessor:
        server = SandboxProcessor(
            faults=FaultConfig(latency_median_ms=latency * 1000, latency_sigma=0.001)
        ).start()
        servers.append(server)
        module_settings.PROCESSOR_BASE_URL = server.base_url
        module_settings.PROCESSOR_TIMEOUT_SECONDS = latency + 5 if timeout is None else timeout
        return server

    yield start
    for server in servers:
        if server.latch is not None:
            server.latch.release()  # a failed test must not leave a request held
        server.stop()


def summary(worker: WorkerProcess) -> tuple[int, int, int]:
    match = SUMMARY.search(worker.output)
    assert match, worker.output
    return tuple(int(g) for g in match.groups())


def submit_messages(sqs_queues, count: int) -> list[Payment]:
    payments = [
        PaymentFactory(state=PaymentState.PENDING, source_token=f"tok_good_{i:02d}abc")
        for i in range(count)
    ]
    for payment in payments:
        send_body(
            sqs_queues.client,
            sqs_queues.url,
            payment.id,
            {"kind": "submit_payment", "payment_id": str(payment.id)},
        )
    return payments


def submitted_once_each(payments, sandbox) -> None:
    charges = sandbox.stats()["charges_by_payment"]
    for payment in payments:
        payment.refresh_from_db()
        assert payment.state == PaymentState.SUBMITTED
        assert charges.get(str(payment.id)) == 1
        applied = PaymentEvent.objects.filter(
            payment=payment, kind="submission", outcome="applied"
        ).count()
        assert applied == 1


def test_sigterm_finishes_the_current_message_and_releases_the_rest(
    sqs_queues, start_sandbox, tmp_path
):
    sandbox = start_sandbox(0, timeout=30)
    sandbox.latch = DebitLatch(holds=1)
    payments = submit_messages(sqs_queues, 10)
    worker = WorkerProcess(
        "--wait-time=1", "--visibility-timeout=30", "--no-relay", log_dir=tmp_path
    )
    sandbox.latch.wait_held()  # the first message's call is open: the signal lands mid-message
    worker.signal(signal.SIGTERM)
    worker.wait_for("finishing the current message")  # handled while the call is still open
    sandbox.latch.release()

    assert worker.wait(30) == 0
    assert summary(worker) == (1, 1, 9)  # finished the current one, released the other nine
    assert QueueMessage.objects.count() == 1  # the released ones never started
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (9, 0)  # visible at once

    rerun = WorkerProcess(
        "--until-empty", "--wait-time=0", "--no-relay", log_dir=tmp_path, name="rerun"
    )
    assert rerun.wait(60) == 0
    submitted_once_each(payments, sandbox)
    assert set(QueueMessage.objects.values_list("attempts", flat=True)) == {1}
    assert drain(sqs_queues.client, sqs_queues.url) == []


def test_second_signal_exits_at_once(sqs_queues, start_sandbox, tmp_path):
    sandbox = start_sandbox(0, timeout=30)
    sandbox.latch = DebitLatch(holds=1)
    submit_messages(sqs_queues, 1)
    worker = WorkerProcess("--wait-time=1", "--no-relay", log_dir=tmp_path)
    sandbox.latch.wait_held()
    worker.signal(signal.SIGTERM)
    worker.wait_for("finishing the current message")  # the first signal handled
    worker.signal(signal.SIGTERM)

    # Exits while its processor call is still held open: it did not wait for the call.
    assert worker.wait(10) == 1
    assert sandbox.stats()["requests"] == {}  # the held call has not been answered yet
    assert "stopped:" not in worker.output


def test_sigkill_mid_call_then_restart_replays_the_charge_and_applies_nothing_twice(
    sqs_queues, start_sandbox, tmp_path
):
    """The worker dies while its debit call is open at the processor (charged, not answered);
    the restarted worker retries the same key and gets the original result back."""
    sandbox = start_sandbox(0, timeout=30)
    sandbox.latch = DebitLatch(holds=1)
    payments = submit_messages(sqs_queues, 10)
    worker = WorkerProcess(
        "--wait-time=1", "--visibility-timeout=2", "--no-relay", log_dir=tmp_path
    )
    [held_key] = sandbox.latch.wait_held()
    worker.kill()  # certain to land mid-call: the call cannot end before release()
    sandbox.latch.release()
    # The processor finishes the call and answers a connection nobody reads any more.
    wait_for(lambda: sandbox.stats()["requests"] == {"debit_create": 1}, 10, "the answer")
    held = Payment.objects.get(idempotency_key=held_key)
    assert held.state == PaymentState.PENDING  # the dead worker never saw the answer

    restarted = WorkerProcess(
        "--wait-time=1", "--visibility-timeout=10", "--no-relay", log_dir=tmp_path, name="again"
    )
    wait_for(
        lambda: (
            not Payment.objects.filter(state=PaymentState.PENDING).exists()
            and not QueueMessage.objects.exclude(status="done").exists()
            and queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)
        ),
        60,
        "every payment to be submitted and every message deleted",
    )
    restarted.signal(signal.SIGTERM)
    assert restarted.wait(30) == 0

    submitted_once_each(payments, sandbox)
    stats = sandbox.stats()
    assert stats["replays"] == 1  # the retried key was answered with the original result
    assert stats["charges"][held_key] == 1
    assert stats["requests"] == {"debit_create": 11}
    assert QueueMessage.objects.count() == 10
    # Only the message whose call was open when the process died was started twice.
    attempts = dict(QueueMessage.objects.values_list("body__payment_id", "attempts"))
    assert attempts.pop(str(held.id)) == 2
    assert set(attempts.values()) == {1}
    # Its killed start, found in progress when it came back, is its one error row.
    [error] = ProcessingError.objects.all()
    assert (error.payment_id, error.error_class, error.attempt_number) == (
        str(held.id),
        NEVER_FINISHED,
        1,
    )


def _slow_call_taken_by_two_workers(sqs_queues, start_sandbox, tmp_path, *, heartbeat: bool):
    """Two workers, visibility timeout 2 s, the first debit call held open at the sandbox."""
    sandbox = start_sandbox(0, timeout=30)
    sandbox.latch = DebitLatch(holds=1)
    [payment] = submit_messages(sqs_queues, 1)
    args = ("--wait-time=1", "--visibility-timeout=2", "--no-relay")
    env = {"WORKER_VISIBILITY_HEARTBEAT": "true" if heartbeat else "false"}
    workers = [WorkerProcess(*args, log_dir=tmp_path, name=f"w{i}", **env) for i in range(2)]
    sandbox.latch.wait_held()
    return sandbox, payment, workers


def _release_and_stop(sqs_queues, sandbox, payment, workers) -> None:
    sandbox.latch.release()
    wait_for(
        lambda: (
            Payment.objects.filter(pk=payment.pk, state=PaymentState.SUBMITTED).exists()
            and not QueueMessage.objects.exclude(status="done").exists()
            and queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)
        ),
        30,
        "the payment to be submitted and its message deleted",
    )
    for worker in workers:
        worker.signal(signal.SIGTERM)
    assert [worker.wait(30) for worker in workers] == [0, 0]


def test_slow_processor_call_is_not_taken_by_a_second_worker(sqs_queues, start_sandbox, tmp_path):
    """The call stays open past two visibility timeouts; the heartbeat keeps the message
    hidden, so the second worker never receives it and the processor is called once."""
    sandbox, payment, workers = _slow_call_taken_by_two_workers(
        sqs_queues, start_sandbox, tmp_path, heartbeat=True
    )
    time.sleep(5)  # 2.5 visibility timeouts: a leaked message would have been taken by now
    assert sandbox.stats()["replays"] == 0
    _release_and_stop(sqs_queues, sandbox, payment, workers)

    assert sandbox.stats()["requests"] == {"debit_create": 1}
    assert ProcessorAttempt.objects.filter(payment=payment).count() == 1
    record = QueueMessage.objects.get()
    assert (record.attempts, record.status) == (1, "done")
    assert sorted(summary(w)[0] for w in workers) == [0, 1]


def test_without_the_heartbeat_a_slow_call_is_taken_by_a_second_worker(
    sqs_queues, start_sandbox, tmp_path
):
    """Negative control for the test above: the same scenario with the heartbeat off. The
    visibility timeout runs out mid-call, the second worker takes the message and calls the
    processor again (only the idempotency key keeps it to one charge)."""
    sandbox, payment, workers = _slow_call_taken_by_two_workers(
        sqs_queues, start_sandbox, tmp_path, heartbeat=False
    )
    wait_for(lambda: sandbox.stats()["replays"] == 1, 20, "a second call for the same key")
    _release_and_stop(sqs_queues, sandbox, payment, workers)

    stats = sandbox.stats()
    assert stats["requests"] == {"debit_create": 2}
    assert stats["charges_by_payment"] == {str(payment.id): 1}
    assert QueueMessage.objects.get().attempts == 2
    assert sorted(summary(w)[0] for w in workers) == [1, 1]


def two_workers_share(sqs_queues, tmp_path, messages: list[tuple[str, dict, str]]) -> list[int]:
    """Two worker processes started, then ``messages`` ((group, body, deduplication id), in
    their order) sent in batches of ten; how many each handled, once both ran the queue dry.
    Sent once both have started, and each waits 5 s in a receive that finds none before it
    stops, so each takes some: since the worker's batch became cheaper, the first one started
    handled 200 events in half a second, before the second, started 0.4 s after it on a loaded
    machine, made its first receive."""
    args = ("--until-empty", "--wait-time=5", "--no-relay", "--visibility-timeout=30")
    workers = [WorkerProcess(*args, log_dir=tmp_path, name=f"w{i}") for i in range(2)]
    for worker in workers:
        worker.wait_for("run_sqs_worker starting")
    entries = [
        {
            "Id": str(index % 10),
            "MessageBody": json.dumps(body),
            "MessageGroupId": group,
            "MessageDeduplicationId": dedup,
        }
        for index, (group, body, dedup) in enumerate(messages)
    ]
    for start in range(0, len(entries), 10):
        response = sqs_queues.client.send_message_batch(
            QueueUrl=sqs_queues.url, Entries=entries[start : start + 10]
        )
        assert not response.get("Failed")
    assert [worker.wait(240) for worker in workers] == [0, 0]
    return [summary(worker)[0] for worker in workers]


# 500 payments (1,000 events, 15 to 30 s) in the scale tier and LocalStack's run (the Makefile's
# LOCALSTACK_TESTS); make test shares 100 between the two workers, the same checks (each worker
# must handle some: ``two_workers_share``).
@pytest.mark.parametrize(
    "count", [100, pytest.param(500, marks=pytest.mark.scale)], ids=lambda n: f"{n}-payments"
)
def test_two_workers_apply_the_payments_events_exactly_once_in_order(sqs_queues, tmp_path, count):
    payments = Payment.objects.bulk_create(
        [PaymentFactory.build(state=PaymentState.PENDING) for _ in range(count)]
    )
    messages = [
        (str(payment.id), processor_event_message(event), event.processor_event_id)
        for payment in payments
        for event in (processor_event(payment, t) for t in ("submitted", "settled"))
    ]

    handled = two_workers_share(sqs_queues, tmp_path, messages)

    assert sum(handled) == 2 * count and min(handled) > 0, handled
    assert Payment.objects.filter(state=PaymentState.CONFIRMED).count() == count
    assert LedgerEntry.objects.count() == count
    assert not ProcessingError.objects.exists()  # no event ever arrived out of order
    assert QueueMessage.objects.filter(status="done", outcome="applied").count() == 2 * count
    per_payment = PaymentEvent.objects.filter(kind="processor_event", outcome="applied")
    assert per_payment.count() == 2 * count
    first_of = {}
    for payment_id, event_type in per_payment.order_by("id").values_list(
        "payment_id", "event_type"
    ):
        first_of.setdefault(payment_id, event_type)
    assert set(first_of.values()) == {"submitted"}
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)


# Every payment's settlement ahead of its own submission in its group, as a hold's release can
# leave them (the submission sent back after the processor's callback arrived): 40 payments in
# make test, 300 in the scale tier, shared by two worker processes.
@pytest.mark.parametrize(
    "count", [40, pytest.param(300, marks=pytest.mark.scale)], ids=lambda n: f"{n}-payments"
)
def test_two_workers_send_events_ahead_of_their_submissions_behind_them_and_apply_both(
    sqs_queues, start_sandbox, tmp_path, count
):
    sandbox = start_sandbox(0)
    # A submission of each made its call before (which failed; the submission was parked): the
    # mark it set stays, as the processor may have the debit.
    payments = Payment.objects.bulk_create(
        [
            PaymentFactory.build(
                state=PaymentState.PENDING,
                source_token=f"tok_good_{i:03d}abc",
                submission_started_at=timezone.now(),
            )
            for i in range(count)
        ]
    )
    messages = []
    for payment in payments:
        event = processor_event(payment, "settled")
        messages += [
            (str(payment.id), processor_event_message(event), event.processor_event_id),
            (
                str(payment.id),
                {"kind": "submit_payment", "payment_id": str(payment.id)},
                f"submit-{payment.id}",
            ),
        ]

    handled = two_workers_share(sqs_queues, tmp_path, messages)

    # Each payment: its settlement moved, its submission, the settlement's copy.
    assert sum(handled) == 3 * count and min(handled) > 0, handled
    assert Payment.objects.filter(state=PaymentState.CONFIRMED).count() == count
    assert LedgerEntry.objects.count() == count
    assert sandbox.stats()["charges_by_payment"] == {str(p.id): 1 for p in payments}
    events = QueueMessage.objects.filter(kind="processor_event")
    assert events.filter(outcome="moved_behind").count() == count
    assert events.filter(outcome="applied").count() == count
    assert ProcessingError.objects.count() == count  # the moves' refusals, one each
    assert not PaymentHold.objects.exists()
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)
    assert drain(sqs_queues.client, sqs_queues.dlq_url) == []


def test_message_killing_its_workers_is_redriven_by_sqs_and_the_next_one_parked(
    sqs_queues, start_sandbox, tmp_path
):
    """Each worker that takes the submission dies mid-call (SIGKILL); after two receives the
    queue's RedrivePolicy moves it to the DLQ. The payment's next message must not overtake
    it: it is parked and the payment held.

    The doomed workers take one message per receive: a server that returns the group's next
    message in the same receive (LocalStack, AWS at times) would raise its receive count with
    the crasher's, and the RedrivePolicy would move it to the DLQ too."""
    start_sandbox(3)
    client = sqs_queues.client
    dlq_arn = client.get_queue_attributes(QueueUrl=sqs_queues.dlq_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    client.set_queue_attributes(
        QueueUrl=sqs_queues.url,
        Attributes={
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"})
        },
    )
    [payment] = submit_messages(sqs_queues, 1)
    event = processor_event(payment, "submitted")
    later_id = send_body(
        client, sqs_queues.url, payment.id, processor_event_message(event), dedup_id="later"
    )

    for round_number in (1, 2):
        worker = WorkerProcess(
            "--wait-time=1",
            "--visibility-timeout=1",
            "--batch-size=1",
            "--no-relay",
            log_dir=tmp_path,
            name=f"doomed{round_number}",
        )
        wait_for(
            lambda n=round_number: QueueMessage.objects.filter(attempts=n).exists(),
            30,
            f"attempt {round_number} to start",
        )
        worker.kill()

    survivor = WorkerProcess("--wait-time=1", "--no-relay", log_dir=tmp_path, name="survivor")
    wait_for(
        lambda: QueueMessage.objects.filter(message_id=later_id).exists(),
        30,
        "the later message to be handled",
    )
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(30) == 0

    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING  # "submitted" was not applied ahead
    assert QueueMessage.objects.get(message_id=later_id).status == "parked"
    crasher = QueueMessage.objects.get(kind="submit_payment")
    assert (crasher.status, crasher.outcome, crasher.attempts) == (
        "dead_lettered",
        "redrive_policy",
        2,
    )
    hold = PaymentHold.objects.get(payment_id=str(payment.id), released_at=None)
    assert hold.caused_by == crasher
    [moved] = drain(client, sqs_queues.dlq_url)
    assert json.loads(moved["Body"])["kind"] == "submit_payment"
    assert queue_counts(client, sqs_queues.url) == (0, 0)


def test_sigint_stops_an_idle_worker_cleanly(sqs_queues, tmp_path):
    worker = WorkerProcess("--wait-time=1", "--no-relay", log_dir=tmp_path)
    worker.wait_for("run_sqs_worker starting")
    worker.signal(signal.SIGINT)

    assert worker.wait(15) == 0
    assert summary(worker) == (0, 0, 0)


def test_sigkill_between_the_batch_savepoints_and_its_commit_loses_no_attempt(sqs_queues, tmp_path):
    """The worker is killed with its batch's work done in savepoints but not committed: nothing
    of it is applied, every attempt it started is still counted (the bulk start committed
    before the work), and a fresh worker applies each event exactly once."""
    payments = [PaymentFactory(state=PaymentState.SUBMITTED) for _ in range(5)]
    for payment in payments:
        event = processor_event(payment, "settled")
        send_body(
            sqs_queues.client,
            sqs_queues.url,
            payment.id,
            processor_event_message(event),
            dedup_id=event.processor_event_id,
        )
    worker = WorkerProcess(
        "--wait-time=1",
        "--visibility-timeout=2",
        "--no-relay",
        log_dir=tmp_path,
        WORKER_PAUSE_AT="batch_commit",
    )
    worker.wait_for("paused at batch_commit")
    worker.kill()

    started = list(QueueMessage.objects.values_list("status", "attempts"))
    started_ids = list(QueueMessage.objects.values_list("message_id", flat=True))
    assert started and set(started) == {("in_progress", 1)}  # counted, never finished
    assert not LedgerEntry.objects.exists()
    assert not PaymentEvent.objects.filter(kind="processor_event").exists()

    again = WorkerProcess(
        "--wait-time=1", "--visibility-timeout=10", "--no-relay", log_dir=tmp_path, name="again"
    )
    wait_for(
        lambda: (
            QueueMessage.objects.filter(status="done").count() == 5
            and queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)
        ),
        60,
        "every event applied and every message deleted",
    )
    again.signal(signal.SIGTERM)
    assert again.wait(30) == 0

    assert Payment.objects.filter(state=PaymentState.CONFIRMED).count() == 5
    assert LedgerEntry.objects.count() == 5  # once each
    assert PaymentEvent.objects.filter(kind="processor_event", outcome="applied").count() == 5
    assert ProcessedEvent.objects.count() == 5  # one dedup record each
    attempts = sorted(QueueMessage.objects.values_list("attempts", flat=True))
    # The killed batch's messages started twice (both attempts counted), any others once.
    assert attempts == [1] * (5 - len(started)) + [2] * len(started)
    # The killed starts, found in progress when their messages came back: one row each.
    assert sorted(ProcessingError.objects.values_list("message_id", "error_class")) == sorted(
        (message_id, NEVER_FINISHED) for message_id in started_ids
    )
