"""The worker's partial-batch path on a server that returns several messages of one group in one
receive, as AWS may (LocalStack does; fauxqs never does, so these run in the LocalStack run of
``make test``). Every batch here comes from a real receive with live receipt handles."""

import uuid

import pytest

from callbacks.handlers import DEFAULT_HANDLERS, Handler
from callbacks.models import ProcessingError, QueueMessage
from callbacks.schema import PROCESSOR_EVENT
from callbacks.worker import Worker
from payments.models import PaymentState
from tests.callbacks.worker_support import applied_events, queue_counts, send_body, send_event
from tests.factories import PaymentFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.localstack_only]

FLAKY = "flaky_probe"


def receive_group_together(worker: Worker, group_id: str, expected: list[str]) -> list:
    """One receive; it must hand out all of ``expected`` (one group's ids, in order) at once."""
    batch = worker.receive()
    of_group = [m.message_id for m in batch if m.group_id == group_id]
    # Without several of one group in one receive the path under test never runs: fail rather
    # than pass on a server that splits the group.
    assert of_group == expected, f"one receive gave {of_group} of the group, not {expected}"
    return batch


def test_one_receive_of_a_groups_events_applies_them_all_in_order(sqs_queues):
    payment = PaymentFactory(state=PaymentState.PENDING)
    other = PaymentFactory(state=PaymentState.SUBMITTED)
    events = ("submitted", "settled", "returned")
    sent = [send_event(sqs_queues.client, sqs_queues.url, payment, e)[0] for e in events]
    other_id, _ = send_event(sqs_queues.client, sqs_queues.url, other, "settled")

    worker = Worker(wait_time=0, relay=False)
    with worker.running():
        batch = receive_group_together(worker, str(payment.id), sent)
        assert {m.message_id for m in batch} == {*sent, other_id}
        # Handed over in reverse: the order must come from the sequence numbers, not the list.
        worker.process_batch(batch[::-1])

    payment.refresh_from_db()
    assert payment.state == PaymentState.RETURNED
    assert applied_events(payment) == list(events)
    assert set(QueueMessage.objects.values_list("status", flat=True)) == {"done"}
    assert worker.stats.deleted == 4 and worker.stats.released == 0
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)


def test_a_failure_inside_one_receives_group_releases_the_rest_then_all_apply_in_order(
    sqs_queues, fast_retries
):
    """submitted, a message that fails once, settled: all three in one receive. The first is
    applied, the second fails and stops the group, the third is made visible again untouched;
    the next receive brings both back together and they apply in order."""
    payment = PaymentFactory(state=PaymentState.PENDING)
    applied: list[str] = []
    failures_left = [1]

    def record_event(message):
        outcome = DEFAULT_HANDLERS[PROCESSOR_EVENT].func(message)
        applied.append(message.body["event"]["event_type"])
        return outcome

    def flaky(message):
        if failures_left[0]:
            failures_left[0] -= 1
            raise RuntimeError("fails once")
        applied.append(FLAKY)
        return "applied"

    handlers = {
        **DEFAULT_HANDLERS,
        PROCESSOR_EVENT: Handler(record_event, own_savepoint=True),
        FLAKY: Handler(flaky),
    }
    first_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "submitted")
    flaky_id = send_body(
        sqs_queues.client,
        sqs_queues.url,
        payment.id,
        {"kind": FLAKY, "payment_id": str(payment.id), "n": uuid.uuid4().hex},
    )
    third_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    sent = [first_id, flaky_id, third_id]

    worker = Worker(wait_time=0, relay=False, handlers=handlers)
    with worker.running():
        worker.process_batch(receive_group_together(worker, str(payment.id), sent))

    assert applied == ["submitted"]
    assert worker.stats.outcomes == {"applied": 1, "retried": 1}
    assert (worker.stats.deleted, worker.stats.released) == (1, 1)
    assert QueueMessage.objects.get(message_id=flaky_id).attempts == 1
    assert not QueueMessage.objects.filter(message_id=third_id).exists()  # never started

    again = Worker(wait_time=0, relay=False, handlers=handlers)
    with again.running():
        again.process_batch(receive_group_together(again, str(payment.id), [flaky_id, third_id]))

    assert applied == ["submitted", FLAKY, "settled"]
    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert applied_events(payment) == ["submitted", "settled"]
    flaky_record = QueueMessage.objects.get(message_id=flaky_id)
    assert (flaky_record.status, flaky_record.attempts) == ("done", 2)
    third_record = QueueMessage.objects.get(message_id=third_id)
    # Released untouched the first time: its one attempt is the one that applied it.
    assert (third_record.status, third_record.attempts) == ("done", 1)
    assert list(ProcessingError.objects.values_list("message_id", flat=True)) == [flaky_id]
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)
