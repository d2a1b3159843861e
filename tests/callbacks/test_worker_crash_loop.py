"""A message that kills every worker that takes it: real worker processes, SIGKILLed by the
message's own work, and the messages received with it each time. On a server that hands out
several messages of one group per receive (LocalStack, as AWS may), and on one that hands out
one per group (fauxqs), where the RedrivePolicy is set to exactly the receives the worker needs:
every start is recorded before its work, the first receive's too, or the message would need one
receive more than that to reach the dead-letter path on its own error rows."""

import json
import signal

import pytest

from callbacks import conf as callbacks_conf
from callbacks.models import PaymentHold, ProcessingError, QueueMessage
from callbacks.schema import event_deduplication_id, processor_event_message
from callbacks.worker.crashes import NEVER_FINISHED
from payments.models import LedgerEntry, PaymentState
from tests.callbacks.crashing_worker import CRASHING_EVENT
from tests.callbacks.worker_support import (
    WorkerProcess,
    applied_events,
    drain,
    queue_counts,
    send_event,
)
from tests.factories import PaymentFactory, processor_event
from tests.triage.deadletters import operator
from triage import ingestion, services
from triage.models import DeadLetter, DeadLetterSource

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.subprocess]

# Each round is a worker process: it dies on the crashing message, or empties the queue.
MAX_ROUNDS = 12


def crashing_worker(tmp_path, name: str) -> WorkerProcess:
    return WorkerProcess(
        "--wait-time=1",
        "--visibility-timeout=2",
        "--until-empty",
        "--no-relay",
        log_dir=tmp_path,
        name=name,
        program=("-m", "tests.callbacks.crashing_worker"),
        CRASH_MARKER=str(tmp_path / "crash"),
    )


def send_crashing_event(client, url, payment, event_type) -> str:
    event = processor_event(payment, event_type)
    body = {**processor_event_message(event), "kind": CRASHING_EVENT}
    return client.send_message(
        QueueUrl=url,
        MessageBody=json.dumps(body),
        MessageGroupId=str(payment.id),
        MessageDeduplicationId=event_deduplication_id(event),
    )["MessageId"]


def rounds_until_the_queue_is_empty(sqs_queues, tmp_path, prefix: str) -> list[int]:
    """Start a worker, wait for it to die or to find the queue empty, again; the exit codes."""
    exits = []
    for n in range(MAX_ROUNDS):
        worker = crashing_worker(tmp_path, f"{prefix}{n}")
        exits.append(worker.wait(90))
        if exits[-1] == 0 and queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0):
            return exits
    raise AssertionError(f"the queue never emptied; worker exits {exits}")


def redrive_policy_set(client, sqs_queues, max_receive_count: int) -> None:
    dlq_arn = client.get_queue_attributes(QueueUrl=sqs_queues.dlq_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    client.set_queue_attributes(
        QueueUrl=sqs_queues.url,
        Attributes={
            "RedrivePolicy": json.dumps(
                {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receive_count)}
            )
        },
    )


