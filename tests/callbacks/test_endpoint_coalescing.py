"""The callback endpoint under real concurrency: callbacks that arrive at once share one
SendMessageBatch, and each request is answered from SQS's answer for its own entry.

Threads post at the same moment through Django's request handling (the view, its signature
check and the gateway run in each thread, as under gunicorn's gthread workers) against the
real local SQS server. The batches are observed on the gateway's boto3 client (a botocore
event hook), not replaced.
"""

import json
import os
import threading

import pytest

from callbacks import sqs
from callbacks.schema import event_deduplication_id, parse_processor_event
from tests.callbacks.test_endpoint import event_body, post_json, queued_messages

# Long enough that every thread of a test joins the first batch even on a loaded machine; a
# batch stops waiting as soon as it holds every request the process may be running.
WINDOW = 5.0


@pytest.fixture(autouse=True)
def server_gauge(monkeypatch) -> sqs.RequestGauge:
    """This process's request gauge and coalescers, fresh for each test: how many requests
    earlier tests happened to run at once must not decide how long a batch here waits."""
    gauge = sqs.RequestGauge()
    monkeypatch.setattr(sqs, "_request_gauges", {os.getpid(): gauge})
    monkeypatch.setattr(sqs, "_coalescers", {})
    return gauge


@pytest.fixture
def sent_batches(sqs_queues):
    """The entries of every SendMessageBatch and SendMessage call the gateway makes."""
    calls: list[tuple[str, list[dict]]] = []

    def record(params, model, **kwargs):
        if model.name == "SendMessageBatch":
            calls.append((model.name, list(params["Entries"])))
        elif model.name == "SendMessage":
            calls.append((model.name, [params]))

    sqs.sqs_client().meta.events.register("provide-client-params.sqs", record)
    return calls


def post_all_at_once(bodies: list[dict]) -> list:
    """Post every body from its own thread, all released together; the responses in order.

    The process has run that many requests at once before (as a server with that many threads
    has), so the first batch waits for all of them: which thread reaches the sender first, and
    whether the others have announced themselves by then, is the scheduler's choice."""
    sqs._request_gauge().peak = len(bodies)
    responses: list = [None] * len(bodies)
    start = threading.Barrier(len(bodies))

    def run(i: int) -> None:
        start.wait()
        responses[i] = post_json(bodies[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return responses


def dedup_id(body: dict) -> str:
    return event_deduplication_id(parse_processor_event(body))


def queued_dedup_ids(sqs_queues) -> list[str]:
    return [m["Attributes"]["MessageDeduplicationId"] for m in queued_messages(sqs_queues)]


def test_concurrent_callbacks_share_one_batch_and_each_is_queued_exactly_once(
    sqs_queues, module_settings, sent_batches
):
    module_settings.CALLBACK_SEND_COALESCE_SECONDS = WINDOW
    bodies = [event_body() for _ in range(6)]

    responses = post_all_at_once(bodies)

    assert [r.status_code for r in responses] == [202] * 6
    assert sorted(queued_dedup_ids(sqs_queues)) == sorted(dedup_id(b) for b in bodies)
    assert max(len(entries) for name, entries in sent_batches) > 1
    assert {name for name, _ in sent_batches} == {"SendMessageBatch"}
    for _, entries in sent_batches:
        assert len({e["Id"] for e in entries}) == len(entries)  # entry ids unique per batch


def test_each_batched_callback_keeps_its_group_and_dedup_id(sqs_queues, module_settings):
    module_settings.CALLBACK_SEND_COALESCE_SECONDS = WINDOW
    bodies = [event_body() for _ in range(4)]

    post_all_at_once(bodies)

    queued = {m["Attributes"]["MessageDeduplicationId"]: m for m in queued_messages(sqs_queues)}
    for body in bodies:
        message = queued[dedup_id(body)]
        assert message["Attributes"]["MessageGroupId"] == body["payment_id"]
        assert (
            json.loads(message["Body"])["event"]["processor_event_id"]
            == (body["processor_event_id"])
        )


def test_a_refused_entry_fails_only_its_own_request(sqs_queues, module_settings, sent_batches):
    """SQS refuses one entry of the batch (too large for the queue); its request alone gets
    the endpoint's queue-outage answer, the others are accepted and queued once each."""
    module_settings.CALLBACK_SEND_COALESCE_SECONDS = WINDOW
    sqs_queues.client.set_queue_attributes(
        QueueUrl=sqs_queues.url, Attributes={"MaximumMessageSize": "1024"}
    )
    small = [event_body() for _ in range(5)]
    too_large = event_body(message="x" * 1000)

    responses = post_all_at_once([*small, too_large])

    assert [r.status_code for r in responses] == [202] * 5 + [503]
    refused = responses[-1]
    assert int(refused["Retry-After"]) > 0
    assert "nothing was accepted" in refused.json()["error"]["message"]
    assert sorted(queued_dedup_ids(sqs_queues)) == sorted(dedup_id(b) for b in small)
    [shared] = [
        entries
        for _, entries in sent_batches
        if dedup_id(too_large) in {e["MessageDeduplicationId"] for e in entries}
    ]
    assert len(shared) > 1  # the refused entry was sent beside accepted ones


def test_a_batch_that_cannot_be_sent_fails_every_request_in_it(sqs_queues, module_settings):
    module_settings.CALLBACK_SEND_COALESCE_SECONDS = WINDOW
    sqs.main_queue_url()  # resolved and cached: the batch call itself is what fails
    sqs_queues.client.delete_queue(QueueUrl=sqs_queues.url)

    responses = post_all_at_once([event_body() for _ in range(4)])

    assert [r.status_code for r in responses] == [503] * 4
    assert all(int(r["Retry-After"]) > 0 for r in responses)


def test_a_repeat_in_the_same_batch_is_accepted_and_queued_once(sqs_queues, module_settings):
    module_settings.CALLBACK_SEND_COALESCE_SECONDS = WINDOW
    body = event_body()

    responses = post_all_at_once([body, body, event_body()])

    assert [r.status_code for r in responses] == [202] * 3
    assert queued_dedup_ids(sqs_queues).count(dedup_id(body)) == 1


def test_with_coalescing_off_each_callback_is_sent_alone(sqs_queues, module_settings, sent_batches):
    module_settings.CALLBACK_SEND_COALESCE_SECONDS = 0
    bodies = [event_body() for _ in range(4)]

    responses = post_all_at_once(bodies)

    assert [r.status_code for r in responses] == [202] * 4
    assert [name for name, _ in sent_batches] == ["SendMessage"] * 4
    assert sorted(queued_dedup_ids(sqs_queues)) == sorted(dedup_id(b) for b in bodies)
