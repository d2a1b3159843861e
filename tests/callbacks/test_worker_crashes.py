"""Messages whose start never finished: the worker died while they ran (callbacks.worker.crashes).

The death is stood in for in this process by an exception no part of the worker catches: the
work's transaction rolls back and its start stays recorded in progress, as after a SIGKILL.
(tests/callbacks/test_worker_crash_loop.py kills real worker processes, on fauxqs and on
LocalStack.)"""

import dataclasses
import json

import pytest

from callbacks import conf as callbacks_conf
from callbacks.handlers import DEFAULT_HANDLERS
from callbacks.models import PaymentHold, ProcessingError, QueueMessage
from callbacks.schema import PROCESSOR_EVENT
from callbacks.services import (
    ReceivedMessage,
    StartAction,
    queue_message_never_finished,
    queue_message_start,
    queue_messages_interrupted,
)
from callbacks.worker import Worker
from callbacks.worker.crashes import NEVER_FINISHED, suspects_find
from payments.models import PaymentState
from tests.callbacks.worker_support import (
    applied_events,
    drain,
    queue_counts,
    receive_head,
    send_event,
)
from tests.factories import PaymentFactory

pytestmark = [pytest.mark.django_db(transaction=True)]


class WorkerKilled(BaseException):
    """The process dying mid-apply: no handler of the worker catches it."""


def handlers_killed_by(message_ids: set[str], ran: list[str], on_run=None) -> dict:
    """The default handlers, with a processor event whose id is in ``message_ids`` killing the
    worker; every message run is appended to ``ran`` (``on_run`` called with it first)."""
    event = DEFAULT_HANDLERS[PROCESSOR_EVENT]

    def func(message: ReceivedMessage) -> str:
        if on_run is not None:
            on_run(message)
        ran.append(message.message_id)
        if message.message_id in message_ids:
            raise WorkerKilled
        return event.func(message)

    return {**DEFAULT_HANDLERS, PROCESSOR_EVENT: dataclasses.replace(event, func=func)}


def one_batch(handlers: dict) -> bool:
    """A worker takes one batch; True if the batch killed it."""
    worker = Worker(wait_time=0, relay=False, handlers=handlers)
    try:
        with worker.running():
            worker.process_batch(worker.receive())
    except WorkerKilled:
        return True
    return False


def started_and_lost(sqs_queues, message_id: str) -> None:
    """A worker received the message alone, started it and died (it is visible again)."""
    received = receive_head(sqs_queues.client, sqs_queues.url, visibility=30)
    assert received["MessageId"] == message_id
    decision = queue_message_start(message=ReceivedMessage.from_sqs(received))
    assert decision.action == StartAction.PROCESS
    sqs_queues.client.change_message_visibility(
        QueueUrl=sqs_queues.url, ReceiptHandle=received["ReceiptHandle"], VisibilityTimeout=0
    )


def test_a_message_back_unfinished_gets_an_error_row_and_runs_after_the_rest_is_deleted(
    sqs_queues,
):
    lost_payment = PaymentFactory(state=PaymentState.SUBMITTED)
    other = PaymentFactory(state=PaymentState.SUBMITTED)
    lost_id, _ = send_event(sqs_queues.client, sqs_queues.url, lost_payment, "settled")
    started_and_lost(sqs_queues, lost_id)
    other_id, _ = send_event(sqs_queues.client, sqs_queues.url, other, "settled")
    ran: list[str] = []
    in_flight: dict[str, int] = {}

    def count_in_flight(message):
        in_flight[message.message_id] = queue_counts(sqs_queues.client, sqs_queues.url)[1]

    assert not one_batch(handlers_killed_by(set(), ran, count_in_flight))

    # Received first, run last: the other message was applied and deleted before it ran.
    assert ran == [other_id, lost_id]
    assert in_flight[lost_id] == 1
    [error] = ProcessingError.objects.filter(message_id=lost_id)
    assert (error.error_class, error.attempt_number, error.retryable, error.delay_seconds) == (
        NEVER_FINISHED,
        1,
        True,
        0.0,
    )
    assert "never finished" in error.message
    lost = QueueMessage.objects.get(message_id=lost_id)
    assert (lost.status, lost.attempts) == ("done", 2)
    assert QueueMessage.objects.get(message_id=other_id).attempts == 1
    assert not ProcessingError.objects.filter(message_id=other_id).exists()
    for payment in (lost_payment, other):
        payment.refresh_from_db()
        assert payment.state == PaymentState.CONFIRMED
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)