@pytest.mark.localstack_only
def test_a_message_killing_its_workers_is_dead_lettered_and_its_batch_mates_never_reach_the_dlq(
    sqs_queues, tmp_path
):
    """The crashing message heads its payment's group, two later events of that payment behind
    it, and three events of two other payments beside it. Its work SIGKILLs the worker: the
    first time with every group head started with it in one batch. The worker records each
    start that never finished, runs the other groups first (applied once, in order), and after
    WORKER_MAX_FAILED_STARTS dead-letters the crashing message itself with its error rows, parking
    its payment's later events behind the hold: none of them reaches the RedrivePolicy, set
    here a few receives above those starts. A person's redrive, once the fault is fixed, applies the
    message, then the parked events, in order."""
    client = sqs_queues.client
    # A batch-mate is received with the crashing message at each of its starts, once more when
    # it is parked, and once by this test: one receive to spare.
    redrive_policy_set(client, sqs_queues, callbacks_conf.WORKER_MAX_FAILED_STARTS + 3)
    poisoned = PaymentFactory(state=PaymentState.PENDING)
    other = PaymentFactory(state=PaymentState.SUBMITTED)
    third = PaymentFactory(state=PaymentState.SUBMITTED)
    crasher_id = send_crashing_event(client, sqs_queues.url, poisoned, "submitted")
    other_ids = [send_event(client, sqs_queues.url, other, "settled")[0]]
    mate_ids = [send_event(client, sqs_queues.url, poisoned, "settled")[0]]
    other_ids.append(send_event(client, sqs_queues.url, other, "returned")[0])
    third_id, _ = send_event(client, sqs_queues.url, third, "settled")
    mate_ids.append(send_event(client, sqs_queues.url, poisoned, "returned")[0])
    (tmp_path / "crash").touch()
    # The server hands the crashing message out with its payment's later events in one receive
    # (else this would not test what it says). That receive counts too, as a worker's would.
    received = client.receive_message(
        QueueUrl=sqs_queues.url, MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=30
    )["Messages"]
    assert [m["MessageId"] for m in received if m["MessageId"] in [crasher_id, *mate_ids]] == [
        crasher_id,
        *mate_ids,
    ]
    for message in received:
        client.change_message_visibility(
            QueueUrl=sqs_queues.url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
        )

    exits = rounds_until_the_queue_is_empty(sqs_queues, tmp_path, "crashing")

    # Nothing but the worker's own copy of the crashing message went to the DLQ: no batch-mate,
    # nothing moved by the RedrivePolicy.
    ingestion.dead_letters_ingest()
    assert list(DeadLetter.objects.values_list("original_message_id", flat=True)) == [crasher_id]
    dead_letter = DeadLetter.objects.get()
    # It killed WORKER_MAX_FAILED_STARTS workers, then was not started again.
    assert exits.count(-signal.SIGKILL) == callbacks_conf.WORKER_MAX_FAILED_STARTS, exits
    crasher = QueueMessage.objects.get(message_id=crasher_id)
    assert (crasher.status, crasher.outcome, crasher.attempts) == (
        "dead_lettered",
        "dead_lettered",
        callbacks_conf.WORKER_MAX_FAILED_STARTS,
    )
    errors = list(ProcessingError.objects.filter(message_id=crasher_id).order_by("id"))
    assert [(e.error_class, e.attempt_number) for e in errors] == [
        (NEVER_FINISHED, n) for n in range(1, callbacks_conf.WORKER_MAX_FAILED_STARTS + 1)
    ]
    assert errors[-1].delay_seconds is None  # the row of the start it was given up after
    assert (dead_letter.original_message_id, dead_letter.source, dead_letter.kind) == (
        crasher_id,
        DeadLetterSource.WORKER,
        CRASHING_EVENT,
    )
    assert dead_letter.last_error_class == NEVER_FINISHED
    # Its payment's later events are parked, in order, behind the hold it caused.
    hold = PaymentHold.objects.get(payment_id=str(poisoned.id), released_at=None)
    assert hold.caused_by == crasher
    assert [p.message_id for p in hold.parked.all()] == mate_ids
    assert set(
        QueueMessage.objects.filter(message_id__in=mate_ids).values_list("status", flat=True)
    ) == {"parked"}
    poisoned.refresh_from_db()
    assert poisoned.state == PaymentState.PENDING  # nothing of it applied ahead of the crasher
    # The other payments' events: applied once each, in order.
    other.refresh_from_db()
    third.refresh_from_db()
    assert (other.state, third.state) == (PaymentState.RETURNED, PaymentState.CONFIRMED)
    assert applied_events(other) == ["settled", "returned"]
    assert applied_events(third) == ["settled"]
    assert set(
        QueueMessage.objects.filter(message_id__in=[*other_ids, third_id]).values_list(
            "status", flat=True
        )
    ) == {"done"}

    # Fixed; a person redrives the dead letter, which releases the hold behind it.
    (tmp_path / "crash").unlink()
    result = services.dead_letter_redrive(
        dead_letter=dead_letter, user=operator(), note="the fault is fixed"
    )
    assert result.released == len(mate_ids)
    assert rounds_until_the_queue_is_empty(sqs_queues, tmp_path, "fixed") == [0]

    poisoned.refresh_from_db()
    assert poisoned.state == PaymentState.RETURNED
    assert applied_events(poisoned) == ["submitted", "settled", "returned"]
    assert LedgerEntry.objects.filter(payment=poisoned).count() == 2  # credit, reversal
    assert LedgerEntry.objects.filter(payment=other).count() == 2
    assert LedgerEntry.objects.filter(payment=third).count() == 1
    assert not PaymentHold.objects.filter(released_at=None).exists()
    assert ingestion.dead_letters_ingest() == 0
    assert drain(client, sqs_queues.dlq_url) == []


