"""The worker's batch path: a batch's processor events start in one statement and apply in one
transaction, together, or after a failure again a savepoint each; failures are recorded after
the commit."""

import dataclasses
import threading
import time
import uuid
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client import REGISTRY

from callbacks.handlers import DEFAULT_HANDLERS, Handler, handle_processor_event
from callbacks.models import (
    ProcessingError,
    QueueMessage,
    QueueMessageStatus,
    sequence_key,
)
from callbacks.schema import PROCESSOR_EVENT, processor_event_message
from callbacks.services import ReceivedMessage, queue_messages_start_batch
from callbacks.worker import Worker
from payments.exceptions import AmountMismatch
from payments.models import Event, LedgerEntry, Payment, PaymentEvent, PaymentState, ProcessedEvent
from payments.services import events_share_transaction, payment_apply_event
from payments.signals import payment_transition_committed, payment_transitioned
from tests.callbacks.worker_support import queue_counts, send_body, send_event
from tests.factories import (
    PaymentFactory,
    PaymentHoldFactory,
    QueueMessageFactory,
    processor_event,
    refund_held,
)

pytestmark = pytest.mark.django_db(transaction=True)


def receive_batch(worker: Worker, sqs_queues, count: int) -> list:
    """Exactly ``count`` messages in one list (the local server may split a receive)."""
    messages = []
    while len(messages) < count:
        got = worker.receive()
        assert got, f"only {len(messages)} of {count} messages came back"
        messages += got
    return messages


def settled_events(sqs_queues, count: int) -> list:
    payments = [PaymentFactory(state=PaymentState.SUBMITTED) for _ in range(count)]
    for payment in payments:
        send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    return payments


def test_a_batch_of_ten_events_takes_a_fixed_number_of_statements(
    sqs_queues, django_assert_num_queries
):
    settled_events(sqs_queues, 10)
    worker = Worker(wait_time=0, relay=False)
    with worker.running():
        messages = receive_batch(worker, sqs_queues, 10)
        # One autocommitted statement starts all ten (counts their attempts). One transaction
        # (BEGIN ... COMMIT) then, in one statement (payments_locked), locks the ten payments
        # in the one lock order and reads their rows, and then their merchants' return-rate
        # counters of the day in (merchant, day) order (merchant_days_lock's upsert, over the
        # rows just locked: two batches never deadlock on them), and applies them together
        # (the processor-event handler declares ``together``): per event one statement that
        # claims the dedup record and only then writes the state, the ledger credit, the
        # return-rate counter and the event-log row (payments.event_sql), its payment's row
        # taken from the batch's lock and no savepoint and release around it: 1 each; then
        # one statement marks all ten done. 1 + 2 + 1 + 10 * 1 + 1 = 15, against 16 with the
        # counters locked in a statement of their own, 26 with a row lock per event, 44 with a
        # savepoint per event, 84 when the event's rows were five ORM statements, and 130 (in
        # 20 transactions) when each message had its own start and transaction. Deletes and
        # releases are SQS calls.
        with django_assert_num_queries(15, connection=connection) as captured:
            worker.process_batch(messages)
    statements = [query["sql"] for query in captured.captured_queries]
    table = QueueMessage._meta.db_table
    # The start is committed before the work begins (a SIGKILL during the work leaves every
    # attempt counted), without waiting for the WAL flush (it only has to outlive the worker);
    # the done marks are in the work's transaction, the last before COMMIT.
    assert statements[0].startswith(f'INSERT INTO "{table}"') and statements[1] == "BEGIN"
    assert "set_config('synchronous_commit', 'off', true)" in statements[0]
    # The batch's locks, in the one order: the payments, then their merchants' counters.
    locks = statements[2]
    assert locks.startswith("WITH locked AS (SELECT") and "FOR NO KEY UPDATE), along AS" in locks
    assert 'along AS (INSERT INTO "payments_merchantreturnday"' in locks
    # Each event's one statement, and no row lock of its own: its row came with the batch's.
    assert all(sql.startswith("WITH claim AS") for sql in statements[3:13])
    assert statements[-2].startswith(f'UPDATE "{table}" SET status') and statements[-1] == "COMMIT"
    assert set(QueueMessage.objects.values_list("status", "outcome", "attempts")) == {
        ("done", "applied", 1)
    }
    # The event log holds the payload: a message applied cleanly keeps no copy of its body.
    assert not QueueMessage.objects.filter(body__isnull=False).exists()
    assert LedgerEntry.objects.count() == 10
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)


