"""One lock order everywhere: the debits before the refunds, each set by id. A return of a
refunded debit (the debit, then its refunds by id) and a worker's batch applying the refunds'
events (its locks taken first, in the same order) run at once on PostgreSQL without a deadlock;
the payment's row lock is ``FOR NO KEY UPDATE``, so rows that refer to a locked payment are
still written."""

import dataclasses
import logging
import threading
import time
from decimal import Decimal

import pytest
from django.db import DatabaseError, connection, transaction

from callbacks.handlers import DEFAULT_HANDLERS, handle_processor_event
from callbacks.models import QueueMessage
from callbacks.schema import PROCESSOR_EVENT
from callbacks.worker import Worker
from payments.models import (
    DoubleLoss,
    EventKind,
    EventOutcome,
    MerchantReturnDay,
    Payment,
    PaymentEvent,
    PaymentState,
)
from payments.services import payment_apply_event, payment_lock, payments_lock, payments_locked
from payments.services.writes import payments_locked_forget
from tests.callbacks.worker_support import send_event
from tests.factories import PaymentFactory, processor_event, refund_held

pytestmark = pytest.mark.django_db(transaction=True)


def _refund(debit: Payment, amount: str = "10.00") -> Payment:
    """A refund made (pending), its money held by its pending entry."""
    return refund_held(debit, amount)


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _waits_on_a_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return row is not None and row[0] == "Lock"


