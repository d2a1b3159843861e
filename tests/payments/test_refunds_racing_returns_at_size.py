"""A thousand settled debits refunded while their customers' banks return half of them, through
two real worker processes sending the credits to the sandbox processor over HTTP: every refund
the worker sent before its debit's return is a double loss (booked, alerted), every one it had
not sent is canceled and never sent, no credit is sent twice, and the balances equal the ledger.
"""

import random
import threading
from decimal import Decimal

import pytest
import requests
from django.db import OperationalError, close_old_connections, connection
from django.test import TestCase
from psycopg.errors import DeadlockDetected

from chaos.invariants.money_out import (
    check_balances,
    check_credits_sent,
    check_double_losses,
    check_refunds_within_collected,
)
from chaos.invariants.report import Report
from payments.exceptions import MoneyOutRefused
from payments.models import DoubleLoss, Payment, PaymentState
from payments.services import payment_apply_event
from payments.services.refunds import refund_create
from tests.callbacks.worker_support import WorkerProcess
from tests.factories import PaymentFactory, processor_event
from tests.waiting import wait_for

pytestmark = [pytest.mark.scale, pytest.mark.django_db(transaction=True)]

DEBITS = 1000


def _in_thread(work) -> threading.Thread:
    def run():
        try:
            work()
        finally:
            connection.close()
            close_old_connections()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _return_applied(debit) -> None:
    """Apply the debit's return as the worker does: a transaction PostgreSQL ends as a deadlock's
    victim is tried again. The return locks the debit, then each of its refunds; a worker's
    batch applied in one transaction may hold two of those refunds, taken in its own order, and
    one of the two transactions is then rolled back. The worker counts that as a failed attempt
    and applies the message again; the event's dedup record makes the second try the only
    one."""
    for attempt in range(5):
        try:
            payment_apply_event(event=processor_event(debit, "returned", reason_code="R10"))
            return
        except OperationalError as exc:
            if not isinstance(exc.__cause__, DeadlockDetected) or attempt == 4:
                raise


def test_refunds_racing_returns_leave_every_movement_accounted_for(sqs_queues, sandbox, tmp_path):
    debits = Payment.objects.bulk_create(
        [
            PaymentFactory.build(
                state=PaymentState.CONFIRMED, merchant_id=f"m-race-{i % 7}", amount=Decimal("50")
            )
            for i in range(DEBITS)
        ]
    )
    returned = random.Random(7).sample(debits, DEBITS // 2)
    refused: list = []
    workers: list[WorkerProcess] = []
    # The workers start once a quarter of the debits are refunded: the returns that come first
    # find those refunds unsent (canceled), the later ones race workers that send a refund
    # within milliseconds of its commit (double losses). Started with the refunds, the workers
    # sent every refund before its return could reach it, and the race was one-sided.
    head_start = threading.Event()
    try:

        def refund_all():
            try:
                for index, debit in enumerate(debits):
                    if index == DEBITS // 4:
                        head_start.set()
                    for _ in range(2):
                        try:
                            refund_create(payment_id=debit.id, amount=Decimal("20.00"))
                        except MoneyOutRefused as exc:
                            refused.append((debit.id, exc.rule))
            finally:
                head_start.set()

        def return_half():
            with TestCase.captureOnCommitCallbacks(execute=True):
                for debit in returned:
                    _return_applied(debit)

        threads = [_in_thread(refund_all), _in_thread(return_half)]
        assert head_start.wait(600)
        workers += [
            WorkerProcess("--wait-time", "1", log_dir=tmp_path, name=f"worker{i}") for i in range(2)
        ]
        for thread in threads:
            thread.join(600)

        def settled_down() -> bool:
            return (
                not Payment.objects.filter(
                    purpose="refund", state="pending", submission_started_at__isnull=True
                ).exists()
                and not Payment.objects.filter(
                    purpose="refund", state="pending", submission_started_at__isnull=False
                ).exists()
            )

        wait_for(settled_down, timeout=600, what="every refund sent or canceled", watch=workers)
    finally:
        for worker in workers:
            worker.signal()
        for worker in workers:
            worker.wait(60)

    stats = requests.get(f"{sandbox.base_url}/_sandbox/stats", timeout=10).json()
    report = Report()
    check_credits_sent(report, stats)
    check_refunds_within_collected(report)
    check_double_losses(report)
    check_balances(report)
    assert report.ok, report.render()

    refunds_of_returned = Payment.objects.filter(refund_of__in=returned)
    canceled = refunds_of_returned.filter(state=PaymentState.CANCELED)
    losses = DoubleLoss.objects.filter(payment__in=returned)
    # Each refund of a returned debit: canceled before it was sent, or a double loss.
    assert canceled.count() + losses.count() == refunds_of_returned.count()
    sent_by_payment = stats["credits_sent_by_payment"]
    assert not {str(pid) for pid in canceled.values_list("id", flat=True)} & set(sent_by_payment)
    print(
        f"refunds made {Payment.objects.filter(purpose='refund').count()}, refused "
        f"{len(refused)}; of the returned debits' refunds: {canceled.count()} canceled unsent, "
        f"{losses.count()} double losses; credits sent {stats['total_credits_sent']}"
    )
    # Both outcomes happen: the race is real.
    assert canceled.exists() and losses.exists(), (canceled.count(), losses.count())
    # Every refund asked for was made, or refused because its debit had come back first.
    made = Payment.objects.filter(purpose="refund").count()
    assert made + len(refused) == 2 * DEBITS
    assert {rule for _, rule in refused} <= {"payment_returned"}
    assert {pid for pid, _ in refused} <= {d.id for d in returned}
