"""The host's hooks on money moving: ``payment_transitioned`` inside the transition's
transaction (exactly once with the host's own rows), ``payment_transition_committed`` after it.

The receivers here write their rows into a table of their own, as a host application would."""

import threading
import uuid

import pytest
from django.db import connection, transaction

from callbacks.models import ProcessingError, QueueMessage
from payments.models import LedgerEntry, PaymentEvent, PaymentState, ProcessedEvent
from payments.services import payment_apply_event, payment_submit
from payments.signals import payment_transition_committed, payment_transitioned
from tests.callbacks.worker_support import drain, run_worker, send_event
from tests.factories import PaymentFactory, processor_event

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = "test_host_transition_receipt"


@pytest.fixture
def receipts():
    """A host table and a ``payment_transitioned`` receiver writing one row per transition."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {TABLE} (id serial PRIMARY KEY, payment_id uuid NOT NULL, "
            "from_state text NOT NULL, to_state text NOT NULL, event_row bigint NOT NULL)"
        )

    def receiver(sender, payment, from_state, to_state, event, **kwargs):
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {TABLE} (payment_id, from_state, to_state, event_row) "  # noqa: S608
                "VALUES (%s, %s, %s, %s)",
                [payment.pk, from_state, to_state, event.pk],
            )

    payment_transitioned.connect(receiver, dispatch_uid="test-receipts")
    yield lambda: rows()
    payment_transitioned.disconnect(dispatch_uid="test-receipts")
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {TABLE}")


def rows() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT payment_id, from_state, to_state, event_row FROM {TABLE}")  # noqa: S608
        return [(str(p), f, t, e) for p, f, t, e in cursor.fetchall()]


@pytest.fixture
def committed():
    calls: list[dict] = []

    def receiver(sender, payment, from_state, to_state, event, **kwargs):
        calls.append(
            {
                "payment_id": payment.pk,
                "from_state": from_state,
                "to_state": to_state,
                "event": event,
                "in_atomic_block": connection.in_atomic_block,
            }
        )

    payment_transition_committed.connect(receiver, dispatch_uid="test-committed")
    yield calls
    payment_transition_committed.disconnect(dispatch_uid="test-committed")


def test_both_signals_describe_the_transition_and_its_event_log_row(receipts, committed):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    event = processor_event(payment, "settled")

    payment_apply_event(event=event)

    row = PaymentEvent.objects.get(payment=payment, outcome="applied")
    assert row.processor_event_id == event.processor_event_id
    assert receipts() == [(str(payment.pk), "submitted", "confirmed", row.pk)]
    [call] = committed
    assert (call["payment_id"], call["from_state"], call["to_state"]) == (
        payment.pk,
        "submitted",
        "confirmed",
    )
    assert call["event"].pk == row.pk
    assert call["in_atomic_block"] is False  # after the commit, outside any transaction


def test_stale_and_duplicate_events_send_nothing(receipts, committed):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    event = processor_event(payment, "settled")
    payment_apply_event(event=event)

    payment_apply_event(event=event)  # duplicate
    payment_apply_event(event=processor_event(payment, "submitted"))  # stale

    assert len(receipts()) == 1 and len(committed) == 1


def test_receiver_row_exists_once_after_duplicate_deliveries_through_the_worker(
    sqs_queues, receipts
):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    event_id = f"evt_{uuid.uuid4().hex}"
    for i in range(5):  # new deduplication ids: SQS lets every copy through
        send_event(
            sqs_queues.client,
            sqs_queues.url,
            payment,
            "settled",
            processor_event_id=event_id,
            dedup_id=f"{event_id}-{i}",
        )

    run_worker()

    assert [r[1:3] for r in receipts()] == [("submitted", "confirmed")]
    assert sorted(QueueMessage.objects.values_list("outcome", flat=True)) == [
        "applied",
        *["duplicate"] * 4,
    ]


def test_receiver_row_exists_once_after_concurrent_deliveries(receipts, committed):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    event = processor_event(payment, "settled")
    barrier = threading.Barrier(4)
    outcomes: list[str] = []
    errors: list[BaseException] = []

    def deliver():
        try:
            barrier.wait(10)
            outcomes.append(payment_apply_event(event=event).outcome)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert errors == []
    assert sorted(outcomes) == ["applied", "duplicate", "duplicate", "duplicate"]
    assert len(receipts()) == 1
    assert len(committed) == 1
    assert LedgerEntry.objects.filter(payment=payment).count() == 1


def test_a_receiver_that_raises_fails_the_message_which_is_retried_without_half_applying(
    sqs_queues, receipts, fast_retries
):
    calls = []

    def flaky(sender, payment, **kwargs):
        calls.append(payment.pk)
        if len(calls) == 1:
            raise RuntimeError("host order table is locked")

    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    payment_transitioned.connect(flaky, dispatch_uid="test-flaky")
    try:
        message_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
        run_worker()
    finally:
        payment_transitioned.disconnect(dispatch_uid="test-flaky")

    [error] = ProcessingError.objects.filter(message_id=message_id)
    assert error.attempt_number == 1 and error.retryable
    assert "host order table is locked" in error.message
    record = QueueMessage.objects.get(message_id=message_id)
    assert (record.status, record.outcome, record.attempts) == ("done", "applied", 2)
    # The first attempt's receipt row rolled back with its transition: one row, one credit.
    assert len(receipts()) == 1
    assert LedgerEntry.objects.filter(payment=payment).count() == 1
    assert PaymentEvent.objects.filter(payment=payment, outcome="applied").count() == 1
    assert drain(sqs_queues.client, sqs_queues.url) == []


def test_a_receiver_that_always_raises_dead_letters_the_message_and_changes_nothing(
    sqs_queues, receipts, committed, fast_retries, module_settings
):
    module_settings.WORKER_MAX_ATTEMPTS = 2

    def broken(sender, **kwargs):
        raise RuntimeError("host bug")

    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    payment_transitioned.connect(broken, dispatch_uid="test-broken")
    try:
        message_id, _ = send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
        run_worker()
    finally:
        payment_transitioned.disconnect(dispatch_uid="test-broken")

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    assert QueueMessage.objects.get(message_id=message_id).status == "dead_lettered"
    assert ProcessingError.objects.filter(message_id=message_id).count() == 2
    assert receipts() == []
    assert committed == []
    assert not LedgerEntry.objects.filter(payment=payment).exists()
    assert not ProcessedEvent.objects.filter(payment=payment).exists()
    assert not PaymentEvent.objects.filter(payment=payment, kind="processor_event").exists()


def test_committed_signal_never_fires_for_a_rolled_back_transition(receipts, committed):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)

    with pytest.raises(RuntimeError), transaction.atomic():
        payment_apply_event(event=processor_event(payment, "settled"))
        assert len(receipts()) == 1  # the receiver ran inside the transaction
        raise RuntimeError("the caller's transaction rolls back")

    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    assert receipts() == []
    assert committed == []


def test_a_failing_committed_receiver_is_logged_and_does_not_undo_anything(caplog):
    def broken(sender, **kwargs):
        raise RuntimeError("mail server down")

    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    payment_transition_committed.connect(broken, dispatch_uid="test-broken-committed")
    try:
        result = payment_apply_event(event=processor_event(payment, "settled"))
    finally:
        payment_transition_committed.disconnect(dispatch_uid="test-broken-committed")

    assert result.outcome == "applied"
    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert "mail server down" in caplog.text


def test_submission_sends_the_pending_to_submitted_transition(sandbox, receipts, committed):
    payment = PaymentFactory(state=PaymentState.PENDING)

    payment_submit(payment_id=payment.id)

    assert [r[1:3] for r in receipts()] == [("pending", "submitted")]
    assert [(c["from_state"], c["to_state"]) for c in committed] == [("pending", "submitted")]
    assert committed[0]["event"].kind == "submission"


def test_a_receiver_that_raises_rolls_the_submissions_record_back_with_it(
    sandbox, receipts, committed
):
    """A submission records its answer in one statement that is its own transaction only
    while nothing receives ``payment_transitioned``: with a receiver, the receiver runs inside
    the record's transaction, and its error rolls the transition back with its own rows."""
    from payments.models import ProcessorAttempt

    def broken(sender, **kwargs):
        raise RuntimeError("host order table is locked")

    payment = PaymentFactory(state=PaymentState.PENDING)
    payment_transitioned.connect(broken, dispatch_uid="test-broken-submission")
    try:
        with pytest.raises(RuntimeError, match="host order table is locked"):
            payment_submit(payment_id=payment.id)
    finally:
        payment_transitioned.disconnect(dispatch_uid="test-broken-submission")

    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING
    assert receipts() == []
    assert committed == []
    assert not PaymentEvent.objects.filter(payment=payment, kind="submission").exists()
    assert not ProcessorAttempt.objects.filter(payment=payment).exists()
    # Sent again, under the same key: the processor answers with the debit it made once.
    assert payment_submit(payment_id=payment.id).outcome == "submitted"
    assert [r[1:3] for r in receipts()] == [("pending", "submitted")]
    assert sandbox.stats()["total_charges"] == 1