def test_a_batch_of_ten_refund_settlements_takes_as_many_statements_as_ten_debits(
    sqs_queues, django_assert_num_queries
):
    from decimal import Decimal

    refunds = []
    for _ in range(10):
        debit = PaymentFactory(state=PaymentState.CONFIRMED, amount=Decimal("25.00"))
        # A refund sent, its money held by its pending entry (as refund_create writes it).
        refund = refund_held(debit, "25.00", PaymentState.SUBMITTED)
        send_event(sqs_queues.client, sqs_queues.url, refund, "settled", direction="credit")
        refunds.append(refund)
    worker = Worker(wait_time=0, relay=False)
    with worker.running():
        messages = receive_batch(worker, sqs_queues, 10)
        # As a debit's settlement (the test above): a refund's posts its pending entry in the
        # event's one statement, not in one more after it.
        with django_assert_num_queries(15, connection=connection):
            worker.process_batch(messages)
    assert set(Payment.objects.filter(pk__in=[r.pk for r in refunds]).values_list("state")) == {
        (PaymentState.CONFIRMED,)
    }
    entries = LedgerEntry.objects.filter(payment__in=refunds)
    assert {(e.kind, e.status, e.posted_at is not None) for e in entries} == {
        ("refund", "posted", True)
    }


def test_the_batch_transaction_commits_synchronously_after_an_asynchronous_start(sqs_queues):
    """The start's commit need not wait for the WAL flush (a start only has to outlive the
    worker); the work's must, since its commit is what lets the messages be deleted: the
    batch's transaction runs with ``synchronous_commit`` on."""
    seen = []

    def recording(message):
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            seen.append(cursor.fetchone()[0])
        return handle_processor_event(message)

    handler = dataclasses.replace(DEFAULT_HANDLERS[PROCESSOR_EVENT], func=recording)
    settled_events(sqs_queues, 3)
    worker = Worker(
        wait_time=0, relay=False, handlers={**DEFAULT_HANDLERS, PROCESSOR_EVENT: handler}
    )
    # As a production database's session (the test database's commits do not wait).
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        [before] = cursor.fetchone()
        cursor.execute("SET synchronous_commit = on")
    try:
        with worker.running():
            messages = receive_batch(worker, sqs_queues, 3)
            with CaptureQueriesContext(connection) as captured:
                worker.process_batch(messages)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"SET synchronous_commit = {before}")

    start = captured.captured_queries[0]["sql"]
    assert "set_config('synchronous_commit', 'off', true)" in start
    assert seen == ["on", "on", "on"]
    assert worker.stats.outcomes == {"applied": 3}


def failing_on(payment_id: str) -> dict[str, Handler]:
    def handler(message):
        outcome = handle_processor_event(message)  # its rows are written, then rolled back
        if message.group_id == payment_id:
            raise RuntimeError("this one fails after its work")
        return outcome

    return {**DEFAULT_HANDLERS, PROCESSOR_EVENT: Handler(handler)}


