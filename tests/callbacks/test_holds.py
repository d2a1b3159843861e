"""Payment holds: parking, release in order, redrive through a hold, RedrivePolicy gaps."""

import json
import uuid

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from callbacks.models import (
    ParkedMessage,
    PaymentHold,
    ProcessingError,
    QueueMessage,
    QueueMessageStatus,
)
from callbacks.selectors import payment_dead_lettered_message_ids, payment_queue_detail
from callbacks.services import (
    ReceivedMessage,
    StartAction,
    hold_release,
    message_republish,
    parked_message_republish,
    payment_hold,
    queue_message_mark_redrive_policy_dead_letter,
    queue_message_start,
)
from payments.models import PaymentState
from payments.selectors import payment_detail_extensions
from tests.callbacks.worker_support import (
    applied_events,
    drain,
    receive_head,
    run_worker,
    send_body,
    send_event,
)
from tests.factories import PaymentFactory, QueueMessageFactory, grant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast_retries")]


def hold_with_unknown_kind(sqs_queues, payment) -> PaymentHold:
    """Dead-letter a message of an unknown kind for the payment: it goes on hold at once."""
    body = {"kind": "refund_payment", "payment_id": str(payment.id)}
    send_body(sqs_queues.client, sqs_queues.url, payment.id, body)
    run_worker()
    return PaymentHold.objects.get(payment_id=str(payment.id), released_at=None)


def test_hold_release_republishes_parked_messages_in_order_and_they_are_applied(sqs_queues):
    payment = PaymentFactory(state=PaymentState.PENDING)
    hold = hold_with_unknown_kind(sqs_queues, payment)
    submitted_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "submitted")
    settled_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    run_worker()
    parked = list(hold.parked.all())
    assert [p.message_id for p in parked] == [submitted_id, settled_id]
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING

    assert hold_release(payment_id=payment.id, released_by="ops@example.com", note="fixed") == 2

    hold.refresh_from_db()
    assert hold.released_at is not None
    assert (hold.released_by, hold.note) == ("ops@example.com", "fixed")
    for row in hold.parked.all():
        assert row.released_at is not None and row.republished_message_id

    run_worker()

    republished = [
        QueueMessage.objects.get(message_id=row.republished_message_id) for row in hold.parked.all()
    ]
    assert [r.deduplication_id for r in republished] == [
        f"{submitted_id}:release:{hold.pk}",
        f"{settled_id}:release:{hold.pk}",
    ]
    assert [r.outcome for r in republished] == ["applied", "applied"]
    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert applied_events(payment) == ["submitted", "settled"]
    assert drain(sqs_queues.client, sqs_queues.url) == []


def test_hold_release_twice_sends_nothing_the_second_time(sqs_queues):
    payment = PaymentFactory(state=PaymentState.PENDING)
    hold_with_unknown_kind(sqs_queues, payment)
    send_event(sqs_queues.client, sqs_queues.url, payment, "submitted")
    run_worker()

    assert hold_release(payment_id=payment.id, released_by="a", note="") == 1
    assert hold_release(payment_id=payment.id, released_by="b", note="") == 0
    assert len(drain(sqs_queues.client, sqs_queues.url)) == 1
    assert PaymentHold.objects.get(payment_id=str(payment.id)).released_by == "a"


def test_hold_release_resumes_after_a_crash_part_way(sqs_queues):
    """A row marked republished before the crash is not sent again; the rest are."""
    payment = PaymentFactory(state=PaymentState.PENDING)
    hold = hold_with_unknown_kind(sqs_queues, payment)
    send_event(sqs_queues.client, sqs_queues.url, payment, "submitted")
    settled_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    run_worker()
    first = hold.parked.first()
    ParkedMessage.objects.filter(pk=first.pk).update(republished_message_id="sent-before-crash")

    assert hold_release(payment_id=payment.id, released_by="ops", note="resume") == 1

    [message] = drain(sqs_queues.client, sqs_queues.url)
    assert json.loads(message["Body"])["event"]["event_type"] == "settled"
    assert message["Attributes"]["MessageDeduplicationId"] == f"{settled_id}:release:{hold.pk}"


def test_hold_release_requires_who_released_it(sqs_queues):
    with pytest.raises(ValueError, match="released_by"):
        hold_release(payment_id=uuid.uuid4(), released_by="", note="")


def test_hold_release_without_an_active_hold_returns_zero(sqs_queues):
    assert hold_release(payment_id=uuid.uuid4(), released_by="ops", note="") == 0


def test_hold_release_refuses_a_hold_of_another_payment(sqs_queues):
    hold = payment_hold(payment_id=str(uuid.uuid4()), reason="one")

    with pytest.raises(ValueError, match=f"hold {hold.pk} belongs to payment"):
        hold_release(payment_id=uuid.uuid4(), hold=hold, released_by="ops", note="")

    hold.refresh_from_db()
    assert hold.released_at is None


def queue_message_row(payment_id: str, status: str) -> QueueMessage:
    done = status == QueueMessageStatus.DONE
    return QueueMessageFactory(
        group_id=payment_id,
        status=status,
        outcome="applied" if done else "",
        finished_at=timezone.now() if done else None,
    )


