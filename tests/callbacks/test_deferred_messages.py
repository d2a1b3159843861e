"""Deferred submissions: recorded with their receipt handle, released early, retried on failure."""

from datetime import timedelta

import pytest
from django.utils import timezone

from callbacks import sqs
from callbacks.models import DeferredMessage
from callbacks.retry import MAX_VISIBILITY_SECONDS, defer_hide_seconds
from callbacks.services import (
    ReceivedMessage,
    deferred_message_record,
    deferred_messages_release_now,
)
from payments.models import BreakerState, CircuitBreaker, CircuitBreakerTransition
from payments.processor.breaker import PROCESSOR, processor_breaker_get, processor_breaker_probe
from tests.callbacks.worker_support import queue_counts, send_body

pytestmark = pytest.mark.django_db(transaction=True)


def receive_one(sqs_queues, visibility=300) -> ReceivedMessage:
    response = sqs_queues.client.receive_message(
        QueueUrl=sqs_queues.url,
        MaxNumberOfMessages=1,
        VisibilityTimeout=visibility,
        AttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
    )
    return ReceivedMessage.from_sqs(response["Messages"][0])


def test_hide_grows_with_the_receive_count_up_to_the_sqs_limit():
    assert defer_hide_seconds(receive_count=1, wait=3) == 300
    assert defer_hide_seconds(receive_count=3, wait=3) == 1200
    assert defer_hide_seconds(receive_count=1, wait=900) == 900  # never shorter than the pause
    assert defer_hide_seconds(receive_count=40, wait=0) == MAX_VISIBILITY_SECONDS


def test_release_makes_deferred_messages_visible_and_forgets_them(sqs_queues):
    send_body(sqs_queues.client, sqs_queues.url, "g1", {"kind": "submit_payment"})
    message = receive_one(sqs_queues)
    deferred_message_record(message=message, hidden_seconds=300)
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 1)

    released = deferred_messages_release_now(queue_url=sqs_queues.url)

    assert released == 1
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (1, 0)
    assert not DeferredMessage.objects.exists()


def test_a_stale_receipt_handle_is_dropped_not_retried_forever(sqs_queues):
    send_body(sqs_queues.client, sqs_queues.url, "g1", {"kind": "submit_payment"})
    message = receive_one(sqs_queues)
    sqs_queues.client.delete_message(QueueUrl=sqs_queues.url, ReceiptHandle=message.receipt_handle)
    deferred_message_record(message=message, hidden_seconds=300)

    deferred_messages_release_now(queue_url=sqs_queues.url)

    assert not DeferredMessage.objects.exists()


def test_release_with_the_queue_unreachable_keeps_the_rows_for_the_next_try(sqs_queues, settings):
    send_body(sqs_queues.client, sqs_queues.url, "g1", {"kind": "submit_payment"})
    message = receive_one(sqs_queues)
    deferred_message_record(message=message, hidden_seconds=300)
    settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"
    sqs.reset()
    try:
        assert deferred_messages_release_now(queue_url=sqs_queues.url) == 0
    finally:
        settings.SQS_ENDPOINT_URL = sqs_queues.client.meta.endpoint_url
        sqs.reset()

    [row] = DeferredMessage.objects.all()
    assert row.released_at is None
    assert deferred_messages_release_now(queue_url=sqs_queues.url) == 1


def open_breaker(*, due: bool) -> None:
    processor_breaker_get()
    now = timezone.now()
    CircuitBreaker.objects.filter(name=PROCESSOR).update(
        state=BreakerState.OPEN,
        opened_at=now - timedelta(seconds=30),
        open_until=now - timedelta(seconds=1) if due else now + timedelta(seconds=30),
    )


def test_probe_is_a_status_read_that_closes_the_breaker_when_the_processor_answers(sandbox):
    open_breaker(due=True)

    assert processor_breaker_probe() == BreakerState.CLOSED
    assert sandbox.stats()["requests"] == {"debit_get": 1}
    assert sandbox.stats()["responses"] == {"404": 1}


def test_probe_during_an_outage_reopens_the_breaker(sandbox):
    open_breaker(due=True)
    sandbox.outage_start("503", 30)

    assert processor_breaker_probe() == BreakerState.OPEN
    assert CircuitBreakerTransition.objects.filter(kind="reopened").count() == 1


def test_probe_makes_no_call_before_the_pause_is_over_or_when_closed(sandbox):
    processor_breaker_get()
    assert processor_breaker_probe() == BreakerState.CLOSED
    open_breaker(due=False)
    assert processor_breaker_probe() == BreakerState.OPEN

    assert sandbox.stats()["requests"] == {}