def test_a_failing_event_rolls_back_only_its_savepoint_and_keeps_its_body(
    sqs_queues, module_settings
):
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0
    payments = settled_events(sqs_queues, 5)
    bad = str(payments[2].id)
    worker = Worker(wait_time=0, relay=False, handlers=failing_on(bad))
    with worker.running():
        worker.process_batch(receive_batch(worker, sqs_queues, 5))

    states = {str(p.id): p.state for p in (p.__class__.objects.get(pk=p.pk) for p in payments)}
    assert states.pop(bad) == PaymentState.SUBMITTED  # its work rolled back
    assert set(states.values()) == {PaymentState.CONFIRMED}  # the others committed
    assert LedgerEntry.objects.count() == 4
    assert not ProcessedEvent.objects.filter(payment_id=bad).exists()
    failed = QueueMessage.objects.get(group_id=bad)
    assert (failed.status, failed.attempts) == (QueueMessageStatus.RETRYING, 1)
    assert failed.body["kind"] == PROCESSOR_EVENT  # kept for the operator and a redrive
    [error] = ProcessingError.objects.filter(message_id=failed.message_id)
    assert (error.error_class, error.attempt_number) == ("builtins.RuntimeError", 1)
    assert QueueMessage.objects.filter(status="done").count() == 4
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (1, 0)  # only the failed one


def test_a_refused_event_in_the_batch_rolls_back_its_own_writes(sqs_queues, module_settings):
    """The processor-event handler runs without a worker savepoint (it declares its own): an
    event refused after its dedup record was claimed (the amount is checked after the claim)
    leaves neither that claim nor anything else behind, and the batch's other events commit."""
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0
    payments = [PaymentFactory(state=PaymentState.SUBMITTED) for _ in range(4)]
    bad = payments[1]
    for payment in payments:
        amount = payment.amount + 1 if payment is bad else payment.amount
        send_event(sqs_queues.client, sqs_queues.url, payment, "settled", amount=amount)
    worker = Worker(wait_time=0, relay=False)
    with worker.running():
        worker.process_batch(receive_batch(worker, sqs_queues, 4))

    bad.refresh_from_db()
    assert bad.state == PaymentState.SUBMITTED
    assert not ProcessedEvent.objects.filter(payment_id=bad.id).exists()  # the claim rolled back
    assert not LedgerEntry.objects.filter(payment_id=bad.id).exists()
    assert LedgerEntry.objects.count() == 3
    failed = QueueMessage.objects.get(group_id=str(bad.id))
    [error] = ProcessingError.objects.filter(message_id=failed.message_id)
    assert error.error_class == "payments.exceptions.AmountMismatch"
    assert QueueMessage.objects.filter(status="done").count() == 3


def test_a_batch_with_a_failure_is_applied_again_and_counts_each_event_once(
    sqs_queues, module_settings, caplog
):
    """Applied together first, the batch fails at its refused event and is rolled back whole;
    the refused event fails with its error, once, and the others are applied again a savepoint
    each: each is applied once, and what follows a commit (the host's signal, the duplicate's
    count, the ledger) happens once, not once per pass."""
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0
    repeated = PaymentFactory(state=PaymentState.SUBMITTED)
    event = processor_event(repeated, "settled")
    payment_apply_event(event=event)  # applied before: its message is a duplicate
    send_body(
        sqs_queues.client,
        sqs_queues.url,
        repeated.id,
        processor_event_message(event, received_at=timezone.now()),
    )
    # The refused event comes last, so the pass together runs every other one before it fails.
    payments = [PaymentFactory(state=PaymentState.SUBMITTED) for _ in range(5)]
    bad = payments[-1]
    for payment in payments:
        amount = payment.amount + 1 if payment is bad else payment.amount
        send_event(sqs_queues.client, sqs_queues.url, payment, "settled", amount=amount)
    committed = []

    def receiver(sender, payment, **kwargs):
        committed.append(payment.pk)

    payment_transition_committed.connect(receiver, dispatch_uid="test-batch-again")
    duplicates_before = dedup_hits()
    worker = Worker(wait_time=0, relay=False)
    try:
        with worker.running(), caplog.at_level("INFO", logger="callbacks.worker"):
            worker.process_batch(receive_batch(worker, sqs_queues, 6))
    finally:
        payment_transition_committed.disconnect(dispatch_uid="test-batch-again")

    good = [payment.pk for payment in payments if payment is not bad]
    assert sorted(committed) == sorted(good)  # once each, none for the rolled-back pass
    assert dedup_hits() == duplicates_before + 1
    assert {p.pk: p.state for p in Payment.objects.filter(pk__in=good)} == dict.fromkeys(
        good, PaymentState.CONFIRMED
    )
    assert LedgerEntry.objects.filter(payment_id__in=good).count() == 4
    assert LedgerEntry.objects.filter(payment=repeated).count() == 1
    bad.refresh_from_db()
    assert bad.state == PaymentState.SUBMITTED
    assert not ProcessedEvent.objects.filter(payment_id=bad.id).exists()
    failed = QueueMessage.objects.get(group_id=str(bad.id))
    # A mismatch is a conflict for a human at once; its one attempt and one error, not two.
    assert (failed.status, failed.attempts) == ("dead_lettered", 1)
    [error] = ProcessingError.objects.filter(message_id=failed.message_id)
    assert error.error_class == "payments.exceptions.AmountMismatch"
    outcomes = dict(QueueMessage.objects.filter(status="done").values_list("group_id", "outcome"))
    assert outcomes == {**dict.fromkeys(map(str, good), "applied"), str(repeated.id): "duplicate"}
    assert any("applied again one savepoint each" in r.getMessage() for r in caplog.records)


