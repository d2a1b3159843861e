"""DLQ ingestion over the local SQS server: idempotent, nothing lost, one alert per dead letter."""

import io
import json
import uuid

import pytest
from django.core.management import CommandError, call_command

from callbacks import sqs
from callbacks.models import PaymentHold, QueueMessage, QueueMessageStatus
from callbacks.services import ReceivedMessage, queue_message_start
from payments.models import PaymentState
from payments.signals import alert_raised
from tests.factories import PaymentFactory, PaymentHoldFactory
from tests.triage.deadletters import dlq_depth, event_publish, worker_run
from triage import ingestion
from triage.models import DeadLetter, DeadLetterSource, DeadLetterStatus

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def alerts():
    raised = []

    def receiver(sender, **kwargs):
        raised.append(kwargs)

    alert_raised.connect(receiver, dispatch_uid="test_ingest_alerts")
    yield raised
    alert_raised.disconnect(dispatch_uid="test_ingest_alerts")


class Crash(BaseException):
    """The process dying: not an Exception, so nothing on the way catches it."""


def test_worker_dead_letter_is_stored_with_its_history_and_deleted_from_the_dlq(
    sqs_queues, fast_retries, alerts
):
    payment = PaymentFactory()  # pending: a "settled" event has no valid transition
    event, message_id = event_publish(payment, "settled")
    worker_run()
    assert dlq_depth(sqs_queues) == 1

    assert ingestion.dead_letters_ingest() == 1

    dead = DeadLetter.objects.get()
    assert dead.original_message_id == message_id
    assert dead.source == DeadLetterSource.WORKER
    assert dead.payment_id == payment.id and dead.group_id == str(payment.id)
    assert dead.kind == "processor_event"
    assert dead.processor_event_id == event.processor_event_id
    assert dead.deduplication_id == event.processor_event_id
    assert dead.attempts == 6
    assert dead.last_error_class.endswith("InvalidTransition")
    assert "cannot move payment" in dead.last_error_message
    assert dead.first_failed_at <= dead.last_failed_at
    assert dead.status == DeadLetterStatus.OPEN
    assert dead.body["dead_letter"]["original_message_id"] == message_id
    assert dead.attributes["MessageGroupId"] == str(payment.id)
    assert dlq_depth(sqs_queues) == 0
    assert [a["key"] for a in alerts] == [f"dead_letter:{dead.pk}"]
    assert alerts[0]["severity"] == "high" and alerts[0]["payment_id"] == str(payment.id)


def test_same_dlq_message_received_twice_makes_one_row_and_one_alert(
    sqs_queues, fast_retries, alerts, monkeypatch
):
    payment = PaymentFactory()
    event_publish(payment, "settled")
    worker_run()

    def keep_in_dlq(url, message):  # no delete: the message becomes visible again at once
        sqs.change_visibility(url=url, receipt_handle=message.receipt_handle, seconds=0)

    monkeypatch.setattr(ingestion, "_dlq_delete", keep_in_dlq)
    assert ingestion.dead_letters_ingest(max_messages=1) == 1
    assert ingestion.dead_letters_ingest(max_messages=1) == 0
    assert DeadLetter.objects.count() == 1
    assert dlq_depth(sqs_queues) == 1
    monkeypatch.undo()

    assert ingestion.dead_letters_ingest() == 0
    assert DeadLetter.objects.count() == 1
    assert dlq_depth(sqs_queues) == 0
    assert len(alerts) == 1


def test_crash_between_commit_and_delete_loses_nothing_and_stores_nothing_twice(
    sqs_queues, fast_retries, alerts, monkeypatch
):
    payment = PaymentFactory()
    _, message_id = event_publish(payment, "settled")
    worker_run()

    def die(url, message):
        # The visibility timeout running out, compressed: the message is back in the DLQ.
        sqs.change_visibility(url=url, receipt_handle=message.receipt_handle, seconds=0)
        raise Crash()

    monkeypatch.setattr(ingestion, "_dlq_delete", die)
    with pytest.raises(Crash):
        ingestion.dead_letters_ingest()
    assert DeadLetter.objects.filter(original_message_id=message_id).count() == 1  # committed
    assert dlq_depth(sqs_queues) == 1  # and still in the DLQ
    monkeypatch.undo()

    assert ingestion.dead_letters_ingest() == 0  # the restarted process finds it stored
    assert DeadLetter.objects.count() == 1
    assert dlq_depth(sqs_queues) == 0
    assert len(alerts) == 1