def test_a_message_killing_the_worker_is_dead_lettered_without_running_and_its_group_parked(
    sqs_queues,
):
    """Started with the batch's other group head the first time, then on its own: the other
    head is applied once; the crashing message is dead-lettered after WORKER_MAX_FAILED_STARTS
    starts, and its payment's next event is parked behind the hold, not applied ahead."""
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    other = PaymentFactory(state=PaymentState.SUBMITTED)
    crasher_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    other_id, _ = send_event(sqs_queues.client, sqs_queues.url, other, "settled")
    later_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "returned")
    ran: list[str] = []
    handlers = handlers_killed_by({crasher_id}, ran)

    deaths = 0
    for _ in range(callbacks_conf.WORKER_MAX_FAILED_STARTS + 3):
        deaths += one_batch(handlers)
        if queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0):
            break

    assert deaths == callbacks_conf.WORKER_MAX_FAILED_STARTS
    assert ran.count(crasher_id) == callbacks_conf.WORKER_MAX_FAILED_STARTS
    crasher = QueueMessage.objects.get(message_id=crasher_id)
    assert (crasher.status, crasher.attempts) == (
        "dead_lettered",
        callbacks_conf.WORKER_MAX_FAILED_STARTS,
    )
    errors = ProcessingError.objects.filter(message_id=crasher_id).order_by("id")
    assert [(e.error_class, e.attempt_number, e.delay_seconds) for e in errors] == [
        (NEVER_FINISHED, 1, 0.0),
        (NEVER_FINISHED, 2, 0.0),
        (NEVER_FINISHED, 3, None),
    ]
    [copy] = drain(sqs_queues.client, sqs_queues.dlq_url)
    dead_letter = json.loads(copy["Body"])["dead_letter"]
    assert (dead_letter["original_message_id"], dead_letter["error_class"]) == (
        crasher_id,
        NEVER_FINISHED,
    )
    hold = PaymentHold.objects.get(payment_id=str(payment.id), released_at=None)
    assert hold.caused_by == crasher
    assert [p.message_id for p in hold.parked.all()] == [later_id]
    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    other.refresh_from_db()
    assert other.state == PaymentState.CONFIRMED
    assert applied_events(other) == ["settled"]
    assert QueueMessage.objects.get(message_id=other_id).status == "done"


def test_a_start_cut_off_by_a_database_outage_is_not_taken_for_one_that_never_finished(
    sqs_queues,
):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    message_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    started_and_lost(sqs_queues, message_id)

    assert queue_messages_interrupted(message_ids=[message_id]) == 1  # the worker's hold-back

    again = ReceivedMessage.from_sqs(receive_head(sqs_queues.client, sqs_queues.url))
    assert again.receive_count == 2
    assert suspects_find([again], limit=3) == {}
    assert not ProcessingError.objects.exists()


def test_a_start_that_never_finished_is_recorded_once(sqs_queues):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    message_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    started_and_lost(sqs_queues, message_id)
    record = QueueMessage.objects.get(message_id=message_id)
    seen_by_another = QueueMessage.objects.get(message_id=message_id)

    def record_it(queue_message):
        return queue_message_never_finished(
            queue_message=queue_message,
            error_class=NEVER_FINISHED,
            message="never finished",
            delay_seconds=0.0,
        )

    assert record_it(record) is not None
    assert record_it(seen_by_another) is None
    assert ProcessingError.objects.filter(message_id=message_id).count() == 1
    assert QueueMessage.objects.get(message_id=message_id).status == "retrying"
