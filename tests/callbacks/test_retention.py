"""Retention of the queue layer's failure records: error history, parked messages,
holds. Nothing a person may still need goes; the rest goes in batches."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from callbacks import retention, tasks
from callbacks.models import (
    ParkedMessage,
    PaymentHold,
    ProcessingError,
    QueueMessage,
    QueueMessageStatus,
)
from tests.factories import (
    ParkedMessageFactory,
    PaymentHoldFactory,
    ProcessingErrorFactory,
    QueueMessageFactory,
)

pytestmark = pytest.mark.django_db

OLD = 100  # days: past every default retention of these records


def _ago(days: float):
    return timezone.now() - timedelta(days=days)


def _deletes(queries: CaptureQueriesContext, table: str) -> int:
    return sum(
        1
        for q in queries.captured_queries
        if q["sql"].startswith("DELETE") and f'"{table}"' in q["sql"]
    )


def message(name: str, *, status=QueueMessageStatus.DONE, finished_days_ago=OLD, errors=0):
    row = QueueMessageFactory(
        message_id=name,
        group_id="g",
        payment_id="p",
        first_started_at=_ago(OLD + 1),
        status=status,
        finished_at=None if finished_days_ago is None else _ago(finished_days_ago),
    )
    for attempt in range(1, errors + 1):
        ProcessingErrorFactory(queue_message=row, attempt_number=attempt)
    return row


def test_history_purge_deletes_old_error_history_with_its_errors_in_batches(module_settings):
    module_settings.QUEUE_ERROR_RETENTION = timedelta(days=90)
    old = [message(f"retried-{i}", errors=2) for i in range(3)]
    recent = message("recent", errors=1, finished_days_ago=10)
    clean = message("clean")  # the clean purge's business, under its own retention
    running = message("running", status=QueueMessageStatus.RETRYING, finished_days_ago=None)
    ProcessingErrorFactory(queue_message=running)

    with CaptureQueriesContext(connection) as queries:
        assert retention.queue_message_history_purge(batch_size=2) == len(old)

    kept = set(QueueMessage.objects.values_list("message_id", flat=True))
    assert kept == {recent.message_id, clean.message_id, running.message_id}
    assert set(ProcessingError.objects.values_list("message_id", flat=True)) == {
        "recent",
        "running",
    }
    assert _deletes(queries, "callbacks_queuemessage") == 2


def test_history_purge_keeps_dead_lettered_messages_unless_named_closed():
    dead_open = message("dead-open", status=QueueMessageStatus.DEAD_LETTERED, errors=6)
    dead_closed = message("dead-closed", status=QueueMessageStatus.DEAD_LETTERED, errors=6)

    assert retention.queue_message_history_purge() == 0
    closed = QueueMessage.objects.filter(message_id=dead_closed.message_id).values("message_id")
    assert retention.queue_message_history_purge(closed_message_ids=closed) == 1

    assert list(QueueMessage.objects.values_list("message_id", flat=True)) == [dead_open.message_id]
    assert ProcessingError.objects.filter(message_id="dead-open").count() == 6


def test_history_purge_keeps_a_message_behind_a_hold_and_one_still_parked():
    cause = message("cause", status=QueueMessageStatus.DEAD_LETTERED, errors=1)
    hold = PaymentHoldFactory(payment_id="p", caused_by=cause)
    parked = message("parked", status=QueueMessageStatus.PARKED)
    ParkedMessageFactory(hold=hold, message_id="parked")
    parked_gone = message("parked-gone", status=QueueMessageStatus.PARKED)

    everything = QueueMessage.objects.values("message_id")
    assert retention.queue_message_history_purge(closed_message_ids=everything) == 1

    kept = set(QueueMessage.objects.values_list("message_id", flat=True))
    assert kept == {cause.message_id, parked.message_id}
    assert not QueueMessage.objects.filter(message_id=parked_gone.message_id).exists()


def _hold(payment_id: str, released_days_ago: float | None) -> PaymentHold:
    hold = PaymentHoldFactory(payment_id=payment_id)
    if released_days_ago is not None:
        PaymentHold.objects.filter(pk=hold.pk).update(released_at=_ago(released_days_ago))
    return hold


def _parked(hold: PaymentHold, name: str, released_days_ago: float | None) -> ParkedMessage:
    released_at = None if released_days_ago is None else _ago(released_days_ago)
    return ParkedMessageFactory(hold=hold, message_id=name, released_at=released_at)


def test_holds_purge_deletes_released_holds_and_parked_messages_past_retention(module_settings):
    module_settings.HOLD_RETENTION = timedelta(days=90)
    old = _hold("old", released_days_ago=OLD)
    for i in range(3):
        _parked(old, f"old-{i}", released_days_ago=OLD)
    recent = _hold("recent", released_days_ago=5)
    _parked(recent, "recent-0", released_days_ago=5)
    active = _hold("active", released_days_ago=None)
    _parked(active, "active-0", released_days_ago=None)
    # Released long ago but a message behind it was never republished: kept with its hold.
    stuck = _hold("stuck", released_days_ago=OLD)
    _parked(stuck, "stuck-0", released_days_ago=None)

    with CaptureQueriesContext(connection) as queries:
        assert tasks.holds_purge() == 3 + 1

    assert set(PaymentHold.objects.values_list("payment_id", flat=True)) == {
        "recent",
        "active",
        "stuck",
    }
    assert set(ParkedMessage.objects.values_list("message_id", flat=True)) == {
        "recent-0",
        "active-0",
        "stuck-0",
    }
    assert _deletes(queries, "callbacks_parkedmessage") == 1


def test_holds_purge_lets_the_history_purge_take_the_message_that_caused_it():
    cause = message("cause", status=QueueMessageStatus.DONE, errors=1)
    hold = PaymentHoldFactory(payment_id="p", reason="missing", caused_by=cause)
    PaymentHold.objects.filter(pk=hold.pk).update(released_at=_ago(OLD))
    assert retention.queue_message_history_purge() == 0

    assert retention.holds_purge() == 1
    assert retention.queue_message_history_purge() == 1
    assert not QueueMessage.objects.exists()