def test_redrive_policy_message_is_stored_and_its_payment_put_on_hold(sqs_queues, alerts):
    """A message that crashed the worker on every receive: SQS moves it itself, same id."""
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    _, message_id = event_publish(payment, "settled")
    client = sqs_queues.client
    # The worker started it once (its start is committed before the work) and then died.
    first = client.receive_message(
        QueueUrl=sqs_queues.url,
        VisibilityTimeout=0,
        AttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
    )["Messages"][0]
    queue_message_start(message=ReceivedMessage.from_sqs(first))
    for _ in range(20):  # more receives than the RedrivePolicy's maxReceiveCount (10)
        got = client.receive_message(QueueUrl=sqs_queues.url, VisibilityTimeout=0)
        if not got.get("Messages"):
            break
    assert dlq_depth(sqs_queues) == 1

    assert ingestion.dead_letters_ingest() == 1

    dead = DeadLetter.objects.get()
    assert dead.original_message_id == message_id == dead.dlq_message_id
    assert dead.source == DeadLetterSource.REDRIVE_POLICY
    assert dead.attempts >= 1
    assert "RedrivePolicy" in dead.last_error_message
    assert dead.last_error_class == ""
    hold = PaymentHold.objects.get(payment_id=str(payment.id), released_at__isnull=True)
    assert hold.caused_by.message_id == message_id
    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.outcome) == (QueueMessageStatus.DEAD_LETTERED, "redrive_policy")
    assert len(alerts) == 1


def test_redrive_policy_message_of_an_already_held_payment_keeps_one_hold(sqs_queues, alerts):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    PaymentHoldFactory(payment_id=str(payment.id), reason="earlier dead letter")
    sqs.send_message_now(
        body={"kind": "processor_event", "payment_id": str(payment.id)},
        group_id=str(payment.id),
        deduplication_id="x1",
        url=sqs_queues.dlq_url,
    )
    assert ingestion.dead_letters_ingest() == 1
    assert PaymentHold.objects.filter(payment_id=str(payment.id)).count() == 1


def test_a_body_that_is_not_json_is_kept_as_received(sqs_queues, alerts):
    group = str(uuid.uuid4())
    sqs.send_message_now(body={}, group_id=group, deduplication_id="d1", url=sqs_queues.dlq_url)
    sqs_queues.client.send_message(
        QueueUrl=sqs_queues.dlq_url,
        MessageBody="<not json>",
        MessageGroupId=group,
        MessageDeduplicationId="d2",
    )
    assert ingestion.dead_letters_ingest() == 2
    raw = DeadLetter.objects.get(body__raw_body="<not json>")
    assert raw.kind == "" and str(raw.payment_id) == group
    assert json.dumps(raw.body)  # stored as a JSON object, nothing dropped
    assert len(alerts) == 2


def test_max_messages_bounds_one_run(sqs_queues, alerts):
    for i in range(3):
        sqs.send_message_now(
            body={"kind": "processor_event"},
            group_id=str(uuid.uuid4()),
            deduplication_id=f"m{i}",
            url=sqs_queues.dlq_url,
        )
    assert ingestion.dead_letters_ingest(max_messages=2) == 2
    assert dlq_depth(sqs_queues) == 1
    with pytest.raises(ValueError, match="at least 1"):
        ingestion.dead_letters_ingest(max_messages=0)


def test_ingest_dlq_command_reports_the_count(sqs_queues, alerts):
    sqs.send_message_now(
        body={"kind": "submit_payment"},
        group_id=str(uuid.uuid4()),
        deduplication_id="c1",
        url=sqs_queues.dlq_url,
    )
    out = io.StringIO()
    call_command("ingest_dlq", "--max-messages", "5", stdout=out)
    assert "1 new dead letter(s) stored" in out.getvalue()


def test_ingest_dlq_command_names_the_problem_when_sqs_is_down(module_settings):
    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"
    sqs.reset()
    try:
        with pytest.raises(CommandError, match="dead-letter queue is unavailable"):
            call_command("ingest_dlq")
    finally:
        sqs.reset()


