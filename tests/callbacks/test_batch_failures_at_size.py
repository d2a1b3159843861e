"""A batch's events are applied together, and a batch where one fails is rolled back whole and
applied again a savepoint each (``callbacks.worker.batch``). At size, with failures spread over
many batches, repeats and a worker SIGKILLed mid-run: every good event is applied exactly once,
every refused one reaches a human, and nothing of a rolled-back pass is left behind."""

import json
import time
from decimal import Decimal

import pytest

from callbacks.models import ProcessingError, QueueMessage
from callbacks.schema import processor_event_message
from callbacks.worker.crashes import NEVER_FINISHED
from payments.models import (
    LedgerEntry,
    Payment,
    PaymentEvent,
    PaymentState,
    ProcessedEvent,
)
from payments.services import payment_apply_event
from tests.callbacks.worker_support import WorkerProcess, queue_counts
from tests.factories import PaymentFactory, processor_event
from tests.waiting import wait_for

pytestmark = [pytest.mark.scale, pytest.mark.django_db(transaction=True)]

PAYMENTS = 1000
REFUSED_EVERY = 20  # one settlement in 20 reports another amount: a conflict for a human
REPEATED_EVERY = 25  # one in 25 was applied before: its message is a duplicate


def test_batches_with_failures_apply_every_good_event_once_across_a_sigkill(sqs_queues, tmp_path):
    payments = Payment.objects.bulk_create(
        [PaymentFactory.build(state=PaymentState.SUBMITTED) for _ in range(PAYMENTS)]
    )
    refused = {p.id for i, p in enumerate(payments) if i % REFUSED_EVERY == 7}
    repeated = {
        p.id for i, p in enumerate(payments) if i % REFUSED_EVERY != 7 and i % REPEATED_EVERY == 3
    }
    entries = []
    for payment in payments:
        amount = payment.amount + Decimal("1.00") if payment.id in refused else payment.amount
        event = processor_event(payment, "settled", amount=amount)
        if payment.id in repeated:
            payment_apply_event(event=event)
        entries.append(
            {
                "Id": str(len(entries) % 10),
                "MessageBody": json.dumps(processor_event_message(event)),
                "MessageGroupId": str(payment.id),
                "MessageDeduplicationId": f"{event.processor_event_id}.queued",
            }
        )
    for start in range(0, len(entries), 10):
        response = sqs_queues.client.send_message_batch(
            QueueUrl=sqs_queues.url, Entries=entries[start : start + 10]
        )
        assert not response.get("Failed")

    args = ("--until-empty", "--wait-time=1", "--no-relay", "--visibility-timeout=5")
    doomed = WorkerProcess(*args, log_dir=tmp_path, name="doomed")
    steady = WorkerProcess(*args, log_dir=tmp_path, name="steady")
    # SIGKILL one worker once the run is well under way: whatever batch it holds is never
    # committed or is committed and not deleted, and comes back after the visibility timeout.
    wait_for(lambda: ProcessedEvent.objects.count() >= 300, 120, "300 events applied")
    doomed.kill()
    late = WorkerProcess(*args, log_dir=tmp_path, name="late")
    assert [steady.wait(240), late.wait(240)] == [0, 0]
    deadline = time.monotonic() + 60
    while sum(queue_counts(sqs_queues.client, sqs_queues.url)) and time.monotonic() < deadline:
        WorkerProcess(*args, log_dir=tmp_path, name="sweeper").wait(60)

    good = [p.id for p in payments if p.id not in refused]
    assert Payment.objects.filter(id__in=good, state=PaymentState.CONFIRMED).count() == len(good)
    assert Payment.objects.filter(id__in=refused, state=PaymentState.SUBMITTED).count() == len(
        refused
    )
    # Exactly once: one credit, one dedup record and one applied log row per good payment.
    assert LedgerEntry.objects.count() == len(good)
    assert set(LedgerEntry.objects.values_list("payment_id", flat=True)) == set(good)
    assert ProcessedEvent.objects.count() == len(good)
    applied = PaymentEvent.objects.filter(kind="processor_event", outcome="applied")
    assert applied.count() == len(good)
    assert set(applied.values_list("payment_id", flat=True)) == set(good)
    # The messages of payments applied before are duplicates, once each.
    duplicates = QueueMessage.objects.filter(status="done", outcome="duplicate")
    assert {str(p) for p in repeated} == set(duplicates.values_list("group_id", flat=True))
    assert PaymentEvent.objects.filter(outcome="duplicate").count() == len(repeated)
    # Every refused event is in front of a human, its error the mismatch, never a credit.
    dead = QueueMessage.objects.filter(status="dead_lettered")
    assert set(dead.values_list("group_id", flat=True)) == {str(p) for p in refused}
    errors = ProcessingError.objects.values_list("error_class", "message_id")
    assert {cls for cls, _ in errors} <= {"payments.exceptions.AmountMismatch", NEVER_FINISHED}
    assert {m for cls, m in errors if cls == "payments.exceptions.AmountMismatch"} == set(
        dead.values_list("message_id", flat=True)
    )
    # The SIGKILL leaves a row on each message it caught in hand (at most a batch), none dead.
    caught = {m for cls, m in errors if cls == NEVER_FINISHED}
    assert len(caught) <= 10
    assert not dead.filter(message_id__in=caught).exclude(group_id__in=map(str, refused)).exists()
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)
    # The refused events really shared batches with good ones: the batches were applied again.
    logs = steady.output + late.output
    assert "applied again one savepoint each" in logs