def _until(condition, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_a_return_and_a_worker_batch_on_its_refunds_run_at_once_without_a_deadlock(
    sqs_queues, caplog
):
    caplog.set_level(logging.INFO)
    debit = PaymentFactory(state=PaymentState.CONFIRMED, amount=Decimal("50.00"))
    low, high = sorted((_refund(debit), _refund(debit)), key=lambda r: r.id)
    # The processor's "submitted" for each (its callback ahead of our submission's answer):
    # the batch moves both refunds; the return, alone, would cancel them.
    for refund in (high, low):
        send_event(sqs_queues.client, sqs_queues.url, refund, "submitted", direction="credit")
    first_done, go_on = threading.Event(), threading.Event()

    def pausing(message):
        outcome = handle_processor_event(message)
        if not first_done.is_set():  # the first refund's event applied, in the open batch
            first_done.set()
            go_on.wait(30)
        return outcome

    handler = dataclasses.replace(DEFAULT_HANDLERS[PROCESSOR_EVENT], func=pausing)
    worker = Worker(
        wait_time=0, relay=False, handlers={**DEFAULT_HANDLERS, PROCESSOR_EVENT: handler}
    )
    errors: list[BaseException] = []
    return_pid: list[int] = []

    def in_thread(work):
        def run():
            try:
                work()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
            finally:
                connection.close()

        return threading.Thread(target=run)

    def return_the_debit():
        return_pid.append(_backend_pid())
        payment_apply_event(event=processor_event(debit, "returned", reason_code="R10"))

    with worker.running():
        messages = []
        while len(messages) < 2:
            messages += worker.receive()
        # As received in this order: the higher id's event first.
        messages.sort(key=lambda m: m.group_id != str(high.id))
        batch = in_thread(lambda: worker.process_batch(messages))
        batch.start()
        assert first_done.wait(30)
        returner = in_thread(return_the_debit)
        returner.start()
        # The return goes as far as it can: it holds the debit and waits on a refund's lock.
        assert _until(lambda: bool(return_pid) and _waits_on_a_lock(return_pid[0]))
        go_on.set()
        batch.join(60)
        returner.join(60)

    assert errors == []
    assert "deadlock" not in caplog.text.lower()
    # The batch was applied together, once: not rolled back and applied again.
    assert "applied again" not in caplog.text
    assert set(QueueMessage.objects.values_list("status", "outcome")) == {("done", "applied")}
    states = dict(Payment.objects.values_list("id", "state"))
    assert states[debit.id] == PaymentState.RETURNED
    assert states[low.id] == states[high.id] == PaymentState.SUBMITTED
    # Both refunds had been sent when the return came: the customer has the money twice.
    assert set(DoubleLoss.objects.values_list("refund_id", flat=True)) == {low.id, high.id}


def test_the_batch_lock_takes_the_payments_and_the_refunds_that_hold_money():
    debit = PaymentFactory(state=PaymentState.CONFIRMED, amount=Decimal("50.00"))
    holding = _refund(debit)
    failed = _refund(debit)
    Payment.objects.filter(pk=failed.pk).update(state=PaymentState.CANCELED)
    other = PaymentFactory(state=PaymentState.SUBMITTED)
    locked, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold():
        try:
            with transaction.atomic():
                payments_lock(payment_ids=[str(debit.id), "not-a-uuid", "", debit.id])
                locked.set()
                release.wait(30)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(30)
        for payment, expected in ((debit, True), (holding, True), (failed, False), (other, False)):
            with transaction.atomic():
                try:
                    list(Payment.objects.select_for_update(nowait=True).filter(pk=payment.pk))
                    taken = False
                except DatabaseError:
                    taken = True
            assert taken is expected, payment.purpose
    finally:
        release.set()
        holder.join(30)
    assert errors == []


def test_a_payment_under_its_row_lock_still_takes_rows_that_refer_to_it():
    """FOR NO KEY UPDATE: an insert referring to the payment (its foreign key takes a key-share
    lock) does not wait for the lock's transaction."""
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    locked, release = threading.Event(), threading.Event()

    def hold():
        try:
            with transaction.atomic():
                payment_lock(payment.id)
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(30)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '2s'")
            PaymentEvent.objects.create(
                payment=payment, kind=EventKind.PROCESSOR_EVENT, outcome=EventOutcome.RECORDED
            )
            # An exclusive lock of the same row waits, as it must.
            with pytest.raises(DatabaseError):
                with transaction.atomic():
                    list(Payment.objects.select_for_update(nowait=True).filter(pk=payment.pk))
    finally:
        release.set()
        holder.join(30)
    assert PaymentEvent.objects.filter(payment=payment, outcome="recorded").count() == 1


def test_two_batches_counting_the_same_merchants_days_in_opposite_orders_do_not_deadlock(
    sqs_queues, caplog
):
    """Two workers' batches, each settling a debit of merchant A and one of merchant B, in
    opposite orders: each adds to its first merchant's counters of the day, then waits with the
    row locked, then adds to the other's. Added to in message order, each held a row the other
    needed, and PostgreSQL killed one as a deadlock victim (the batch applied again, a retry
    spent); locked first in (merchant, day) order, the second batch waits for the first."""
    caplog.set_level(logging.INFO)
    debits = {
        (batch, merchant): PaymentFactory(state=PaymentState.SUBMITTED, merchant_id=merchant)
        for batch in "12"
        for merchant in ("merchant-a", "merchant-b")
    }
    for debit in debits.values():
        send_event(sqs_queues.client, sqs_queues.url, debit, "settled")
    first_done = {"1": threading.Event(), "2": threading.Event()}
    go_on = threading.Event()
    where = threading.local()

    def pausing(message):
        outcome = handle_processor_event(message)
        if not first_done[where.batch].is_set():  # its first debit counted, the batch open
            first_done[where.batch].set()
            go_on.wait(30)
        return outcome

    handler = dataclasses.replace(DEFAULT_HANDLERS[PROCESSOR_EVENT], func=pausing)
    handlers = {**DEFAULT_HANDLERS, PROCESSOR_EVENT: handler}
    workers = {name: Worker(wait_time=0, relay=False, handlers=handlers) for name in "12"}
    errors: list[BaseException] = []
    pids: dict[str, int] = {}

    def batch(name: str, messages):
        def run():
            where.batch = name
            pids[name] = _backend_pid()
            try:
                workers[name].process_batch(messages)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
            finally:
                connection.close()

        return threading.Thread(target=run)

    with workers["1"].running(), workers["2"].running():
        messages = []
        while len(messages) < 4:
            messages += workers["1"].receive()
        by_group = {m.group_id: m for m in messages}

        def of(name: str, merchants: tuple[str, str]):
            return [by_group[str(debits[(name, merchant)].id)] for merchant in merchants]

        first = batch("1", of("1", ("merchant-a", "merchant-b")))
        second = batch("2", of("2", ("merchant-b", "merchant-a")))
        first.start()
        assert first_done["1"].wait(30)
        second.start()
        # The second batch goes as far as it can: its first debit counted, or waiting on a lock.
        assert _until(
            lambda: first_done["2"].is_set() or ("2" in pids and _waits_on_a_lock(pids["2"]))
        )
        go_on.set()
        first.join(60)
        second.join(60)

    assert errors == []
    assert "deadlock" not in caplog.text.lower()
    assert "applied again" not in caplog.text
    assert set(QueueMessage.objects.values_list("status", "outcome")) == {("done", "applied")}
    assert set(Payment.objects.values_list("state", flat=True)) == {PaymentState.CONFIRMED}
    counted = dict(MerchantReturnDay.objects.values_list("merchant_id", "debits"))
    assert counted == {"merchant-a": 2, "merchant-b": 2}


def test_the_batch_lock_hands_each_payments_row_out_once(django_assert_num_queries):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    with transaction.atomic(), payments_locked(payment_ids=[str(payment.id), "not-a-uuid"]):
        with django_assert_num_queries(0):
            first = payment_lock(payment.id)
        with django_assert_num_queries(1):
            again = payment_lock(payment.id)  # handed out already: read again
    assert first.pk == again.pk == payment.pk and first is not again


def test_forgetting_the_batch_lock_rows_makes_the_next_lock_read_again(django_assert_num_queries):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    with transaction.atomic(), payments_locked(payment_ids=[payment.id]):
        Payment.objects.filter(pk=payment.pk).update(metadata={"changed": True})
        payments_locked_forget()
        with django_assert_num_queries(1):
            assert payment_lock(payment.id).metadata == {"changed": True}