def test_a_body_the_database_refuses_is_stored_as_text_and_leaves_the_dlq(sqs_queues, alerts):
    """PostgreSQL's jsonb refuses NUL characters: the message is stored with its body as
    text rather than left in the DLQ, and does not block the others."""
    group = str(uuid.uuid4())
    sqs_queues.client.send_message(
        QueueUrl=sqs_queues.dlq_url,
        MessageBody='{"kind": "processor_event", "message": "nul \\u0000 here"}',
        MessageGroupId=group,
        MessageDeduplicationId="nul",
    )
    sqs.send_message_now(
        body={"kind": "processor_event"},
        group_id=str(uuid.uuid4()),
        deduplication_id="fine",
        url=sqs_queues.dlq_url,
    )
    assert ingestion.dead_letters_ingest() == 2
    as_text = DeadLetter.objects.get(group_id=group)
    assert as_text.body == {
        "raw_body": '{"kind": "processor_event", "message": "nul \\u0000 here"}'
    }
    assert dlq_depth(sqs_queues) == 0
    assert not [a for a in alerts if a["key"].startswith("dead_letter_ingest_failed:")]


def test_a_message_that_cannot_be_stored_stays_in_the_dlq_and_raises_an_alert(sqs_queues, alerts):
    """A database failure that is not about the body (here a trigger refusing the row) must
    not block the others, nor make the message vanish."""
    from django.db import connection

    group = str(uuid.uuid4())
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION refuse_dead_letter() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN IF NEW.group_id = '{group}' THEN RAISE EXCEPTION 'refused'; END IF; "
            "RETURN NEW; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER refuse_dead_letter BEFORE INSERT ON triage_deadletter "
            "FOR EACH ROW EXECUTE FUNCTION refuse_dead_letter()"
        )
    try:
        sqs.send_message_now(
            body={"kind": "processor_event"},
            group_id=group,
            deduplication_id="refused",
            url=sqs_queues.dlq_url,
        )
        sqs.send_message_now(
            body={"kind": "processor_event"},
            group_id=str(uuid.uuid4()),
            deduplication_id="fine",
            url=sqs_queues.dlq_url,
        )
        assert ingestion.dead_letters_ingest() == 1
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER refuse_dead_letter ON triage_deadletter")
            cursor.execute("DROP FUNCTION refuse_dead_letter()")
    assert DeadLetter.objects.count() == 1
    assert dlq_depth(sqs_queues) == 1  # the refused one is still there, in flight
    failed = [a for a in alerts if a["key"].startswith("dead_letter_ingest_failed:")]
    assert len(failed) == 1 and failed[0]["severity"] == "high"
    assert failed[0]["payment_id"] == group


def test_malformed_envelope_numbers_do_not_block_ingestion(sqs_queues, alerts):
    sqs.send_message_now(
        body={
            "kind": "processor_event",
            "dead_letter": {
                "original_message_id": "orig-1",
                "attempts": "many",
                "first_started_at": "2026-13-45T00:00:00+00:00",
                "error_class": "X",
            },
        },
        group_id=str(uuid.uuid4()),
        deduplication_id="orig-1",
        url=sqs_queues.dlq_url,
    )
    assert ingestion.dead_letters_ingest() == 1
    dead = DeadLetter.objects.get(original_message_id="orig-1")
    assert dead.attempts == 0 and dead.first_failed_at is None
    assert dead.source == DeadLetterSource.WORKER and dead.last_error_class == "X"


def test_two_ingestions_racing_on_one_message_store_one_row(sqs_queues, alerts, monkeypatch):
    """Both pass the "already stored?" check; the unique constraint decides, and the loser
    treats its IntegrityError as "someone else did it"."""
    import threading

    from django.db import connection

    sqs.send_message_now(
        body={"kind": "processor_event"},
        group_id=str(uuid.uuid4()),
        deduplication_id="race",
        url=sqs_queues.dlq_url,
    )
    [message] = sqs.receive_messages(
        url=sqs_queues.dlq_url, max_messages=1, wait_seconds=0, visibility_timeout=30
    )
    both_checked = threading.Barrier(2, timeout=10)
    real_build = ingestion._dead_letter_build

    def build_after_both_checked(*args):
        both_checked.wait()
        return real_build(*args)

    monkeypatch.setattr(ingestion, "_dead_letter_build", build_after_both_checked)
    results, errors = [], []

    def ingest():
        try:
            results.append(ingestion._dead_letter_store(message))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=ingest) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert errors == []
    assert sorted(r is None for r in results) == [False, True]
    assert DeadLetter.objects.count() == 1
    assert len(alerts) == 1
