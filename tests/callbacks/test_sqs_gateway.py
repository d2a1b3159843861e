"""callbacks.sqs, the one gateway to SQS: it refuses to run inside a database transaction, batches
in chunks of ten with SQS's ``Failed`` read back per entry, and types its errors."""

import uuid

import pytest
from django.db import connection, transaction

from callbacks import sqs
from tests.test_module_boundaries import ruff_on


def send_one(**kwargs) -> str:
    return sqs.send_message_now(
        body={"kind": "probe"},
        group_id=str(uuid.uuid4()),
        deduplication_id=uuid.uuid4().hex,
        **kwargs,
    )


def receive_all(url: str) -> list[sqs.ReceivedMessage]:
    received: list[sqs.ReceivedMessage] = []
    while batch := sqs.receive_messages(
        url=url, max_messages=10, wait_seconds=0, visibility_timeout=30
    ):
        received += batch
    return received


# --- the transaction rule ---------------------------------------------------------------------


@pytest.mark.django_db
def test_a_send_inside_a_transaction_is_refused_before_it_reaches_sqs(sqs_queues):
    with transaction.atomic():
        with pytest.raises(sqs.SqsCallInTransaction, match="inside a transaction"):
            send_one()

    assert receive_all(sqs_queues.url) == []


@pytest.mark.django_db
def test_every_kind_of_call_is_refused_inside_a_transaction(sqs_queues):
    send_one()
    [message] = receive_all(sqs_queues.url)
    calls = {
        "queue url": lambda: sqs.queue_url("never-looked-up.fifo"),
        "receive": lambda: receive_all(sqs_queues.url),
        "delete": lambda: sqs.delete_message(
            url=sqs_queues.url, receipt_handle=message.receipt_handle
        ),
        "delete batch": lambda: sqs.delete_messages(url=sqs_queues.url, messages=[message]),
        "visibility": lambda: sqs.change_visibility(
            url=sqs_queues.url, receipt_handle=message.receipt_handle, seconds=0
        ),
        "visibility batch": lambda: sqs.change_visibility_batch(
            url=sqs_queues.url, messages=[message], seconds=0
        ),
        "attributes": lambda: sqs.queue_attributes(sqs_queues.url, ["QueueArn"]),
        "send batch": lambda: sqs.send_messages_now(
            [sqs.OutgoingMessage(body={}, group_id="g", deduplication_id=uuid.uuid4().hex)]
        ),
    }
    for name, call in calls.items():
        with transaction.atomic():
            with pytest.raises(sqs.SqsCallInTransaction):
                call()
                pytest.fail(f"{name} ran inside a transaction")

    # Nothing was deleted or sent by the refused calls: the one message is still there.
    assert sqs.delete_messages(url=sqs_queues.url, messages=[message]).done == [message]
    assert receive_all(sqs_queues.url) == []


@pytest.mark.django_db
def test_a_call_made_in_a_savepoint_or_after_the_block_is_judged_by_the_open_blocks(sqs_queues):
    with transaction.atomic():
        with transaction.atomic():
            pass
        with pytest.raises(sqs.SqsCallInTransaction):
            send_one()
    send_one()  # the block is closed: the call goes through

    assert len(receive_all(sqs_queues.url)) == 1


@pytest.mark.django_db
def test_the_test_cases_own_wrapping_transaction_does_not_count(sqs_queues):
    # pytest-django runs this test inside atomic blocks of its own, as Django's durable check
    # knows; the gateway ignores them the same way, or no database test could call SQS.
    assert connection.in_atomic_block
    assert all(block._from_testcase for block in connection.atomic_blocks)
    with transaction.atomic(durable=True):
        pass  # Django agrees: this is the outermost real transaction

    send_one()

    assert len(receive_all(sqs_queues.url)) == 1


@pytest.mark.django_db(transaction=True)
def test_the_rule_holds_without_a_test_case_transaction(sqs_queues):
    assert not connection.in_atomic_block
    send_one()
    with transaction.atomic():
        with pytest.raises(sqs.SqsCallInTransaction):
            send_one()

    assert len(receive_all(sqs_queues.url)) == 1