def dedup_hits() -> float:
    return REGISTRY.get_sample_value("payments_dedup_hits_total", {"layer": "app"}) or 0.0


def test_an_error_a_handler_swallows_in_a_batch_together_is_no_ones_and_all_apply_again(
    sqs_queues, module_settings, caplog
):
    """A handler that catches its work's error leaves the transaction applied together unable
    to go on, with no message to blame: the whole batch is applied again one savepoint each,
    where the swallowed error rolls back only its own savepoint and the others commit."""
    payments = [PaymentFactory(state=PaymentState.SUBMITTED) for _ in range(3)]
    swallower = payments[0]
    for payment in payments:
        amount = payment.amount + 1 if payment is swallower else payment.amount
        send_event(sqs_queues.client, sqs_queues.url, payment, "settled", amount=amount)

    def swallowing(message):
        try:
            return handle_processor_event(message)
        except AmountMismatch:
            return "swallowed"

    handler = Handler(swallowing, together=events_share_transaction)
    worker = Worker(
        wait_time=0, relay=False, handlers={**DEFAULT_HANDLERS, PROCESSOR_EVENT: handler}
    )
    with worker.running(), caplog.at_level("INFO", logger="callbacks.worker"):
        worker.process_batch(receive_batch(worker, sqs_queues, 3))

    outcomes = dict(QueueMessage.objects.values_list("group_id", "outcome"))
    assert outcomes == {
        str(swallower.id): "swallowed",
        **{str(p.id): "applied" for p in payments[1:]},
    }
    assert set(QueueMessage.objects.values_list("status", "attempts")) == {("done", 1)}
    assert not ProcessingError.objects.exists()
    assert LedgerEntry.objects.count() == 2
    assert not ProcessedEvent.objects.filter(payment_id=swallower.id).exists()
    [again] = [r.getMessage() for r in caplog.records if "applied again" in r.getMessage()]
    assert "without message" not in again and "BatchRolledBack" in again


def test_a_head_that_fails_stops_its_group_and_the_rest_never_start(sqs_queues, module_settings):
    """A later message of the same group in the batch is released untouched: the bulk start
    counts only group heads, so it has no record and no attempt."""
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0
    payments = settled_events(sqs_queues, 2)
    head_group = str(payments[0].id)
    worker = Worker(wait_time=0, relay=False, handlers=failing_on(head_group))
    with worker.running():
        head, other = sorted(
            receive_batch(worker, sqs_queues, 2), key=lambda m: m.group_id != head_group
        )
        # The local server never hands out two of one group at once; AWS may: make the other
        # message a later one of the head's group.
        follower = dataclasses.replace(
            other, group_id=head_group, sequence_number=head.sequence_number + "1"
        )
        worker.process_batch([follower, head])

    assert QueueMessage.objects.get(message_id=head.message_id).attempts == 1
    assert not QueueMessage.objects.filter(message_id=follower.message_id).exists()
    assert worker.stats.released == 1 and worker.stats.deleted == 0


