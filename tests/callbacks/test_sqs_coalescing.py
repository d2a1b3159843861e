"""callbacks.sqs's coalescing sender: concurrent callers' messages go out in batches within
SQS's limits (ten entries, 256 KiB), each caller answered for its own message, against the real
local SQS server."""

import threading
import time
import uuid

import pytest
from django.db import transaction
from prometheus_client import REGISTRY

from callbacks import sqs
from tests.callbacks.test_sqs_gateway import receive_all


@pytest.fixture
def batch_sizes(sqs_queues):
    """(entries, body bytes) of every SendMessageBatch call the gateway makes."""
    sizes: list[tuple[int, int]] = []

    def record(params, model, **kwargs):
        if model.name == "SendMessageBatch":
            entries = params["Entries"]
            sizes.append((len(entries), sum(len(e["MessageBody"].encode()) for e in entries)))

    sqs.sqs_client().meta.events.register("provide-client-params.sqs", record)
    return sizes


def message(**body) -> sqs.OutgoingMessage:
    group_id, deduplication_id = str(uuid.uuid4()), uuid.uuid4().hex
    return sqs.OutgoingMessage(
        body={"kind": "probe", **body}, group_id=group_id, deduplication_id=deduplication_id
    )


def send_concurrently(sender: sqs.CoalescingSender, gauge: sqs.RequestGauge, messages, url):
    """Each message from its own announced caller thread, all at once; ids or errors in order."""
    results: list = [None] * len(messages)
    for _ in messages:
        gauge.enter()  # every caller is running before any sends: the batch may wait for all
    start = threading.Barrier(len(messages))

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = sender.send(messages[i], url=url, announced=True)
        except sqs.QueueUnavailable as exc:
            results[i] = exc
        finally:
            gauge.leave()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(messages))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def new_sender(window: float) -> tuple[sqs.CoalescingSender, sqs.RequestGauge]:
    gauge = sqs.RequestGauge()
    sender = sqs.CoalescingSender(
        window=window, send_batch=sqs.send_messages_each_now, requests=gauge
    )
    return sender, gauge


def test_no_batch_holds_more_than_ten_messages(sqs_queues, batch_sizes):
    sender, gauge = new_sender(window=0.5)
    messages = [message() for _ in range(12)]

    ids = send_concurrently(sender, gauge, messages, sqs_queues.url)

    assert all(isinstance(i, str) for i in ids)
    assert max(entries for entries, _ in batch_sizes) <= sqs.BATCH_LIMIT
    assert sum(entries for entries, _ in batch_sizes) == 12
    received = receive_all(sqs_queues.url)
    assert sorted(m.message_id for m in received) == sorted(ids)


def test_no_batch_holds_more_than_256_kib(sqs_queues, batch_sizes):
    sender, gauge = new_sender(window=0.5)
    messages = [message(padding="x" * 100_000) for _ in range(4)]

    ids = send_concurrently(sender, gauge, messages, sqs_queues.url)

    assert all(isinstance(i, str) for i in ids)
    assert max(size for _, size in batch_sizes) <= sqs.BATCH_MAX_BYTES
    assert len(batch_sizes) >= 2
    assert len(receive_all(sqs_queues.url)) == 4


def batch_histogram() -> tuple[float, float]:
    """(entries, calls) the coalescing senders of this process have recorded so far."""
    name = "payments_callback_send_batch_entries"
    return tuple(REGISTRY.get_sample_value(name + suffix) or 0.0 for suffix in ("_sum", "_count"))


def test_a_batch_stops_waiting_once_every_running_caller_has_joined(sqs_queues, batch_sizes):
    sender, gauge = new_sender(window=20.0)
    entries, calls = batch_histogram()

    started = time.monotonic()
    ids = send_concurrently(sender, gauge, [message() for _ in range(4)], sqs_queues.url)

    assert time.monotonic() - started < 10
    assert all(isinstance(i, str) for i in ids)
    assert batch_sizes == [(4, batch_sizes[0][1])]
    # Operators see how many callbacks share a call (the metric an ingest bench reads too).
    assert batch_histogram() == (entries + 4, calls + 1)


def test_a_batch_closed_to_make_way_for_a_message_that_does_not_fit_is_sent_at_once(sqs_queues):
    """Its leader is woken when the batch is closed, not left waiting out the window."""
    window = 3.0
    sent_at: list[float] = []
    sender, gauge = new_sender(window=window)
    gauge.enter()
    gauge.enter()
    gauge.enter()  # three callers ran at once: no batch of these two is ever complete
    gauge.leave()
    event = "provide-client-params.sqs.SendMessageBatch"

    def record(**_) -> None:
        sent_at.append(time.monotonic())

    sqs.sqs_client().meta.events.register(event, record)
    first = threading.Thread(
        target=sender.send,
        args=(message(padding="x" * 200_000),),
        kwargs={"url": sqs_queues.url, "announced": True},
    )
    started = time.monotonic()
    try:
        first.start()
        while not sender._open:  # the first message leads a batch of its own
            time.sleep(0.001)
        sender.send(message(padding="y" * 200_000), url=sqs_queues.url, announced=True)
        first.join(30)
    finally:
        sqs.sqs_client().meta.events.unregister(event, record)
        gauge.leave()
        gauge.leave()

    assert len(sent_at) == 2
    assert min(sent_at) - started < window / 2
    assert len(receive_all(sqs_queues.url)) == 2


def test_a_lone_caller_is_sent_without_waiting(sqs_queues):
    sender, gauge = new_sender(window=20.0)
    gauge.enter()
    try:
        started = time.monotonic()
        message_id = sender.send(message(), url=sqs_queues.url, announced=True)
    finally:
        gauge.leave()

    assert time.monotonic() - started < 10
    assert [m.message_id for m in receive_all(sqs_queues.url)] == [message_id]


@pytest.mark.django_db
def test_a_coalesced_send_inside_a_transaction_is_refused_in_the_callers_thread(sqs_queues):
    with transaction.atomic():
        with pytest.raises(sqs.SqsCallInTransaction):
            sqs.send_message_coalesced_now(
                body={"kind": "probe"}, group_id="g", deduplication_id="d", window=0.01
            )

    assert receive_all(sqs_queues.url) == []


def test_send_messages_each_now_reports_each_entry(sqs_queues):
    sqs_queues.client.set_queue_attributes(
        QueueUrl=sqs_queues.url, Attributes={"MaximumMessageSize": "1024"}
    )
    fits, too_large = message(), message(padding="x" * 2000)

    outcome = sqs.send_messages_each_now([fits, too_large], url=sqs_queues.url)

    assert outcome.done == [fits]
    assert [m for m, _ in outcome.refused] == [too_large]
    assert [m.message_id for m in receive_all(sqs_queues.url)] == [outcome.results[0]["MessageId"]]