@pytest.mark.django_db
def test_a_call_allowed_by_name_runs_inside_a_transaction(sqs_queues):
    with transaction.atomic():
        with sqs.transaction_allowed():
            message_id = send_one()

    assert [m.message_id for m in receive_all(sqs_queues.url)] == [message_id]


@pytest.mark.django_db
def test_the_allowance_ends_with_its_block(sqs_queues):
    with transaction.atomic():
        with sqs.transaction_allowed():
            send_one()
        with pytest.raises(sqs.SqsCallInTransaction):
            send_one()

    assert len(receive_all(sqs_queues.url)) == 1


@pytest.mark.django_db
def test_the_callback_endpoint_still_queues_when_the_host_wraps_requests_in_transactions(
    sqs_queues, monkeypatch
):
    from tests.callbacks.test_endpoint import event_body, post_json, queued_messages

    # A host with ATOMIC_REQUESTS: every view runs in a transaction unless it opts out.
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    body = event_body()

    response = post_json(body)

    assert response.status_code == 202, response.content
    [message] = queued_messages(sqs_queues)
    assert message["Attributes"]["MessageGroupId"] == body["payment_id"]


def test_an_app_module_importing_boto3_or_botocore_fails_the_lint():
    for source in ("import boto3\n", "from botocore.exceptions import ClientError\n"):
        result = ruff_on("triage/anything.py", source)
        assert result.returncode != 0
        assert "TID251" in result.stdout
        assert "callbacks.sqs" in result.stdout


# --- batches, parsing, errors -----------------------------------------------------------------


@pytest.mark.django_db
def test_a_batch_call_is_chunked_by_ten_and_reads_each_refusal_back(sqs_queues):
    ids = [send_one() for _ in range(12)]
    received = receive_all(sqs_queues.url)
    assert sorted(m.message_id for m in received) == sorted(ids)
    sqs.delete_message(url=sqs_queues.url, receipt_handle=received[11].receipt_handle)
    bogus = sqs.ReceivedMessage.from_sqs(
        {"MessageId": "bogus", "ReceiptHandle": "not-a-receipt-handle", "Body": "{}"}
    )

    outcome = sqs.change_visibility_batch(
        url=sqs_queues.url, messages=[*received[:11], bogus], seconds=0
    )

    assert outcome.done == received[:11]  # across two calls: 10, then 1 beside the bogus one
    assert [m for m, _ in outcome.refused] == [bogus]
    assert outcome.refused[0][1]  # SQS's reason is kept
    assert outcome.unreachable == []
    assert sorted(m.message_id for m in receive_all(sqs_queues.url)) == sorted(ids[:11])


@pytest.mark.django_db
def test_a_batch_call_that_cannot_reach_sqs_reports_every_entry_unreachable(
    sqs_queues, module_settings
):
    send_one()
    [message] = receive_all(sqs_queues.url)
    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"  # nothing listens there
    sqs.reset()

    outcome = sqs.delete_messages(url=sqs_queues.url, messages=[message] * 11)

    assert outcome.done == [] and outcome.refused == []
    assert len(outcome.unreachable) == 11
    with pytest.raises(sqs.QueueUnavailable):
        send_one(url=sqs_queues.url)


@pytest.mark.django_db
def test_a_received_message_is_parsed_once_with_every_attribute(sqs_queues):
    group = str(uuid.uuid4())
    sqs.send_message_now(body={"kind": "probe", "n": 1}, group_id=group, deduplication_id="d-1")
    sqs_queues.client.send_message(
        QueueUrl=sqs_queues.url,
        MessageBody="[not an object]",
        MessageGroupId=group,
        MessageDeduplicationId="d-2",
    )

    # One group: received one at a time, since a server may return both in one receive.
    [first] = sqs.receive_messages(
        url=sqs_queues.url, max_messages=1, wait_seconds=0, visibility_timeout=30
    )
    sqs.delete_message(url=sqs_queues.url, receipt_handle=first.receipt_handle)
    [second] = receive_all(sqs_queues.url)

    assert (first.body, first.kind, first.group_id, first.deduplication_id) == (
        {"kind": "probe", "n": 1},
        "probe",
        group,
        "d-1",
    )
    assert first.receive_count == 1 and first.enqueued_at is not None
    assert first.attributes["MessageGroupId"] == group
    assert second.body is None and second.raw_body == "[not an object]" and second.kind == ""
    assert second.sequence_number > first.sequence_number