def test_a_batch_whose_commit_fails_is_retried_whole(sqs_queues, module_settings):
    """Foreign keys are checked at commit: one event's dangling row makes the commit fail, so
    nothing of the batch is applied, every message counts its attempt and is retried."""
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0
    payments = settled_events(sqs_queues, 3)
    dangling_for = str(payments[1].id)

    def handler(message):
        outcome = handle_processor_event(message)
        if message.group_id == dangling_for:
            with connection.cursor() as cursor:  # deferred FK: refused only at COMMIT
                cursor.execute(
                    "INSERT INTO callbacks_paymenthold (payment_id, kind, reason, caused_by_id, "
                    "created_at, released_by, note) "
                    "VALUES ('x', 'triage', 'x', 2147483647, now(), '', '')"
                )
        return outcome

    worker = Worker(
        wait_time=0, relay=False, handlers={**DEFAULT_HANDLERS, PROCESSOR_EVENT: Handler(handler)}
    )
    with worker.running():
        worker.process_batch(receive_batch(worker, sqs_queues, 3))

    assert LedgerEntry.objects.count() == 0 and ProcessedEvent.objects.count() == 0
    assert set(QueueMessage.objects.values_list("status", "attempts")) == {("retrying", 1)}
    assert ProcessingError.objects.filter(error_class__contains="IntegrityError").count() == 3
    assert (
        queue_counts(sqs_queues.client, sqs_queues.url)[0]
        + queue_counts(sqs_queues.client, sqs_queues.url)[1]
        == 3
    )

    run = Worker(wait_time=0, relay=False, until_empty=True)
    run.run()
    assert LedgerEntry.objects.count() == 3
    assert set(QueueMessage.objects.values_list("status", "attempts")) == {("done", 2)}


def received(payment_id: str, *, sequence: int, body: dict | None = None, message_id=None):
    return ReceivedMessage(
        message_id=message_id or str(uuid.uuid4()),
        receipt_handle="handle",
        raw_body="{}",
        body=body if body is not None else {"kind": PROCESSOR_EVENT, "event": {}},
        group_id=payment_id,
        deduplication_id=str(uuid.uuid4()),
        sequence_number=sequence_key(sequence),
        enqueued_at=timezone.now(),
        receive_count=1,
    )


def record(message: ReceivedMessage, *, status: str, attempts: int) -> QueueMessage:
    return QueueMessageFactory(
        message_id=message.message_id,
        kind=message.kind,
        group_id=message.group_id,
        payment_id=message.payment_id,
        sequence_number=message.sequence_number,
        body=message.body,
        attempts=attempts,
        status=status,
    )


def test_the_bulk_start_takes_only_what_it_can_decide_and_leaves_the_rest_untouched():
    fresh = received(str(uuid.uuid4()), sequence=1)
    held = received(str(uuid.uuid4()), sequence=1)
    PaymentHoldFactory(payment_id=held.payment_id)
    behind = received(str(uuid.uuid4()), sequence=5)
    record(received(behind.group_id, sequence=4), status="in_progress", attempts=1)
    done = received(str(uuid.uuid4()), sequence=1)
    record(done, status="done", attempts=1)
    again = received(str(uuid.uuid4()), sequence=1)
    record(again, status="retrying", attempts=1)
    redrive = received(
        str(uuid.uuid4()),
        sequence=1,
        body={"kind": PROCESSOR_EVENT, "redrive": {"original_message_id": "m-0"}},
    )
    nul = received(str(uuid.uuid4()), sequence=1, body={"kind": PROCESSOR_EVENT, "x": "a\x00b"})

    started = queue_messages_start_batch(messages=[fresh, held, behind, done, again, redrive, nul])

    assert {m: qm.attempts for m, qm in started.items()} == {
        fresh.message_id: 1,
        again.message_id: 2,
    }
    row = QueueMessage.objects.get(message_id=fresh.message_id)
    assert (row.status, row.attempts, row.body, row.raw_body) == ("in_progress", 1, None, "")
    assert started[fresh.message_id].pk == row.pk
    assert started[fresh.message_id].body == fresh.body  # in memory, for a failure's record
    assert QueueMessage.objects.get(message_id=again.message_id).status == "in_progress"
    # The rest are left to queue_message_start: no row written, none changed.
    for untouched in (held, behind, redrive, nul):
        assert not QueueMessage.objects.filter(message_id=untouched.message_id).exists()
    assert QueueMessage.objects.get(message_id=done.message_id).attempts == 1


