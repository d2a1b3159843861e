"""Beat's purge of queue-message records: only clean, finished rows past retention go."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from callbacks import tasks
from callbacks.models import QueueMessage, QueueMessageStatus
from callbacks.services import queue_messages_purge
from tests.factories import PaymentHoldFactory, ProcessingErrorFactory, QueueMessageFactory

pytestmark = pytest.mark.django_db


def message(name: str, *, status=QueueMessageStatus.DONE, finished_days_ago: float | None = 40):
    now = timezone.now()
    finished_at = None if finished_days_ago is None else now - timedelta(days=finished_days_ago)
    return QueueMessageFactory(
        message_id=name,
        group_id="g",
        first_started_at=now - timedelta(days=60),
        status=status,
        finished_at=finished_at,
    )


def test_purge_deletes_only_clean_finished_records_past_retention_in_batches(module_settings):
    module_settings.QUEUE_MESSAGE_RETENTION = timedelta(days=30)
    old_clean = [message(f"old-{i}") for i in range(5)]
    recent = message("recent", finished_days_ago=10)
    unfinished = message("running", status=QueueMessageStatus.IN_PROGRESS, finished_days_ago=None)
    dead = message("dead", status=QueueMessageStatus.DEAD_LETTERED)
    with_error = message("with-error")
    ProcessingErrorFactory(queue_message=with_error)
    behind_hold = message("held")
    PaymentHoldFactory(payment_id="p", caused_by=behind_hold)

    with CaptureQueriesContext(connection) as queries:
        assert queue_messages_purge(batch_size=2) == len(old_clean)

    kept = set(QueueMessage.objects.values_list("message_id", flat=True))
    assert kept == {m.message_id for m in (recent, unfinished, dead, with_error, behind_hold)}
    deletes = [q for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    # 5 rows in batches of 2: three DELETE statements, none holding all the rows.
    assert len(deletes) == 3


def test_purge_task_reads_the_retention_setting(module_settings):
    message("forty-days")
    message("ten-days", finished_days_ago=10)

    module_settings.QUEUE_MESSAGE_RETENTION = timedelta(days=60)
    assert tasks.queue_messages_purge() == 0
    module_settings.QUEUE_MESSAGE_RETENTION = timedelta(days=5)
    assert tasks.queue_messages_purge() == 2
    assert not QueueMessage.objects.exists()
