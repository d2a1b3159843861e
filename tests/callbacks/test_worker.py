"""run_sqs_worker against PostgreSQL and the local SQS server (fauxqs, or LocalStack) over HTTP,
in-process."""

import functools
import json
import logging
import random
import re
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from prometheus_client import REGISTRY

from callbacks import sqs
from callbacks.models import (
    ParkedMessage,
    PaymentHold,
    ProcessingError,
    QueueMessage,
    QueueMessageStatus,
)
from callbacks.schema import processor_event_message
from callbacks.services import ReceivedMessage, queue_messages_purge
from callbacks.worker import Worker
from callbacks.worker import rules as worker_rules
from payments.models import LedgerEntry, PaymentEvent, PaymentState, ProcessedEvent
from tests.callbacks.worker_support import (
    applied_events,
    drain,
    receive_head,
    run_worker,
    run_worker_until,
    send_body,
    send_event,
)
from tests.factories import PaymentFactory, QueueMessageFactory, processor_event
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_processor_event_is_applied_marked_done_and_deleted(sqs_queues):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    message_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert LedgerEntry.objects.filter(payment=payment).count() == 1
    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.outcome, record.attempts) == ("done", "applied", 1)
    assert record.group_id == str(payment.id) and record.sequence_number.isdigit()
    assert record.enqueued_at is not None and record.finished_at is not None
    assert drain(sqs_queues.client, sqs_queues.url) == []
    caused_by = PaymentEvent.objects.get(payment=payment, outcome="applied").caused_by
    assert caused_by == f"sqs:{message_id}"


def metric(name, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_same_event_sent_twenty_times_moves_the_payment_once(sqs_queues):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    applied_before = metric(
        "payments_worker_messages_total", kind="processor_event", outcome="applied"
    )
    duplicates_before = metric(
        "payments_worker_messages_total", kind="processor_event", outcome="duplicate"
    )
    dedup_before = metric("payments_dedup_hits_total", layer="app")
    event_id = f"evt_{uuid.uuid4().hex}"
    for i in range(20):  # new deduplication ids: SQS lets every copy through
        send_event(
            sqs_queues.client,
            sqs_queues.url,
            payment,
            "settled",
            processor_event_id=event_id,
            dedup_id=f"{event_id}-{i}",
        )

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert applied_events(payment) == ["settled"]
    assert LedgerEntry.objects.filter(payment=payment).count() == 1
    outcomes = list(QueueMessage.objects.values_list("outcome", flat=True))
    assert sorted(outcomes) == ["applied"] + ["duplicate"] * 19
    assert ProcessedEvent.objects.filter(processor_event_id=event_id).count() == 1
    assert drain(sqs_queues.client, sqs_queues.url) == []
    assert (
        metric("payments_worker_messages_total", kind="processor_event", outcome="applied")
        == applied_before + 1
    )
    assert (
        metric("payments_worker_messages_total", kind="processor_event", outcome="duplicate")
        == duplicates_before + 19
    )
    assert metric("payments_dedup_hits_total", layer="app") == dedup_before + 19


def test_duplicate_after_the_first_was_deleted_is_dropped_by_the_app_record(sqs_queues, caplog):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    event_id = f"evt_{uuid.uuid4().hex}"
    send_event(sqs_queues.client, sqs_queues.url, payment, "settled", processor_event_id=event_id)
    run_worker()
    assert drain(sqs_queues.client, sqs_queues.url) == []  # processed and deleted

    # Beyond SQS's 5-minute window the queue would take the same id again: a new dedup id.
    late_id, _ = send_event(
        sqs_queues.client,
        sqs_queues.url,
        payment,
        "settled",
        processor_event_id=event_id,
        dedup_id=f"{event_id}-late",
    )
    with caplog.at_level(logging.INFO, logger="callbacks.worker"):
        run_worker()

    assert applied_events(payment) == ["settled"]
    assert LedgerEntry.objects.filter(payment=payment).count() == 1
    assert QueueMessage.objects.get(message_id=late_id).outcome == "duplicate"
    line = next(r for r in caplog.records if getattr(r, "message_id", None) == late_id)
    assert (line.outcome, line.kind, line.payment_id) == (
        "duplicate",
        "processor_event",
        str(payment.id),
    )
    assert line.attempt == 1 and line.duration_ms >= 0


def test_redelivery_of_a_message_already_done_is_only_deleted(sqs_queues):
    """A crash between the commit and the SQS delete: the message returns, our record says done."""
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    message_id, body = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    now = "2026-11-02T12:00:00+00:00"
    QueueMessageFactory(
        message_id=message_id,
        group_id=str(payment.id),
        body=body,
        first_started_at=now,
        status=QueueMessageStatus.DONE,
        outcome="applied",
    )

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED  # the work is not done a second time
    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.attempts) == ("done", 1)
    assert drain(sqs_queues.client, sqs_queues.url) == []