@pytest.mark.fauxqs_only
def test_a_message_killing_every_worker_is_dead_lettered_by_it_within_the_redrive_policy(
    sqs_queues, tmp_path
):
    """fauxqs hands out one message of a group per receive: the crashing message comes alone of
    its payment, beside two other payments' events, which are started and killed with it the
    first time. It kills WORKER_MAX_FAILED_STARTS workers (its first receive's start counted
    like the others), and at its next receive the worker dead-letters it itself, with a row
    for each start that never finished. The RedrivePolicy lets it be received exactly that
    many times (WORKER_MAX_FAILED_STARTS + 1) and moves nothing: a start left unrecorded on
    the first receive would take one receive more and hand the message to SQS instead."""
    client = sqs_queues.client
    max_failed_starts = callbacks_conf.WORKER_MAX_FAILED_STARTS
    redrive_policy_set(client, sqs_queues, max_failed_starts + 1)
    poisoned = PaymentFactory(state=PaymentState.PENDING)
    other = PaymentFactory(state=PaymentState.SUBMITTED)
    third = PaymentFactory(state=PaymentState.SUBMITTED)
    crasher_id = send_crashing_event(client, sqs_queues.url, poisoned, "submitted")
    mate_ids = [
        send_event(client, sqs_queues.url, other, "settled")[0],
        send_event(client, sqs_queues.url, third, "settled")[0],
    ]
    later_id, _ = send_event(client, sqs_queues.url, poisoned, "settled")
    (tmp_path / "crash").touch()

    exits = rounds_until_the_queue_is_empty(sqs_queues, tmp_path, "crashing")

    assert exits.count(-signal.SIGKILL) == max_failed_starts, exits
    # Dead-lettered by the worker, once, and nothing by the RedrivePolicy.
    ingestion.dead_letters_ingest()
    dead_letter = DeadLetter.objects.get()
    assert (dead_letter.original_message_id, dead_letter.source) == (
        crasher_id,
        DeadLetterSource.WORKER,
    )
    assert dead_letter.last_error_class == NEVER_FINISHED
    assert not QueueMessage.objects.filter(outcome="redrive_policy").exists()
    crasher = QueueMessage.objects.get(message_id=crasher_id)
    assert (crasher.status, crasher.attempts) == ("dead_lettered", max_failed_starts)
    errors = ProcessingError.objects.filter(message_id=crasher_id).order_by("id")
    assert [(e.error_class, e.attempt_number) for e in errors] == [
        (NEVER_FINISHED, n) for n in range(1, max_failed_starts + 1)
    ]
    # The events started with it the first time: applied once each, their lost start recorded.
    for payment in (other, third):
        payment.refresh_from_db()
        assert payment.state == PaymentState.CONFIRMED
        assert applied_events(payment) == ["settled"]
    for mate_id in mate_ids:
        mate = QueueMessage.objects.get(message_id=mate_id)
        assert mate.status == "done"
        assert mate.attempts <= max_failed_starts
    # Its payment's next event waits behind the hold it caused, received once and parked.
    hold = PaymentHold.objects.get(payment_id=str(poisoned.id), released_at=None)
    assert hold.caused_by == crasher
    assert [p.message_id for p in hold.parked.all()] == [later_id]
    poisoned.refresh_from_db()
    assert poisoned.state == PaymentState.PENDING
    assert queue_counts(client, sqs_queues.url) == (0, 0)
    assert LedgerEntry.objects.filter(payment=poisoned).count() == 0