@pytest.mark.django_db
@pytest.mark.parametrize("status", [QueueMessageStatus.IN_PROGRESS, QueueMessageStatus.RETRYING])
def test_an_unfinished_message_moved_by_the_redrive_policy_is_recorded_dead_lettered(status):
    row = queue_message_row(str(uuid.uuid4()), status)

    assert queue_message_mark_redrive_policy_dead_letter(message_id=row.message_id)

    row.refresh_from_db()
    assert (row.status, row.outcome) == (QueueMessageStatus.DEAD_LETTERED, "redrive_policy")
    assert row.finished_at is not None
    assert payment_dead_lettered_message_ids(row.payment_id) == {row.message_id}


@pytest.mark.django_db
def test_a_finished_message_is_not_rewritten_as_dead_lettered_by_the_redrive_policy():
    row = queue_message_row(str(uuid.uuid4()), QueueMessageStatus.DONE)

    assert not queue_message_mark_redrive_policy_dead_letter(message_id=row.message_id)

    row.refresh_from_db()
    assert (row.status, row.outcome) == (QueueMessageStatus.DONE, "applied")
    assert payment_dead_lettered_message_ids(row.payment_id) == set()


def test_a_payment_has_at_most_one_active_hold():
    payment_id = str(uuid.uuid4())
    first = payment_hold(payment_id=payment_id, reason="one")
    assert payment_hold(payment_id=payment_id, reason="two") == first
    with pytest.raises(IntegrityError), transaction.atomic():
        PaymentHold.objects.create(payment_id=payment_id, reason="bypassing the service")
    PaymentHold.objects.filter(pk=first.pk).update(released_at="2026-11-02T12:00:00Z")
    assert payment_hold(payment_id=payment_id, reason="three") != first


def test_redriven_cause_passes_its_hold_then_release_applies_the_rest(sqs_queues):
    payment_id = uuid.uuid4()
    stand_in = PaymentFactory.build(id=payment_id)
    cause_id, _ = send_event(sqs_queues.client, sqs_queues.url, stand_in, "submitted")
    run_worker()  # PaymentNotFound six times: dead-lettered, held
    cause = QueueMessage.objects.get(message_id=cause_id)
    assert (cause.status, cause.attempts) == ("dead_lettered", 6)
    later_id, _ = send_event(sqs_queues.client, sqs_queues.url, stand_in, "settled")
    run_worker()
    assert ParkedMessage.objects.filter(message_id=later_id).exists()

    payment = PaymentFactory(id=payment_id, state=PaymentState.PENDING, amount=stand_in.amount)
    new_id = message_republish(queue_message_id=cause.pk, deduplication_id=f"{cause_id}:redrive")
    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED  # the cause went through the active hold
    assert QueueMessage.objects.get(message_id=new_id).body["redrive"] == {
        "original_message_id": cause_id,
        "republished_at": QueueMessage.objects.get(message_id=new_id).body["redrive"][
            "republished_at"
        ],
    }
    assert hold_release(payment_id=payment_id, released_by="ops", note="redriven") == 1
    run_worker()
    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert applied_events(payment) == ["submitted", "settled"]


def test_republish_from_a_dlq_body_strips_the_dead_letter_annotation(sqs_queues):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    hold_with_unknown_kind(sqs_queues, payment)
    [copy] = drain(sqs_queues.client, sqs_queues.dlq_url)
    body = json.loads(copy["Body"])

    message_republish(body=body, group_id=str(payment.id), deduplication_id="redrive-1")

    [message] = drain(sqs_queues.client, sqs_queues.url)
    republished = json.loads(message["Body"])
    assert "dead_letter" not in republished
    assert (
        republished["redrive"]["original_message_id"] == body["dead_letter"]["original_message_id"]
    )
    assert message["Attributes"]["MessageGroupId"] == str(payment.id)


def test_republish_needs_a_message_or_a_body_and_group():
    with pytest.raises(ValueError, match="body"):
        message_republish(deduplication_id="x", body={"kind": "processor_event"})
    with pytest.raises(ValueError, match="deduplication_id"):
        message_republish(deduplication_id="", body={}, group_id="g")


def test_message_that_crashed_workers_until_redrive_holds_its_payment(sqs_queues):
    """A message that kills the worker is moved to the DLQ by the queue's RedrivePolicy; the
    next message of its group must be parked, not applied ahead of it."""
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
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    crasher_id, _ = send_event(client, sqs_queues.url, payment, "settled")
    later_id, _ = send_event(client, sqs_queues.url, payment, "returned")

    # Two workers receive the first message, record its start as the worker does, and die
    # before finishing it (the message stays in flight until its visibility runs out).
    for _ in range(2):
        received = receive_head(client, sqs_queues.url, visibility=1)
        assert received["MessageId"] == crasher_id
        decision = queue_message_start(message=ReceivedMessage.from_sqs(received))
        assert decision.action == StartAction.PROCESS
        client.change_message_visibility(
            QueueUrl=sqs_queues.url, ReceiptHandle=received["ReceiptHandle"], VisibilityTimeout=0
        )

    run_worker()

    [moved] = drain(client, sqs_queues.dlq_url)
    assert json.loads(moved["Body"])["event"]["event_type"] == "settled"  # moved by SQS, not by us
    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED  # "returned" was not applied ahead
    assert QueueMessage.objects.get(message_id=later_id).status == "parked"
    hold = PaymentHold.objects.get(payment_id=str(payment.id), released_at=None)
    crasher = QueueMessage.objects.get(message_id=crasher_id)
    assert hold.caused_by == crasher and "RedrivePolicy" in hold.reason
    assert (crasher.status, crasher.outcome, crasher.attempts) == (
        "dead_lettered",
        "redrive_policy",
        2,
    )
    assert drain(client, sqs_queues.url) == []