def test_settled_before_submitted_is_retried_six_times_then_dead_lettered_and_held(
    sqs_queues, fast_retries
):
    payment = PaymentFactory(state=PaymentState.PENDING)
    message_id, body = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")

    run_worker()

    errors = list(ProcessingError.objects.filter(message_id=message_id).order_by("id"))
    assert [e.attempt_number for e in errors] == [1, 2, 3, 4, 5, 6]
    assert {e.error_class for e in errors} == {"payments.exceptions.InvalidTransition"}
    assert all(e.retryable for e in errors)
    assert [e.delay_seconds is not None for e in errors] == [True] * 5 + [False]
    assert "Traceback" in errors[0].traceback and "pending" in errors[0].message
    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.attempts) == ("dead_lettered", 6)
    assert drain(sqs_queues.client, sqs_queues.url) == []  # the original is gone

    [copy] = drain(sqs_queues.client, sqs_queues.dlq_url)
    assert copy["Attributes"]["MessageGroupId"] == str(payment.id)
    assert copy["Attributes"]["MessageDeduplicationId"] == message_id
    copy_body = json.loads(copy["Body"])
    assert {k: v for k, v in copy_body.items() if k != "dead_letter"} == body
    assert copy_body["dead_letter"]["original_message_id"] == message_id
    assert copy_body["dead_letter"]["attempts"] == 6
    assert copy_body["dead_letter"]["error_class"] == "payments.exceptions.InvalidTransition"
    assert {"error", "first_started_at", "dead_lettered_at"} <= set(copy_body["dead_letter"])

    hold = PaymentHold.objects.get(payment_id=str(payment.id))
    assert hold.is_active and hold.caused_by == record
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING

    # A later message for the held payment is parked, not applied.
    later_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "submitted")
    run_worker()
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING
    parked = ParkedMessage.objects.get(message_id=later_id)
    assert parked.hold == hold and parked.body["event"]["event_type"] == "submitted"
    assert QueueMessage.objects.get(message_id=later_id).status == "parked"
    assert not ProcessingError.objects.filter(message_id=later_id).exists()
    assert drain(sqs_queues.client, sqs_queues.url) == []


def test_failures_are_hidden_for_the_backoff_between_attempts(
    sqs_queues, module_settings, monkeypatch
):
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 1
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 1
    module_settings.WORKER_MAX_ATTEMPTS = 3
    # The jitter drawn from a seeded generator: the draws are known, and far enough from 0
    # that a retry arriving early could not pass the gap check below by luck.
    monkeypatch.setattr(
        worker_rules,
        "backoff_delay",
        functools.partial(worker_rules.backoff_delay, uniform=random.Random(0).uniform),
    )
    same_seed = random.Random(0)
    expected = [same_seed.uniform(0, 1) for _ in range(2)]
    assert min(expected) > 0.7
    payment = PaymentFactory(state=PaymentState.PENDING)
    message_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")

    run_worker_until(
        lambda: QueueMessage.objects.get(message_id=message_id).status == "dead_lettered"
    )

    errors = list(ProcessingError.objects.filter(message_id=message_id).order_by("id"))
    assert [e.attempt_number for e in errors] == [1, 2, 3]
    assert [e.delay_seconds for e in errors[:2]] == pytest.approx(expected)
    # Each retry waited at least the backoff chosen for the failure before it.
    for before, after in zip(errors, errors[1:], strict=False):
        assert (after.created_at - before.created_at).total_seconds() >= before.delay_seconds
    assert QueueMessage.objects.get(message_id=message_id).status == "dead_lettered"