def batch_histogram() -> tuple[float, float]:
    """(messages, batches) the workers of this process have recorded so far."""
    name = "payments_worker_batch_messages"
    return tuple(REGISTRY.get_sample_value(name + suffix) or 0.0 for suffix in ("_sum", "_count"))


class BatchRecorder(Worker):
    """A worker that records the size of every batch it handles and can act after each."""

    def __init__(self, *, after_batch=None, **options) -> None:
        super().__init__(**options)
        self.sizes: list[int] = []
        self.after_batch = after_batch

    def process_batch(self, messages) -> None:
        self.sizes.append(len(messages))
        super().process_batch(messages)
        if self.after_batch is not None:
            self.after_batch(self)


def send_later(sqs_queues, payments, *, gap: float) -> threading.Thread:
    """Send one settled event per payment from another thread, ``gap`` seconds apart."""

    def run() -> None:
        for payment in payments:
            time.sleep(gap)
            send_event(sqs_queues.client, sqs_queues.url, payment, "settled")

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("linger, batches_for_the_five", [(1.0, [5]), (0, "several")])
def test_after_a_batch_that_was_not_full_the_worker_lingers_so_the_next_one_fills(
    sqs_queues, linger, batches_for_the_five
):
    first, *later = [PaymentFactory(state=PaymentState.SUBMITTED) for _ in range(6)]
    send_event(sqs_queues.client, sqs_queues.url, first, "settled")
    senders = []

    def after_batch(worker):
        if len(worker.sizes) == 1:  # five events arrive while the worker lingers (or polls)
            senders.append(send_later(sqs_queues, later, gap=0.05))

    worker = BatchRecorder(
        after_batch=after_batch, wait_time=1, until_empty=True, relay=False, linger=linger
    )
    entries, calls = batch_histogram()
    worker.run()
    senders[0].join()

    assert worker.sizes[0] == 1
    # What an operator sees: the histogram of messages per received batch.
    assert batch_histogram() == (entries + 6, calls + len(worker.sizes))
    if batches_for_the_five == "several":  # the negative control: each long poll returns early
        assert len(worker.sizes[1:]) > 1, worker.sizes
    else:
        assert worker.sizes[1:] == batches_for_the_five
    assert worker.stats.outcomes == {"applied": 6}
    assert LedgerEntry.objects.count() == 6
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)


def test_a_full_batch_is_followed_by_the_next_receive_at_once(sqs_queues):
    settled_events(sqs_queues, 3)
    worker = BatchRecorder(batch_size=1, wait_time=0, until_empty=True, relay=False, linger=1.0)
    waits = []  # every wait of the loop on its stop event, the linger's among them
    wait = worker._stopping.wait
    worker._stopping.wait = lambda timeout=None: waits.append(timeout) or wait(timeout)
    worker.run()
    # Three full batches of one: no linger between them (the last, empty receive ends the run).
    assert worker.sizes == [1, 1, 1]
    assert worker.linger not in waits, waits


def test_a_stop_request_ends_the_linger_at_once(sqs_queues):
    settled_events(sqs_queues, 1)
    worker = BatchRecorder(
        after_batch=Worker.request_stop, wait_time=0, until_empty=True, relay=False, linger=1.0
    )
    began = time.monotonic()
    worker.run()
    assert worker.sizes == [1]
    assert time.monotonic() - began < 0.9


@pytest.mark.parametrize("linger", [-0.001, 1.01, float("nan")])
def test_a_linger_out_of_range_is_refused(linger):
    with pytest.raises(ValueError, match="linger must be 0-1.0 seconds"):
        Worker(linger=linger)