@pytest.mark.django_db
def test_a_refusal_carries_sqss_error_code_and_a_missing_queue_is_none(sqs_queues):
    assert sqs.queue_find(f"missing-{uuid.uuid4().hex}.fifo") is None
    assert sqs.queue_find(sqs.callbacks_conf.SQS_QUEUE_NAME) == sqs_queues.url

    with pytest.raises(sqs.QueueRefused) as refused:
        sqs.queue_attributes_set(url=sqs_queues.url, attributes={"FifoQueue": "false"})

    assert refused.value.code
    assert isinstance(refused.value, sqs.QueueUnavailable)


# --- parameters, checked here rather than by botocore on every call ----------------------------


@pytest.mark.django_db
def test_every_call_the_gateway_builds_is_valid_for_the_sqs_model(sqs_queues):
    sqs.send_message_now(
        body={"kind": "probe"},
        group_id=str(uuid.uuid4()),
        deduplication_id=uuid.uuid4().hex,
        attributes={"traceparent": {"DataType": "String", "StringValue": "00-ab-cd-01"}},
    )
    sqs.send_messages_now(
        [
            sqs.OutgoingMessage(
                body={"kind": "probe", "n": n},
                group_id=str(uuid.uuid4()),
                deduplication_id=uuid.uuid4().hex,
                attributes={"traceparent": {"DataType": "String", "StringValue": "x"}} if n else {},
            )
            for n in range(3)
        ]
    )
    sqs.send_message_coalesced_now(
        body={"kind": "probe"},
        group_id=str(uuid.uuid4()),
        deduplication_id=uuid.uuid4().hex,
        window=0,
    )
    received = receive_all(sqs_queues.url)
    sqs.change_visibility(url=sqs_queues.url, receipt_handle=received[0].receipt_handle, seconds=5)
    sqs.change_visibility_batch(url=sqs_queues.url, messages=received, seconds=5)
    sqs.delete_message(url=sqs_queues.url, receipt_handle=received[0].receipt_handle)
    sqs.delete_messages(url=sqs_queues.url, messages=received[1:])
    sqs.queue_attributes(sqs_queues.url, ["QueueArn"])
    sqs.queue_find(f"missing-{uuid.uuid4().hex}.fifo")
    sqs.dead_letter_queue_url()

    # queues_ensure (the fixture's set-up) and each call above, all through the one check:
    assert len(received) == 5
    assert sqs_queues.parameters.checked >= 14
    assert sqs_queues.parameters.invalid == []


@pytest.mark.django_db
def test_an_invalid_call_reaches_sqs_unchecked_and_the_tests_check_catches_it(sqs_queues):
    # Sent unchecked: the server takes it or refuses it (QueueRefused). With botocore's check on,
    # it would never leave the process (ParamValidationError, a QueueUnavailable that is not a
    # refusal).
    try:
        sqs.receive_messages(
            url=sqs_queues.url,
            max_messages=1,
            wait_seconds=0,
            visibility_timeout="thirty",  # type: ignore[arg-type]
        )
    except sqs.QueueRefused:
        pass

    assert len(sqs_queues.parameters.invalid) == 1
    assert "VisibilityTimeout" in sqs_queues.parameters.invalid[0]
    sqs_queues.parameters.invalid.clear()  # seen: the fixture's teardown would fail the test


def test_one_client_serves_every_call_of_a_process_and_a_forked_child_builds_its_own(
    sqs_queues,
):
    import os

    client = sqs.sqs_client()
    sqs.queue_attributes(sqs_queues.url)
    assert sqs.sqs_client() is client  # built once, its endpoint resolved once
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and leave without running the parent's clean-up
        os.write(write, b"shared" if sqs.sqs_client() is client else b"own")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 16)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"own"
    assert sqs.sqs_client() is client