def test_group_mate_behind_a_failing_message_is_released_untouched(sqs_queues, fast_retries):
    """AWS may return several messages of one group in one receive (fauxqs never does): the
    batch is built as AWS would return it, the second message behind the first, its receipt
    handle made up (the real second stays queued behind the first, on every server)."""
    payment_id = uuid.uuid4()  # not created yet: the first event fails with PaymentNotFound
    stand_in = PaymentFactory.build(id=payment_id)
    first_id, _ = send_event(sqs_queues.client, sqs_queues.url, stand_in, "submitted")
    second_id, second_body = send_event(sqs_queues.client, sqs_queues.url, stand_in, "settled")
    first = receive_head(sqs_queues.client, sqs_queues.url)
    assert first["MessageId"] == first_id
    second = {
        "MessageId": second_id,
        "ReceiptHandle": "behind-the-first-in-the-same-batch",
        "Body": json.dumps(second_body),
        "Attributes": {
            "MessageGroupId": str(payment_id),
            "SequenceNumber": str(int(first["Attributes"]["SequenceNumber"]) + 1),
            "SentTimestamp": first["Attributes"]["SentTimestamp"],
            "ApproximateReceiveCount": "1",
        },
    }

    worker = Worker(wait_time=0, relay=False)
    with worker.running():
        worker.process_batch([ReceivedMessage.from_sqs(m) for m in (second, first)])

    assert worker.stats.outcomes == {"retried": 1}
    assert QueueMessage.objects.get(message_id=first_id).attempts == 1
    assert not QueueMessage.objects.filter(message_id=second_id).exists()  # never started
    assert not ProcessingError.objects.filter(message_id=second_id).exists()

    PaymentFactory(id=payment_id, state=PaymentState.PENDING, amount=stand_in.amount)
    run_worker()

    payment = stand_in.__class__.objects.get(pk=payment_id)
    assert payment.state == PaymentState.CONFIRMED
    assert applied_events(payment) == ["submitted", "settled"]
    assert QueueMessage.objects.get(message_id=first_id).attempts == 2
    second_record = QueueMessage.objects.get(message_id=second_id)
    assert (second_record.status, second_record.attempts) == ("done", 1)
    assert drain(sqs_queues.client, sqs_queues.dlq_url) == []
    assert not PaymentHold.objects.exists()


def test_unknown_kind_is_dead_lettered_at_once_with_its_error(sqs_queues):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    body = {"kind": "refund_payment", "payment_id": str(payment.id)}
    message_id = send_body(sqs_queues.client, sqs_queues.url, payment.id, body)

    run_worker()

    [error] = ProcessingError.objects.filter(message_id=message_id)
    assert error.error_class == "callbacks.worker.UnknownMessageKind"
    assert "refund_payment" in error.message and not error.retryable
    assert error.attempt_number == 1 and error.payment_id == str(payment.id)
    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.attempts, record.kind) == ("dead_lettered", 1, "refund_payment")
    [copy] = drain(sqs_queues.client, sqs_queues.dlq_url)
    assert json.loads(copy["Body"])["kind"] == "refund_payment"
    assert PaymentHold.objects.get(payment_id=str(payment.id)).caused_by == record
    assert drain(sqs_queues.client, sqs_queues.url) == []