def test_until_empty_keeps_polling_a_full_wait_time_after_the_last_message_it_hid(sqs_queues):
    """Visibility timeouts are approximate (some servers hand an expired message out up to a
    second late): a bounded run must not call the queue empty the moment a retry is due."""
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    send_event(sqs_queues.client, sqs_queues.url, payment, "settled")
    worker = Worker(wait_time=0, relay=False, until_empty=True)
    with worker.running():
        [message] = receive_batch(worker, sqs_queues, 1)
        before = time.monotonic()
        worker.hand.hide(message, 2)

    # Due in 2 s; the run waits one more wait time (at least a second) past that.
    assert worker.hand.due_back - before >= 2 + 1
    run = Worker(wait_time=0, relay=False, until_empty=True)
    run.hand.due_back = worker.hand.due_back
    started = time.monotonic()
    run.run()
    assert time.monotonic() - started >= 2.5
    assert LedgerEntry.objects.filter(payment=payment).count() == 1


def test_a_return_that_cancels_a_refund_makes_the_refunds_own_event_in_the_batch_read_it_again(
    sqs_queues, module_settings
):
    """The batch's lock reads every payment's row once, for the events after it; a debit's
    return cancels its refund not sent yet (another payment's row), and the refund's event
    after it in the same batch decides on the refund as canceled, not on the ``pending`` row
    the batch read before: it is refused, not applied over the cancel."""
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0
    debit = PaymentFactory(state=PaymentState.CONFIRMED, amount=Decimal("50.00"))
    refund = refund_held(debit, "10.00")
    send_event(sqs_queues.client, sqs_queues.url, debit, "returned", reason_code="R10")
    send_event(sqs_queues.client, sqs_queues.url, refund, "submitted", direction="credit")
    worker = Worker(wait_time=0, relay=False)
    with worker.running():
        messages = receive_batch(worker, sqs_queues, 2)
        messages.sort(key=lambda m: m.group_id != str(debit.id))  # the return first
        worker.process_batch(messages)

    states = dict(Payment.objects.values_list("id", "state"))
    assert states[debit.id] == PaymentState.RETURNED
    assert states[refund.id] == PaymentState.CANCELED
    assert not PaymentEvent.objects.filter(payment=refund, to_state=PaymentState.SUBMITTED).exists()
    assert QueueMessage.objects.get(group_id=str(debit.id)).outcome == "applied"
    # A submitted for a canceled refund has no transition: an error, retried (then a person).
    failed = QueueMessage.objects.get(group_id=str(refund.id))
    assert (failed.status, failed.last_error_class) == (
        "retrying",
        "payments.exceptions.InvalidTransition",
    )


def test_a_host_receiver_of_transitions_makes_each_later_event_read_its_row_again(
    sqs_queues, django_assert_num_queries
):
    """A host's ``payment_transitioned`` receiver may write any row in the transaction: with
    one connected, every event after the first reads its payment again (one statement more
    each), so no event decides on a row the receiver changed."""
    payments = settled_events(sqs_queues, 10)
    others = {payment.pk for payment in payments}
    seen = []

    def receiver(sender, payment, **kwargs):
        # The host writes the next payment's metadata: its event must see it.
        seen.append(payment.pk)
        Payment.objects.filter(pk__in=others - set(seen)).update(metadata={"touched": True})

    payment_transitioned.connect(receiver, dispatch_uid="test-batch-reads-again")
    worker = Worker(wait_time=0, relay=False)
    try:
        with worker.running():
            messages = receive_batch(worker, sqs_queues, 10)
            with django_assert_num_queries(15 + 9 + 9, connection=connection):
                worker.process_batch(messages)
    finally:
        payment_transitioned.disconnect(dispatch_uid="test-batch-reads-again")

    assert sorted(seen) == sorted(others)
    # Every event after the first wrote its merchant event from the row as the host left it.
    touched = [
        event.data["object"].get("metadata") == {"touched": True}
        for event in Event.objects.filter(
            object_id__in=[str(p) for p in seen[1:]], data__object__state="confirmed"
        )
    ]
    assert touched and all(touched)