def test_payment_detail_shows_processing_errors_and_the_active_hold(sqs_queues):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    hold = hold_with_unknown_kind(sqs_queues, payment)

    assert payment_queue_detail in payment_detail_extensions
    detail = payment_queue_detail(payment)

    [error] = detail["errors"]
    assert error["code"] == "processing_failed" and "error_class" not in error
    assert error["attempt"] == 1 and error["retryable"] is False
    assert detail["hold"]["id"] == hold.pk and detail["hold"]["kind"] == "triage"
    # The stored reason quotes the message's kind, from outside: only the admin shows it.
    assert "refund_payment" in hold.reason and "refund_payment" not in str(detail["hold"])
    hold_release(payment_id=payment.id, released_by="ops", note="")
    assert payment_queue_detail(payment)["hold"] is None


def test_payment_api_detail_includes_worker_errors_and_the_hold(sqs_queues, api_client, user):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    grant(user, payment.merchant_id)
    hold = hold_with_unknown_kind(sqs_queues, payment)

    response = api_client.get(f"/api/payments/{payment.id}/")

    assert response.status_code == 200
    data = response.json()
    worker_errors = [e for e in data["errors"] if e.get("source") == "worker"]
    assert [e["code"] for e in worker_errors] == ["processing_failed"]
    assert data["hold"]["id"] == hold.pk


def test_republished_message_failing_mid_release_supersedes_the_hold_and_keeps_order(
    sqs_queues,
):
    """A release has sent two parked messages when the first of them fails for good: the copy
    behind it and the unsent rest wait under a new hold, in their original order."""
    payment = PaymentFactory(state=PaymentState.PENDING)
    first_hold = hold_with_unknown_kind(sqs_queues, payment)
    failing_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "returned")
    submitted_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "submitted")
    settled_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    run_worker()
    failing_row, submitted_row, _ = first_hold.parked.all()
    assert parked_message_republish(row=failing_row, hold=first_hold)
    assert parked_message_republish(row=submitted_row, hold=first_hold)
    failing_row.refresh_from_db()

    # "returned" cannot move a pending payment: six attempts, dead-lettered; the "submitted"
    # copy behind it is parked again instead of being applied.
    run_worker()

    first_hold.refresh_from_db()
    assert first_hold.released_at is not None and "Superseded" in first_hold.note
    second_hold = PaymentHold.objects.get(payment_id=str(payment.id), released_at=None)
    assert second_hold.caused_by.message_id == failing_row.republished_message_id
    parked_types = [p.body["event"]["event_type"] for p in second_hold.parked.all()]
    assert parked_types == ["submitted", "settled"]
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING
    # The interrupted release of the first hold sends nothing more.
    assert hold_release(payment_id=payment.id, hold=first_hold, released_by="ops", note="") == 0

    assert hold_release(payment_id=payment.id, released_by="ops", note="after fixing") == 2
    run_worker()
    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert applied_events(payment) == ["submitted", "settled"]
    assert not ProcessingError.objects.filter(message_id__in=[submitted_id, settled_id]).exists()


def test_redrive_of_a_message_moved_by_the_redrive_policy_passes_a_hold_without_a_cause(
    sqs_queues,
):
    """The DLQ ingestion holds the payment without a QueueMessage cause; our record of the
    moved message still says it is running. Its redrive is applied, not parked behind it."""
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    moved_id, body = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    [received] = drain(sqs_queues.client, sqs_queues.url, visibility=1)
    queue_message_start(message=ReceivedMessage.from_sqs(received))  # then the worker died
    sqs_queues.client.purge_queue(QueueUrl=sqs_queues.url)  # as if moved to the DLQ
    hold = payment_hold(payment_id=str(payment.id), reason="moved by the RedrivePolicy")

    redrive_id = message_republish(
        body=body,
        group_id=str(payment.id),
        deduplication_id=f"{moved_id}:redrive:1",
        original_message_id=moved_id,
    )
    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert QueueMessage.objects.get(message_id=redrive_id).status == "done"
    moved = QueueMessage.objects.get(message_id=moved_id)
    assert (moved.status, moved.outcome) == ("dead_lettered", "redrive_policy")
    assert not ParkedMessage.objects.exists()
    hold.refresh_from_db()
    assert hold.is_active  # lifted by its release, not by the redrive