def test_body_that_is_not_json_is_dead_lettered_with_the_raw_body_kept(sqs_queues):
    group = str(uuid.uuid4())
    message_id = send_body(sqs_queues.client, sqs_queues.url, group, "not json {")

    run_worker()

    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.body, record.raw_body) == ("dead_lettered", None, "not json {")
    error = ProcessingError.objects.get(message_id=message_id)
    assert error.error_class == "callbacks.worker.InvalidBody" and not error.retryable
    [copy] = drain(sqs_queues.client, sqs_queues.dlq_url)
    assert json.loads(copy["Body"])["raw_body"] == "not json {"


def test_invalid_processor_event_is_dead_lettered_naming_the_bad_fields(sqs_queues):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    body = {
        "kind": "processor_event",
        "event": {
            "payment_id": str(payment.id),
            "event_type": "settled",
            "processor_event_id": "evt_1",
            "amount": "12.5",
            "timestamp": "2026-11-02T12:00:00+00:00",
        },
    }
    message_id = send_body(sqs_queues.client, sqs_queues.url, payment.id, body)

    run_worker()

    error = ProcessingError.objects.get(message_id=message_id)
    assert error.error_class == "callbacks.schema.InvalidMessage"
    assert "amount" in error.message and not error.retryable
    assert QueueMessage.objects.get(message_id=message_id).status == "dead_lettered"


def test_event_whose_payment_is_not_its_message_group_is_dead_lettered(sqs_queues):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    other_group = str(uuid.uuid4())
    body = processor_event_message(processor_event(payment, "settled"))
    message_id = send_body(sqs_queues.client, sqs_queues.url, other_group, body)

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    error = ProcessingError.objects.get(message_id=message_id)
    assert error.error_class == "callbacks.worker.InvalidBody"
    assert "does not match the message group" in error.message


def test_conflicting_payload_for_a_known_event_id_goes_to_a_human(sqs_queues):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    event_id = f"evt_{uuid.uuid4().hex}"
    send_event(sqs_queues.client, sqs_queues.url, payment, "settled", processor_event_id=event_id)
    run_worker()
    conflict_id, _ = send_event(
        sqs_queues.client,
        sqs_queues.url,
        payment,
        "returned",
        processor_event_id=event_id,
        dedup_id=f"{event_id}-other",
    )

    run_worker()

    error = ProcessingError.objects.get(message_id=conflict_id)
    assert error.error_class == "payments.exceptions.EventConflict" and not error.retryable
    assert QueueMessage.objects.get(message_id=conflict_id).status == "dead_lettered"
    assert PaymentHold.objects.filter(payment_id=str(payment.id), released_at=None).exists()


def test_hot_path_of_one_applied_event_takes_a_fixed_number_of_queries(
    sqs_queues, django_assert_num_queries
):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    worker = Worker(wait_time=0, relay=False)
    with worker.running():
        [message] = worker.receive()
        # The start, autocommitted: one statement records it unless the payment is held or
        # an earlier message of its group is unfinished (the batch start's, for one row).
        # The work, one transaction (BEGIN and COMMIT): savepoint, lock the payment, one
        # statement that claims the dedup record and, because the claim is new, updates the
        # state, credits the ledger, counts the debit in the merchant's daily return-rate
        # counters and writes the event-log row (payments.event_sql); release; mark the record
        # done. Four statements do the work; the other four are transaction control. This is
        # the per-message path (a submission, a follower of its group in the batch, a message
        # the bulk start leaves out); a batch's processor events take 15 statements per 10 (see
        # test_worker_batch.py).
        with django_assert_num_queries(8, connection=connection):
            result = worker.process_message(message)
        worker.hand.delete([message])
    assert result.outcome == "applied"
    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED


def test_unknown_kind_is_dead_lettered_after_the_dlq_comes_back(sqs_queues, module_settings):
    """The DLQ cannot be reached: the message is not lost, it waits and is moved later."""
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    body = {"kind": "refund_payment", "payment_id": str(payment.id)}
    message_id = send_body(sqs_queues.client, sqs_queues.url, payment.id, body)
    dlq_name = module_settings.SQS_DLQ_NAME
    module_settings.SQS_DLQ_NAME = "no-such-queue.fifo"
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0

    run_worker(max_messages=1)

    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.attempts) == ("retrying", 1)
    assert not PaymentHold.objects.exists()
    module_settings.SQS_DLQ_NAME = dlq_name

    run_worker()

    record.refresh_from_db()
    assert (record.status, record.attempts) == ("dead_lettered", 2)
    assert len(drain(sqs_queues.client, sqs_queues.dlq_url)) == 1
    assert PaymentHold.objects.filter(payment_id=str(payment.id)).exists()
    assert drain(sqs_queues.client, sqs_queues.url) == []


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--batch-size", "11", "out of range (1-10)"),
        ("--batch-size", "0", "out of range (1-10)"),
        ("--wait-time", "21", "out of range (0-20)"),
        ("--visibility-timeout", "0", "out of range (1-43200)"),
        ("--max-messages", "0", "out of range (at least 1)"),
        ("--batch-size", "ten", "'ten' is not a whole number"),
        ("--linger", "1.5", "out of range (0-1)"),
        ("--linger", "-0.01", "out of range (0-1)"),
        ("--linger", "nan", "out of range (0-1)"),
        ("--linger", "soon", "'soon' is not a number of seconds"),
    ],
)
def test_command_options_out_of_range_are_refused_with_the_reason(option, value, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("run_sqs_worker", f"{option}={value}")


def test_unreachable_queue_stops_the_command_with_a_clear_error(module_settings, local_sqs):
    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"
    sqs.reset()
    try:
        with pytest.raises(CommandError, match="the queue is unavailable"):
            run_worker()
    finally:
        sqs.reset()


def test_purge_deletes_old_clean_records_and_keeps_error_history(sqs_queues, fast_retries):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    clean_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    run_worker()
    stand_in = PaymentFactory.build(id=uuid.uuid4())
    retried_id, _ = send_event(sqs_queues.client, sqs_queues.url, stand_in, "submitted")
    worker = Worker(wait_time=0, relay=False)
    with worker.running():
        worker.process_batch(worker.receive())  # PaymentNotFound: an error row, then...
    PaymentFactory(id=stand_in.id, state=PaymentState.PENDING, amount=stand_in.amount)
    run_worker()  # ...done on the second attempt
    assert set(QueueMessage.objects.values_list("status", flat=True)) == {"done"}
    # As if it all happened in January: started then, and finished then.
    january = "2026-01-01T00:00:00Z"
    QueueMessage.objects.update(
        first_started_at=january, last_started_at=january, finished_at=january
    )

    assert queue_messages_purge(older_than=timedelta(days=30)) == 1

    assert not QueueMessage.objects.filter(message_id=clean_id).exists()
    assert QueueMessage.objects.filter(message_id=retried_id).exists()


def test_conflicting_resend_inside_the_queue_window_is_dead_lettered_for_a_human(
    sqs_queues, fast_retries
):
    """The processor resends a known event id with another amount within SQS's 5 minutes."""
    from django.test import Client

    from payments import signing
    from tests.callbacks.test_endpoint import event_body

    payment = PaymentFactory(state=PaymentState.SUBMITTED, amount=Decimal("125.00"))
    body = event_body(payment_id=str(payment.id), event_type="settled")
    for amount in ("125.00", "125.01"):
        raw = json.dumps({**body, "amount": amount}).encode()
        response = Client().post(
            "/callbacks/processor/",
            raw,
            content_type="application/json",
            headers={signing.HEADER: signing.sign(raw, ["test-signing-secret"])},
        )
        assert response.status_code == 202

    run_worker()

    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert LedgerEntry.objects.filter(payment=payment).count() == 1
    conflict = QueueMessage.objects.get(status="dead_lettered")
    assert conflict.last_error_class.endswith("EventConflict")
    assert PaymentHold.objects.filter(payment_id=str(payment.id), released_at=None).exists()


def test_a_worker_started_while_the_queue_is_down_waits_for_it(sqs_queues, queue_down, caplog):
    import threading

    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    worker = Worker(wait_time=0, relay=False, max_messages=1)
    outcome: dict = {}

    def run():
        try:
            outcome["stats"] = worker.run()
        except Exception as exc:  # noqa: BLE001 - the assertion below reports it
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(
        lambda: caplog.text.count("queue unavailable at start") >= 2 or not thread.is_alive(),
        10,
        "the worker's second try",
    )
    assert thread.is_alive(), f"the worker gave up while the queue was down: {outcome}"

    queue_down()  # the queue comes back
    send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    thread.join(30)

    assert not thread.is_alive() and "error" not in outcome, outcome
    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED


def test_group_mate_really_in_flight_behind_a_failing_message_is_made_visible_at_once(
    sqs_queues, fast_retries
):
    """Both messages of the batch come from the local SQS server with live receipt handles.

    fauxqs hands out one message per group and locks the group while it is in flight, so the
    batch AWS could return in one receive is built from two: the first message is received
    alone and deleted (its record stays in the worker's hands, its handle now dead), which lets
    the second be received for real. The worker fails the first, stops the group and must make
    the second visible again at once, untouched. (Both from one receive, as LocalStack returns
    them: ``test_worker_partial_batch.py``.)
    """
    client, url = sqs_queues.client, sqs_queues.url
    payment_id = uuid.uuid4()  # not created: the first event fails with PaymentNotFound
    stand_in = PaymentFactory.build(id=payment_id)
    first_id, _ = send_event(client, url, stand_in, "submitted")
    second_id, _ = send_event(client, url, stand_in, "settled")
    receive = {
        "QueueUrl": url,
        "MaxNumberOfMessages": 10,
        "WaitTimeSeconds": 0,
        "VisibilityTimeout": 30,
        "AttributeNames": ["All"],
        "MessageSystemAttributeNames": ["All"],
    }
    first = receive_head(client, url)
    client.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    [second] = client.receive_message(**receive)["Messages"]
    assert (first["MessageId"], second["MessageId"]) == (first_id, second_id)
    assert not client.receive_message(**receive).get("Messages")  # hidden for 30 s

    worker = Worker(wait_time=0, relay=False, visibility_timeout=30)
    with worker.running():
        worker.process_batch([ReceivedMessage.from_sqs(m) for m in (second, first)])

    assert worker.stats.outcomes == {"retried": 1}
    assert worker.stats.released == 1
    assert QueueMessage.objects.get(message_id=first_id).attempts == 1
    assert not QueueMessage.objects.filter(message_id=second_id).exists()  # never started
    assert not ProcessingError.objects.filter(message_id=second_id).exists()
    # Visible again now, not after its 30 s visibility timeout: released, not left to expire.
    [again] = client.receive_message(**receive)["Messages"]
    assert again["MessageId"] == second_id
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"


def test_an_unknown_kind_is_counted_under_one_label_whatever_the_body_says(sqs_queues):
    from prometheus_client import REGISTRY

    from tests.callbacks.worker_support import run_worker, send_body

    kinds = [f"made-up-{n}" for n in range(3)]
    for n, kind in enumerate(kinds):
        send_body(sqs_queues.client, sqs_queues.url, f"group-{n}", {"kind": kind})

    run_worker()

    labels = {
        sample.labels["kind"]
        for metric in REGISTRY.collect()
        if metric.name == "payments_worker_messages"
        for sample in metric.samples
    }
    assert not labels & set(kinds)
    assert "unknown" in labels
